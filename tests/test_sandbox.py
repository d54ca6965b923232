"""The sandbox: results, limits, and a hostile suite that must stay contained.

Isolation-specific tests are parametrised over every mode; a mode that does not work on this
machine is skipped with the reason and the command that installs it (CI forbids skips). Tests
that only a namespace sandbox can pass (network, other processes' environments, writes outside
the sandbox) run for the namespace modes only.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from deliberation_env.sandbox import (
    SandboxUnavailableError,
    available_isolation,
    isolation_works,
    run_many,
    run_python,
)
from deliberation_env.sandbox import runner as sandbox

NAMESPACE_MODES = ["bwrap", "unshare"]
ALL_MODES = [*NAMESPACE_MODES, "rlimits"]
MISSING = {
    "bwrap": "bubblewrap is not installed or cannot create namespaces here: apt-get install bubblewrap",
    "unshare": "unshare (util-linux) cannot create unprivileged user namespaces here: apt-get install util-linux "
               "and allow user namespaces (sysctl kernel.unprivileged_userns_clone=1)",
}


def require(mode: str) -> str:
    """Skip, naming what is missing and how to install it, when ``mode`` does not work here."""
    if mode != "rlimits" and not isolation_works(mode):
        pytest.skip(f"sandbox mode {mode!r} unavailable ({sandbox._probe_errors.get(mode, 'probe failed')}): "
                    f"{MISSING[mode]}")
    return mode


def require_fork_cap(mode: str) -> str:
    """Fork bombs only where something caps them: a pids cgroup, or a non-root user (RLIMIT_NPROC)."""
    require(mode)
    if sandbox.cgroup_base() is None and os.geteuid() == 0:
        pytest.skip("no writable cgroup-v1 pids hierarchy and running as root (RLIMIT_NPROC does not bind root): "
                    "nothing caps a fork bomb here; run as a non-root user or on a cgroup-v1 host")
    return mode


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


def test_this_machine_uses_a_namespace_sandbox(monkeypatch):
    """.ci installs bubblewrap; the auto mode must pick it (or unshare), never rlimits."""
    monkeypatch.delenv(sandbox.ISOLATION_ENV_VAR, raising=False)
    assert available_isolation() in NAMESPACE_MODES
    assert sandbox.describe_isolation().startswith(("bubblewrap", "unshare"))


@pytest.mark.parametrize("mode", ALL_MODES)
def test_pass_fail_output_and_exit_codes(mode):
    require(mode)
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
    require(mode)
    start = time.monotonic()
    result = run_python("while True:\n    pass", timeout=1.0, isolation=mode)
    assert result.timed_out and not result.passed and result.returncode is not None and result.returncode < 0
    assert 0.9 <= time.monotonic() - start < 4.0


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_timeout_kills_the_whole_process_group(mode):
    require(mode)
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


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_fork_bomb_is_contained(mode):
    require_fork_cap(mode)
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
    require(mode)
    for code in ("x = bytearray(8 * 2**30)", "chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))"):
        start = time.monotonic()
        result = run_python(code, memory_mb=256, timeout=10.0, isolation=mode)
        assert not result.passed and not result.timed_out and "MemoryError" in result.stderr
        assert time.monotonic() - start < 8.0


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_files_outside_the_sandbox_cannot_be_changed(mode, tmp_path):
    require(mode)
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


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_hostile_code_cannot_write_host_tmp_or_anywhere_else(mode):
    """The reproduced escape: a 'solution' that writes /tmp/<name> and returns True. The program
    passes (its own private /tmp is writable), and no file appears on the host."""
    require(mode)
    name = f"sandbox-escape-{uuid.uuid4().hex}"
    home = os.path.realpath(os.path.expanduser("~"))
    targets = [f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}", f"{home}/{name}", f"{os.getcwd()}/{name}",
               f"{Path(sandbox.__file__).parent}/{name}", f"/{name}"]
    code = f"""
def solution():
    wrote = []
    for target in {targets!r}:
        try:
            with open(target, 'w') as handle:
                handle.write('escaped')
            wrote.append(target)
        except OSError:
            pass
    return True
