"""Run a local llama.cpp OpenAI-compatible server for a GGUF file (``llama-cpp-python[server]``).

    from deliberation_env.testing.llama_server import llama_server

    with llama_server("model.gguf", threads=2) as url:           # http://127.0.0.1:<free port>/v1
        env = deliberation_env.parallel_env(backend="openai", backend_kwargs={"base_url": url, "model": "local"},
                                            confidence="critic_text")

The server listens on 127.0.0.1 only and is stopped when the block ends, also on errors and
Ctrl-C. Without ``logits_all=True`` it cannot return log-probabilities: use
``confidence="critic_text"`` (verbalized confidence) or ``logits_all=True`` (measured about 3x
slower on a 0.5B model on 2 CPU cores).

Before the block starts, the server must answer ``/v1/models`` and one real completion: a llama.cpp build whose CPU
kernels the machine lacks answers ``/v1/models`` and dies on its first completion. A server that dies, then or while
the block runs, raises ``ServerDied`` naming its exit status or signal and the end of its log, instead of the
clients' connection errors. ``serve`` runs any such server command (``llama_command`` builds llama.cpp's) and
yields a ``ServerProcess``, whose ``check()`` raises the same error for a server that has died since.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

LOG_TAIL_CHARS = 1500
PORTABLE_BUILD_HINT = ("a llama.cpp build with CPU kernels this machine lacks dies like this: `bash scripts/setup-tests.sh` "
                       "builds a portable one, `python scripts/llama_build_info.py` says what is installed")


class ServerDied(RuntimeError):
    """A server process started by ``serve`` has exited."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def exit_status(returncode: int) -> str:
    """How a process ended: "exited with code 1", "was killed by signal 11 (SIGSEGV)"."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        return f"was killed by signal {-returncode}"
    return f"was killed by signal {-returncode} ({name})"


@dataclass
class ServerProcess:
    """A server started by ``serve``: its process, its log (stdout and stderr) and its ``/v1`` URL."""

    process: subprocess.Popen
    log: IO[str]
    url: str
    name: str

    def log_tail(self) -> str:
        """The last ``LOG_TAIL_CHARS`` characters of the server's log."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-LOG_TAIL_CHARS:].strip() or "(empty)"

    def died(self, when: str) -> ServerDied:
        """The error for the server having exited (``when``: e.g. "on its first completion")."""
        return ServerDied(f"{self.name} {exit_status(self.process.returncode)} {when}; the end of its log:\n"
                          f"{self.log_tail()}")

    def check(self, when: str = "since it started serving") -> None:
        """Raise ``ServerDied`` (exit status, signal, log tail) if the server has exited."""
        if self.process.poll() is not None:
            raise self.died(when)


def llama_command(gguf: str | os.PathLike[str], port: int, threads: int = 2, n_ctx: int = 4096,
                  logits_all: bool = False) -> list[str]:
    """The command line of ``python -m llama_cpp.server`` serving ``gguf`` on 127.0.0.1:``port``."""
    path = Path(gguf).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
            "--n_threads_batch", str(threads), "--logits_all", str(logits_all).lower(), "--verbose", "false"]


@contextlib.contextmanager
def llama_server(gguf: str | os.PathLike[str], threads: int = 2, n_ctx: int = 4096, logits_all: bool = False,
                 port: int | None = None, startup_timeout: float = 180.0) -> Iterator[str]:
    """Start ``python -m llama_cpp.server`` on ``gguf``; yield its ``/v1`` URL once it has answered a completion;
    always stop it."""
    port = port or free_port()
    with serve(llama_command(gguf, port, threads, n_ctx, logits_all), port, startup_timeout=startup_timeout) as server:
        yield server.url


@contextlib.contextmanager
def serve(command: Sequence[str], port: int, name: str = "the llama.cpp server",
          startup_timeout: float = 180.0) -> Iterator[ServerProcess]:
    """Run ``command``, an OpenAI-compatible server on 127.0.0.1:``port``; yield it once it has answered ``/v1/models``
    and one chat completion; always stop it. Raises ``ServerDied`` if it exits before it has served, and if it
    has exited when an exception leaves the block (that exception is the cause)."""
    with tempfile.TemporaryFile("w+") as log:
        server = ServerProcess(subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT), log,
                               f"http://127.0.0.1:{port}/v1", name)
        try:
            _wait_until_served(server, time.monotonic() + startup_timeout, startup_timeout)
            try:
                yield server
            except Exception as error:
                if server.process.poll() is not None:
                    raise server.died("while in use") from error
                raise
        finally:
            server.process.terminate()
            try:
                server.process.wait(timeout=15)
            except subprocess.TimeoutExpired:  # busy in a generation: it does not stop before it ends
                server.process.kill()
                server.process.wait()


def _wait_until_served(server: ServerProcess, deadline: float, startup_timeout: float) -> None:
    """Wait for ``/v1/models``, then ask for one token: a server can list its model and crash on its first
    completion, and then its clients would see only connection errors."""
    import httpx

    while True:
        server.check("before it answered /v1/models (is llama-cpp-python[server] installed?)")
        try:
            if httpx.get(f"{server.url}/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.name} did not answer on {server.url} within {startup_timeout:g} s; "
                               f"the end of its log:\n{server.log_tail()}")
        time.sleep(0.5)
    body = {"model": "local", "messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 1, "temperature": 0}
    try:
        reply = httpx.post(f"{server.url}/chat/completions", json=body, timeout=max(deadline - time.monotonic(), 30.0))
    except httpx.HTTPError as error:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=5)  # a crash closes the connection just before the process is gone
        server.check(f"on its first completion, after answering /v1/models ({PORTABLE_BUILD_HINT})")
        raise RuntimeError(f"{server.name} answered /v1/models but not a one-token chat completion "
                           f"({type(error).__name__}: {error}); the end of its log:\n{server.log_tail()}") from error
    if reply.status_code != 200:
        raise RuntimeError(f"{server.name} answered /v1/models but a one-token chat completion got HTTP "
                           f"{reply.status_code}: {reply.text[:500]}")
