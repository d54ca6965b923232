"""Loading benchmark splits from the Hugging Face hub, cached locally, failing fast offline.

``hub_rows(hub_id, config, split, relative)`` returns a split's rows as plain dicts:

1. from our cache of converted rows, ``cache_dir()/hub/<owner>__<name>/<config>/<split>.jsonl.gz``
   (written after the first successful download; no network, no ``datasets`` import);
2. else, when the hub answers a TCP connect within ``CONNECT_TIMEOUT`` seconds, through
   ``datasets.load_dataset`` (which keeps its own copy in the Hugging Face cache), then cached;
3. else, when the dataset is in the Hugging Face caches already, through ``datasets`` in
   offline mode (``HF_HUB_OFFLINE=1``, in a subprocess so this process's hub settings stay as
   they are), then cached;
4. else ``FileNotFoundError`` with the one-line instruction: set ``DELIBERATION_ENV_DATA`` (or
   ``data_dir=``), or go online once.

The connect probe is what makes step 4 take milliseconds instead of the ~25 s of retries with
back-off that ``huggingface_hub`` spends before giving up.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from deliberation_env.tasks.base import DATA_ENV_VAR
from deliberation_env.tasks.extract import load_jsonl

CACHE_ENV_VAR = "DELIBERATION_ENV_CACHE"
DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT = 3.0
"""Seconds a TCP connect to the hub (or the HTTPS proxy) may take before the hub counts as unreachable."""
OFFLINE_LOAD_TIMEOUT = 120.0
_TRUE = {"1", "true", "yes", "on"}


def cache_dir() -> Path:
    """``$DELIBERATION_ENV_CACHE``, else ``$XDG_CACHE_HOME/deliberation_env``, else ``~/.cache/deliberation_env``."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "deliberation_env"


def cached_path(hub_id: str, config: str | None, split: str) -> Path:
    """Where the converted rows of one hub split are kept."""
    return cache_dir() / "hub" / hub_id.replace("/", "__") / (config or "default") / f"{split}.jsonl.gz"


def _probe_address() -> tuple[str, int, str]:
    """(host, port, what) to connect to: the HTTPS proxy when one is set, else the hub endpoint."""
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        if os.environ.get(name):
            proxy = urlsplit(os.environ[name] if "://" in os.environ[name] else f"http://{os.environ[name]}")
            return proxy.hostname or "", proxy.port or 8080, f"the HTTPS proxy {name}"
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    return endpoint.hostname or "", endpoint.port or (80 if endpoint.scheme == "http" else 443), "the hub"


def hub_unreachable_reason(timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None when a TCP connection to the hub (``$HF_ENDPOINT``) or the HTTPS proxy opens within
    ``timeout`` seconds, else why not. Offline mode (``HF_HUB_OFFLINE=1``) counts as unreachable."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(name, "").strip().lower() in _TRUE:
            return f"{name} is set"
    host, port, what = _probe_address()
    start = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as error:
        return f"{what} at {host}:{port} did not answer in {time.monotonic() - start:.1f} s: {error}"
    return None


def _squash(name: str) -> str:
    return "".join(char for char in name.lower() if char.isalnum())


def in_hf_cache(hub_id: str) -> bool:
    """Whether the Hugging Face caches (hub files, or ``datasets``' prepared copies, which it names
    ``owner___snake_case_name``) seem to hold ``hub_id``: a cheap look at folder names."""
    home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()
    hub_cache = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or home / "hub")
    if (hub_cache.expanduser() / f"datasets--{hub_id.replace('/', '--')}").is_dir():
        return True
    datasets_cache = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    try:
        names = [entry.name for entry in os.scandir(datasets_cache) if entry.is_dir() and "___" in entry.name]
    except OSError:
        return False
    return _squash(hub_id) in {_squash(name) for name in names}


def _write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """Write rows as gzipped JSON lines, atomically (a crash leaves no half file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as raw, gzip.open(raw, "wt", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def download(hub_id: str, config: str | None, split: str, path: str | os.PathLike[str]) -> int:
    """Load one split with ``datasets`` and write its rows to ``path``; the number of rows."""
    import datasets  # noqa: PLC0415 (heavy; only when the hub is used)

    rows = [dict(row) for row in datasets.load_dataset(hub_id, config, split=split)]
    _write_rows(rows, Path(path))
    return len(rows)


def _download_offline(hub_id: str, config: str | None, split: str, path: Path) -> str | None:
    """``download`` in a subprocess with ``HF_HUB_OFFLINE=1`` (from the HF caches); None or the error."""
    code = ("import sys\nfrom deliberation_env.tasks.hub import download\n"
            "download(sys.argv[1], sys.argv[2] or None, sys.argv[3], sys.argv[4])")  # "" for no config
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = [sys.executable, "-c", code, hub_id, config or "", split, str(path)]
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=OFFLINE_LOAD_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    lines = done.stderr.strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit status {done.returncode}")


def _datasets_installed() -> bool:
    """Whether ``import datasets`` can work, without paying ~1 s to import it (a dependency, but an install may lack it)."""
    if "datasets" in sys.modules:
        return sys.modules["datasets"] is not None
    return importlib.util.find_spec("datasets") is not None


def hub_rows(hub_id: str, config: str | None, split: str, relative: str) -> list[dict[str, Any]]:
    """The rows of a hub split (see the module docstring); ``relative`` is the local file that
    would have been used instead (for the error message)."""
    path = cached_path(hub_id, config, split)
    if path.is_file():
        return [row for _, row in load_jsonl(path)]
    advice = (f"Set {DATA_ENV_VAR} (or pass data_dir=) to a data folder holding {relative} (the layout is in "
              f"docs/tasks.md), or go online once to download {hub_id!r} from the Hugging Face hub "
              f"(it is then cached in {path.parent})")
    if not _datasets_installed():
        raise FileNotFoundError(f"no local data for {relative} and the `datasets` package is not installed "
                                f"(pip install datasets). {advice}.")
    unreachable = hub_unreachable_reason()
    if unreachable is None:
        try:
            download(hub_id, config, split, path)
        except Exception as error:  # auth, missing config, network: all mean "not available"
            raise FileNotFoundError(f"no local data for {relative} and loading {hub_id!r} from the hub failed "
                                    f"({type(error).__name__}: {error}). {advice}.") from error
    elif in_hf_cache(hub_id):
        failure = _download_offline(hub_id, config, split, path)
        if failure is not None:
            raise FileNotFoundError(f"no local data for {relative}; the hub is unreachable ({unreachable}) and "
                                    f"loading {hub_id!r} from the Hugging Face cache failed ({failure}). {advice}.")
    else:
        raise FileNotFoundError(f"no local data for {relative}, the Hugging Face hub is unreachable ({unreachable}) "
                                f"and {hub_id!r} is not cached. {advice}.")
    return [row for _, row in load_jsonl(path)]