assert solution()
"""
    try:
        result = run_python(code, isolation=mode)
        assert result.passed, result.stderr
        assert [target for target in targets if os.path.lexists(target)] == []
    finally:
        for target in targets:
            with contextlib.suppress(OSError):
                os.unlink(target)


@pytest.mark.parametrize("mode", NAMESPACE_MODES)
def test_program_cannot_undo_its_confinement(mode):
    """Root of its user namespace, but with no capabilities: no umount, remount or new mounts."""
    require(mode)
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
attempts = {
    'umount /tmp': lambda: libc.umount2(b'/tmp', 2),
    'remount / rw': lambda: libc.mount(None, b'/', None, 32 | 4096, None),
    'mount tmpfs': lambda: libc.mount(b'tmpfs', b'/mnt', b'tmpfs', 0, None),
}
for label, attempt in attempts.items():
    print(label, 'blocked' if attempt() != 0 else 'DONE')
print('read-only root', bool(os.statvfs('/').f_flag & os.ST_RDONLY))
print([line.split()[1] for line in open('/proc/self/status') if line.startswith('CapEff')])
"""
    result = run_python(code, isolation=mode)
    assert result.passed, result.stderr
    assert "DONE" not in result.stdout and result.stdout.count("blocked") == 3
    assert "read-only root True" in result.stdout and "['0000000000000000']" in result.stdout


@pytest.mark.parametrize("mode", ALL_MODES)
def test_text_that_is_not_unicode_is_a_failure_not_a_crash(mode):
    require(mode)
    for code in ("x = '\ud800'\nprint(x)", "\udfff", "def f():\n    return '\udc80'\nassert f()"):
        result = run_python(code, isolation=mode)
        assert not result.passed and result.returncode is None and "not valid Unicode" in result.stderr, code
    assert run_python("print('still fine')", isolation=mode).stdout == "still fine\n"


def test_without_a_namespace_sandbox_untrusted_code_is_refused(monkeypatch):
    """No bubblewrap, no unshare: a clear error saying how to install bubblewrap, never a silent rlimits run."""
    monkeypatch.delenv(sandbox.ISOLATION_ENV_VAR, raising=False)
    monkeypatch.setattr(sandbox, "_probed", {"bwrap": False, "unshare": False, "rlimits": True})
    monkeypatch.setattr(sandbox, "_probe_errors", {"bwrap": "bwrap is not installed"})
    for attempt in (available_isolation, lambda: run_python("print(1)"), lambda: run_many(["print(1)"])):
        with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap") as error:
            attempt()
        assert "DELIBERATION_ENV_SANDBOX=rlimits" in str(error.value) and "bwrap is not installed" in str(error.value)
    # the explicit opt-ins still work
    assert run_python("print(1)", isolation="rlimits").stdout == "1\n"
    monkeypatch.setenv(sandbox.ISOLATION_ENV_VAR, "rlimits")
    assert available_isolation() == "rlimits" and run_python("print(2)").stdout == "2\n"
    monkeypatch.setenv(sandbox.ISOLATION_ENV_VAR, "bwrap")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        available_isolation()


def test_a_sandbox_that_does_not_confine_is_not_used(monkeypatch):
    """The probe checks the promise (read-only root, private /tmp), not only that the tool starts."""
    require("bwrap")
    writable = ("bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "--die-with-parent")
    monkeypatch.setattr(sandbox, "_bwrap_prefix", lambda: writable)
    monkeypatch.setattr(sandbox, "_probed", {})
    monkeypatch.setattr(sandbox, "_probe_errors", {})
    assert not isolation_works("bwrap")
    assert "writable" in sandbox._probe_errors["bwrap"]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_environment_secrets_are_not_visible(mode, monkeypatch):
    require(mode)
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
    require(mode)
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
    require(mode)
    code = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('after')"
    if mode in NAMESPACE_MODES:  # as init of its own PID namespace, "every process I may signal" is contained
        code += "\nif os.getpid() == 1:\n    os.kill(-1, signal.SIGKILL)\n    print('after all')"
    result = run_python(code, isolation=mode)
    assert os.getpid() > 0 and threading.main_thread().is_alive()  # we are still here
    assert run_python("print('next')", isolation=mode).stdout == "next\n"
    assert result.returncode is not None


@pytest.mark.parametrize("mode", ALL_MODES)
def test_huge_output_is_capped(mode):
    require(mode)
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
