"""The code sandbox: results, limits, and a hostile suite that must stay contained.

Isolation-specific tests run for every mode that works on this machine (parametrised from
``isolation_works``, so nothing is skipped). Tests that only a namespace sandbox can pass
(network, other processes' environments, writes outside the sandbox) run for those modes only.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

from deliberation_env.tasks import sandbox
from deliberation_env.tasks.sandbox import available_isolation, isolation_works, run_many, run_python

NAMESPACE_MODES = [mode for mode in ("bwrap", "unshare") if isolation_works(mode)]
ALL_MODES = [*NAMESPACE_MODES, "rlimits"]
READ_ONLY_MODES = [mode for mode in NAMESPACE_MODES if mode == "bwrap"]
# Fork bombs only where something caps them: a namespace sandbox with a pids cgroup, or a non-root user
# (RLIMIT_NPROC does not bind root, and the rlimits-mode guard is no boundary).
BOMB_MODES = [mode for mode in NAMESPACE_MODES if sandbox.cgroup_base() is not None or os.geteuid() != 0]


def processes_with(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def wait_until_gone(marker: str, seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def test_this_machine_uses_a_namespace_sandbox():
    """.ci installs bubblewrap; the auto mode must pick it (or unshare), never rlimits here."""
    assert available_isolation() in NAMESPACE_MODES
    assert sandbox.describe_isolation().startswith(("bubblewrap", "unshare"))


@pytest.mark.parametrize("mode", ALL_MODES)
def test_pass_fail_output_and_exit_codes(mode):
    ok = run_python("print('hello'); import sys; print('oops', file=sys.stderr)", isolation=mode)
    assert ok.passed and ok.returncode == 0 and not ok.timed_out and ok.isolation == mode
    assert ok.stdout == "hello\n" and ok.stderr == "oops\n"
    failed = run_python("def f():\n    return 1 / 0\nf()", isolation=mode)
    assert not failed.passed and failed.returncode == 1 and "ZeroDivisionError" in failed.stderr
    syntax = run_python("def broken(:\n    pass", isolation=mode)
    assert not syntax.passed and "SyntaxError" in syntax.stderr
    for early_exit in ("import sys; sys.exit(0)\nprint('never')", "import os; os._exit(0)", "exit()"):
        result = run_python(early_exit, isolation=mode)
        assert result.returncode == 0 and not result.passed, early_exit  # stopping early is no pass
    assert run_python("raise SystemExit(7)", isolation=mode).returncode == 7


@pytest.mark.parametrize("mode", ALL_MODES)
def test_infinite_loop_is_killed_at_the_timeout(mode):
    start = time.monotonic()
    result = run_python("while True:\n    pass", timeout=1.0, isolation=mode)
    assert result.timed_out and not result.passed and result.returncode is not None and result.returncode < 0
    assert 0.9 <= time.monotonic() - start < 4.0


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_timeout_kills_the_whole_process_group(mode):
    marker = f"sandbox-test-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.05)', {marker!r}])\n"
        f"subprocess.Popen([sys.executable, '-c', 'import os\\nos.setsid()\\nwhile True: pass', {marker!r}])\n"
        "while True:\n    time.sleep(0.05)\n"
    )
    result = run_python(code, timeout=1.5, isolation=mode)
    assert result.timed_out and not result.passed
    assert wait_until_gone(marker) == []  # children, even one in its own session, died with it


@pytest.mark.parametrize("mode", BOMB_MODES)
def test_fork_bomb_is_contained(mode):
    marker = f"sandbox-bomb-{uuid.uuid4().hex}"
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    code = (
        "import os, sys\n"
        "for _ in range(4):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        f"            os.execv(sys.executable, [sys.executable, '-S', '-c', {bomb!r}, {marker!r}])\n"
        "    except OSError:\n"
        "        pass\n"
        f"exec({bomb!r})\n"
    )
    start = time.monotonic()
    result = run_python(code, timeout=2.0, max_processes=32, isolation=mode)
    assert result.timed_out and not result.passed and time.monotonic() - start < 6.0
    assert wait_until_gone(marker) == []
    assert subprocess.run(["true"], check=False).returncode == 0  # the caller can still fork
    assert run_python("print(2 + 2)", isolation=mode).stdout == "4\n"  # and the sandbox still works


@pytest.mark.parametrize("mode", ALL_MODES)
def test_memory_bomb_hits_the_memory_limit(mode):
    for code in ("x = bytearray(8 * 2**30)", "chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))"):
        start = time.monotonic()
        result = run_python(code, memory_mb=256, timeout=10.0, isolation=mode)
        assert not result.passed and not result.timed_out and "MemoryError" in result.stderr
        assert time.monotonic() - start < 8.0


@pytest.mark.parametrize("mode", READ_ONLY_MODES)
def test_files_outside_the_sandbox_cannot_be_changed(mode, tmp_path):
    outside = Path(tempfile.mkdtemp(prefix="sandbox-canary-", dir="/var/tmp"))
    try:
        for folder in (outside, tmp_path):
            (folder / "canary.txt").write_text("alive")
        code = "\n".join(
            f"""
import os, shutil
for target in ({str(outside)!r}, {str(tmp_path)!r}):
    for attempt in (lambda: os.remove(target + '/canary.txt'),
                    lambda: open(target + '/canary.txt', 'w').write('pwned'),
                    lambda: open(target + '/new.txt', 'w').write('new'),
                    lambda: shutil.rmtree(target)):
        try:
            attempt()
            print('WROTE', target)
        except OSError as error:
            print('blocked', type(error).__name__)
