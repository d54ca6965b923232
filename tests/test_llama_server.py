"""A server started by ``serve`` (llama_server's startup) that dies is named once: its exit status or signal and the
end of its log, not the clients' connection errors. The server here is a stand-in process on 127.0.0.1 that lists a
model, then dies on a chosen completion, as a llama.cpp build with CPU kernels the machine lacks does."""

from __future__ import annotations

import sys
import time

import pytest

from deliberation_env.backends.base import Message, Request
from deliberation_env.backends.openai import BackendError, OpenAICompatibleBackend
from deliberation_env.testing.llama_server import ServerDied, free_port, serve

STAND_IN = """
import faulthandler, json, os, resource, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port, answers, crash = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


class Handler(BaseHTTPRequestHandler):
    def reply(self, payload):
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply({"object": "list", "data": [{"id": "stand-in", "object": "model"}]})

    def do_POST(self):
        global answers
        self.rfile.read(int(self.headers["content-length"]))
        if answers == 0:
            print("stand-in: general protection fault in the matmul kernel", flush=True)
            if crash == "SIGSEGV":
                faulthandler.disable()  # even under PYTHONFAULTHANDLER: the log ends with the line above
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
                os.kill(os.getpid(), signal.SIGSEGV)
            os._exit(int(crash))
        answers -= 1
        self.reply({"choices": [{"message": {"role": "assistant", "content": "OK"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1}})

    def log_message(self, *args):
        pass


print(f"stand-in: listening on 127.0.0.1:{port}", flush=True)
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def stand_in(port: int, answers: int, crash: str) -> list[str]:
    """The stand-in's command: it answers ``answers`` completions, then dies (``crash``: SIGSEGV, or an exit code)."""
    return [sys.executable, "-c", STAND_IN, str(port), str(answers), crash]


@pytest.mark.parametrize(("crash", "status"), [("SIGSEGV", "was killed by signal 11 (SIGSEGV)"),
                                                ("3", "exited with code 3")])
def test_a_server_that_dies_on_its_first_completion_is_one_clear_error(crash, status):
    port = free_port()
    start = time.monotonic()
    with pytest.raises(ServerDied) as error, serve(stand_in(port, 0, crash), port, name="the stand-in server"):
        pytest.fail("the block ran on a server that cannot complete")
    message = str(error.value)
    assert message.startswith(f"the stand-in server {status} on its first completion, after answering /v1/models")
    assert "scripts/setup-tests.sh" in message and "scripts/llama_build_info.py" in message  # the fix
    assert message.endswith(f"the end of its log:\nstand-in: listening on 127.0.0.1:{port}\n"
                            "stand-in: general protection fault in the matmul kernel")
    assert "ConnectError" not in message and time.monotonic() - start < 30


def test_a_server_that_dies_while_in_use_is_named_beside_the_connection_errors():
    port = free_port()
    request = Request((Message("user", "What is 2 + 2?"),), "solve", 0, 1, max_tokens=4, temperature=0.0)
    died = r"^the stand-in server was killed by signal 11 \(SIGSEGV\) while in use; the end of its log:\n(.|\n)*fault"
    with pytest.raises(ServerDied, match=died) as error, \
            serve(stand_in(port, 1, "SIGSEGV"), port, name="the stand-in server") as server:
        server.check()  # alive: its one answer went to the startup check
        backend = OpenAICompatibleBackend(server.url, model="m", max_retries=1, backoff=0.01)
        with pytest.raises(BackendError, match="connection failed"):
            backend.generate([request])
        # what the llama_url fixture asks at each test's setup and teardown
        with pytest.raises(ServerDied, match=r"killed by signal 11 \(SIGSEGV\) during this test; "):
            server.check("during this test")
        backend.generate([request])  # a client's error that leaves the block names the death
    assert isinstance(error.value.__cause__, BackendError) and "connection failed" in str(error.value.__cause__)


def test_a_server_that_never_answers_is_a_timeout_naming_its_log():
    port = free_port()
    sleeper = [sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(60)"]
    timed_out = r"the sleeper did not answer on http://127.0.0.1:\d+/v1 within 1 s; the end of its log:\nloading weights$"
    with pytest.raises(RuntimeError, match=timed_out), serve(sleeper, port, name="the sleeper", startup_timeout=1.0):
        pass
