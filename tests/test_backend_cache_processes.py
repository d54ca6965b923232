"""CachedBackend across real processes: concurrent writers, and a writer killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

WRITER = r"""
import sys
from deliberation_env.backends.base import Message, Request
from deliberation_env.backends.cache import CachedBackend
from deliberation_env.testing.echo import EchoBackend

cache = CachedBackend(EchoBackend(), sys.argv[1])
start, count = int(sys.argv[2]), int(sys.argv[3])
for seed in range(start, start + count):
    cache.generate([Request((Message("user", "q"),), "solve", 0, seed, 64, 0.7)])
    print(seed, flush=True)
"""


def _writer(path, start: int, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(start), str(count)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})


def test_two_processes_write_concurrently(tmp_path):
    path = tmp_path / "shared.sqlite"
    writers = [_writer(path, 0, 200), _writer(path, 1000, 200)]
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == 400


def test_sigkill_mid_write_loses_nothing_committed(tmp_path):
    path = tmp_path / "killed.sqlite"
    writer = _writer(path, 0, 100_000)
    committed = []
    assert writer.stdout is not None
    deadline = time.time() + 60
    while len(committed) < 300 and time.time() < deadline:
        committed.append(int(writer.stdout.readline()))
    writer.send_signal(signal.SIGKILL)
    writer.wait(timeout=30)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        texts = {row[0] for row in conn.execute("SELECT text FROM completions")}
    assert len(committed) == 300
    assert all(f"answer {seed}" in texts for seed in committed)  # every reported commit survived
