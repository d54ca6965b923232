"""Shared test configuration.

``DELIBERATION_ENV_NO_SKIP=1`` (set by .ci/run) turns every skipped test into a failure, so
that CI cannot pass by silently skipping the real-model, server or sandbox tests.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import pytest

DATA_DIR = Path(os.environ.get("DELIBERATION_ENV_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data").resolve()
# Absolute, so that subprocesses started in other folders (the examples' tests) find the data too.
os.environ["DELIBERATION_ENV_DATA"] = str(DATA_DIR)
# Compiled replay trees (deliberation_env.engine) go to one folder shared by the test processes and runs, not the
# user's cache; a tree compiled under other code is keyed apart and checked on load, so sharing is safe.
os.environ.setdefault("DELIBERATION_ENV_CACHE", os.path.join(tempfile.gettempdir(), f"deliberation_env_tests_{os.getuid()}"))


def worker_threads() -> int:
    """Threads for one test process: all cores, or under ``pytest -n N`` (pytest-xdist) a worker's share of them,
    so that N workers' torch and llama.cpp threads do not outnumber the cores (spinning threads then stall)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def pytest_sessionstart(session):
    if os.environ.get("PYTEST_XDIST_WORKER") and importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(worker_threads())


@pytest.fixture(scope="session")
def llama_threads() -> int:
    """Threads for a llama.cpp server a test starts: 2, or this process's share of the cores if smaller."""
    return min(2, worker_threads())


@pytest.fixture(scope="session")
def converted(tmp_path_factory) -> str:
    """One folder of dequantised GGUF weights for the whole run: SmolLM2 is converted once per dtype, not once per
    module (a conversion takes about 20 s)."""
    return str(tmp_path_factory.mktemp("converted"))


@pytest.fixture(scope="module")
def lora_team(converted):
    """A 2-agent SmolLM2 team with one LoRA adapter per agent (baselines.llm's TeamPolicy), for one test module. It
    runs on one thread for that module only: later modules keep every core."""
    import torch

    from baselines.llm.policy import TeamPolicy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield TeamPolicy("smollm2", 2, "lora", converted_cache_dir=converted)
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """Restore torch's thread count after each test: trainers run in-process call ``seed_everything``, which sets
    one thread for the whole process, and every later test (the real-model ones most) would run on one core."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    yield
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The benchmark data folder (``$DELIBERATION_ENV_DATA``, else ../shared/data beside the repo)."""
    if not (DATA_DIR / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {DATA_DIR}; set DELIBERATION_ENV_DATA")
    return DATA_DIR


@pytest.fixture(scope="session")
def llama_process(llama_threads):
    """A llama.cpp server on SmolLM2 at 127.0.0.1 for the session (with logprobs), checked with one completion."""
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is not installed: bash scripts/setup-tests.sh")
    from deliberation_env.backends.models import smollm2_gguf_path
    from deliberation_env.testing.llama_server import free_port, llama_command, serve

    port = free_port()
    with serve(llama_command(smollm2_gguf_path(), port, threads=llama_threads, n_ctx=2048, logits_all=True), port) as server:
        yield server


@pytest.fixture
def llama_url(llama_process):
    """The session's llama.cpp server's /v1 URL. A server that died before or during the test is an error naming
    its exit status or signal and its log's end, beside the test's own connection errors."""
    llama_process.check("before this test")
    yield llama_process.url
    llama_process.check("during this test")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # BenchMARL cannot share the dev virtualenv (it needs torchrl<0.12, the dev extra >=0.14): its tests run in a
    # virtualenv of their own (docs/peers.md), and their skip for lack of it is no gap in the dev run.
    own_venv = item.get_closest_marker("benchmarl") is not None and importlib.util.find_spec("benchmarl") is None
    if report.skipped and os.environ.get("DELIBERATION_ENV_NO_SKIP") == "1" and not own_venv:
        report.outcome = "failed"
        report.longrepr = f"skipped, but DELIBERATION_ENV_NO_SKIP=1 forbids skips: {report.longrepr}"


# Markers by what a test needs (CONTRIBUTING.md names the fast subset): a file's tests need its component, and
# a test that takes the llama.cpp server fixture needs a server.
_FILE_MARKERS = {
    "test_backend_transformers.py": ("model",), "test_train_llm.py": ("model",),
    "test_train_llm_ops.py": ("model",), "test_train_llm_ddp.py": ("model",), "test_llm_remote.py": ("model", "server"),
    "test_backend_openai.py": ("server",), "test_backend_async_openai.py": ("server",),
    "test_backend_faults_openai.py": ("server",), "test_cli_backends.py": ("server", "model"),
    "test_sandbox.py": ("sandbox",), "test_humaneval.py": ("sandbox",), "test_tools.py": ("sandbox",), "test_distributed.py": ("ray",),
    "test_view_browser.py": ("server",),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in _FILE_MARKERS.get(item.path.name, ()):
            item.add_marker(name)
        if "llama_url" in getattr(item, "fixturenames", ()):
            item.add_marker("server")