open('scratch.txt', 'w').write('mine')  # its own folder is writable
print(open('scratch.txt').read())
""".splitlines()
        )
        result = run_python(code, isolation=mode)
        assert result.passed, result.stderr
        assert "WROTE" not in result.stdout and result.stdout.count("blocked") == 8
        assert result.stdout.rstrip().endswith("mine")
        for folder in (outside, tmp_path):
            assert (folder / "canary.txt").read_text() == "alive"
            assert sorted(p.name for p in folder.iterdir()) == ["canary.txt"]
    finally:
        (outside / "canary.txt").unlink()
        outside.rmdir()


@pytest.mark.parametrize("mode", ALL_MODES)
def test_environment_secrets_are_not_visible(mode, monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("DELIBERATION_TEST_API_KEY", secret)
    code = f"""
import os
print('env', {secret!r} in repr(dict(os.environ)), sorted(os.environ))
leaks = []
if {mode != "rlimits"}:  # with namespaces, no process's environment outside the sandbox is visible
    for pid in os.listdir('/proc'):
        try:
            if {secret!r}.encode() in open(f'/proc/{{pid}}/environ', 'rb').read():
                leaks.append(pid)
        except OSError:
            pass
print('leaks', leaks)
"""
    result = run_python(code, isolation=mode)
    assert result.passed, result.stderr
    assert secret not in result.stdout
    assert "env False" in result.stdout and "DELIBERATION_TEST_API_KEY" not in result.stdout
    assert "leaks []" in result.stdout


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_network_is_unreachable(mode):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        code = f"""
import socket
for host in ('127.0.0.1', '1.1.1.1'):
    try:
        socket.create_connection((host, {port}), timeout=2).close()
        print('CONNECTED', host)
    except OSError as error:
        print('blocked', type(error).__name__)
"""
        result = run_python(code, isolation=mode)
        assert result.passed, result.stderr
        assert "CONNECTED" not in result.stdout and result.stdout.count("blocked") == 2
        # the listener itself works: the caller can connect
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        time.sleep(0.3)
        assert len(accepted) == 1
    finally:
        stop.set()
        thread.join()
        server.close()
        for connection in accepted:
            connection.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_killing_its_parent_does_not_harm_the_caller(mode):
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('after')"
    if mode in NAMESPACE_MODES:  # as init of its own PID namespace, "every process I may signal" is contained
        code += "\nif os.getpid() == 1:\n    os.kill(-1, signal.SIGKILL)\n    print('after all')"
    result = run_python(code, isolation=mode)
    assert os.getpid() > 0 and threading.main_thread().is_alive()  # we are still here
    assert run_python("print('next')", isolation=mode).stdout == "next\n"
    assert result.returncode is not None


@pytest.mark.parametrize("mode", ALL_MODES)
def test_huge_output_is_capped(mode):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for stream in ("stdout", "stderr"):
        code = f"import sys\nwhile True:\n    sys.{stream}.write('x' * 65536)"
        start = time.monotonic()
        result = run_python(code, timeout=10.0, output_limit=4096, max_file_mb=8, isolation=mode)
        assert not result.passed and result.truncated and time.monotonic() - start < 8.0
        assert len(getattr(result, stream)) == 4096
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 * 1024  # KiB: under 64 MB


def test_run_many_keeps_order_and_isolates_programs():
    codes = [f"import os\nopen('shared.txt', 'a').write('x')\nprint({i}, len(open('shared.txt').read()))"
             for i in range(8)]
    results = run_many(codes, workers=2)
    assert [r.stdout for r in results] == [f"{i} 1\n" for i in range(8)]  # no program saw another's file
    assert [r.passed for r in run_many(["pass", "1/0", "pass"], workers=2)] == [True, False, True]


def _child_runs_a_program(queue) -> None:
    queue.put(run_python("print('from the child')").stdout)


def test_works_in_a_forked_child():
    """A forked worker (multiprocessing) must not wait on the parent's spawner threads."""
    import multiprocessing

    assert run_many(["pass", "pass"], workers=2)[0].passed and run_python("pass").passed  # spawners exist
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_runs_a_program, args=(queue,))
    child.start()
    try:
        assert queue.get(timeout=30) == "from the child\n"
    finally:
        child.join(timeout=30)
    assert child.exitcode == 0


def test_isolation_override_and_validation(monkeypatch):
    monkeypatch.setenv(sandbox.ISOLATION_ENV_VAR, "rlimits")
    assert available_isolation() == "rlimits"
    assert run_python("print(1)").isolation == "rlimits"
    monkeypatch.setenv(sandbox.ISOLATION_ENV_VAR, "chroot")
    with pytest.raises(ValueError, match="DELIBERATION_ENV_SANDBOX"):
        available_isolation()
    with pytest.raises(ValueError, match="isolation"):
        run_python("pass", isolation="docker")
    with pytest.raises(ValueError, match="positive"):
        run_python("pass", isolation="rlimits", timeout=0)


def test_rlimits_fallback_warns_once(monkeypatch):
    monkeypatch.delenv(sandbox.ISOLATION_ENV_VAR, raising=False)
    monkeypatch.setattr(sandbox, "_probed", {"bwrap": False, "unshare": False, "rlimits": True})
    monkeypatch.setattr(sandbox, "_warned", False)
    with pytest.warns(RuntimeWarning, match="rlimits only"):
        assert available_isolation() == "rlimits"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert available_isolation() == "rlimits"  # no second warning
