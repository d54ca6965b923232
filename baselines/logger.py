"""Metrics logging (JSONL + CSV, TensorBoard when installed) and the progress bar."""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from tqdm.auto import tqdm


class MetricsLogger:
    """Writes one JSON object per log call to ``metrics.jsonl`` (a fresh file per run); ``metrics.csv`` on close."""

    def __init__(self, out_dir: str, tensorboard: bool = True, prefix: str = ""):
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.prefix = out_dir, prefix
        self.path = os.path.join(out_dir, "metrics.jsonl")
        self.rows: list[dict[str, Any]] = []
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(os.path.join(out_dir, "tb"))
            except ImportError:
                self.writer = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": int(step), **{self.prefix + k: _plain(v) for k, v in metrics.items()}}
        self.rows.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self.writer is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self.writer is not None:
            self.writer.close()
        if self.rows:
            columns = list(dict.fromkeys(k for row in self.rows for k in row))
            with open(os.path.join(self.out_dir, "metrics.csv"), "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(self.rows)


def _plain(value: Any) -> Any:
    try:
        return float(value) if not isinstance(value, (bool, int, str)) else value
    except (TypeError, ValueError):
        return str(value)


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl file (or of <dir>/metrics.jsonl)."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


LOG_INTERVAL_S = 30.0
"""Seconds between progress lines when the output is not a terminal (a log file, a CI job)."""


class _Lines:
    """A log stream for tqdm: each redraw (``\\r`` + status) becomes a line of its own."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").rstrip("\n")
        if text.strip():
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


class _LogBar(tqdm):
    """A bar for a log: a postfix or description change waits for the next line (tqdm's default redraws at once,
    which the trainers' per-update ``set_postfix`` turns into a line per update)."""

    def set_postfix(self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any) -> None:
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        super().set_postfix_str(s, refresh=False)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        super().set_description(desc, refresh=False)


def progress_bar(total: int, description: str, enabled: bool = True, file: TextIO | None = None) -> tqdm:
    """A progress bar on ``file`` (default stderr). On a terminal it redraws in place; elsewhere (a log file, CI) it
    writes a line at most every ``LOG_INTERVAL_S`` seconds (postfix changes included), and the last, so that the log
    is not flooded."""
    stream = file if file is not None else sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        return tqdm(total=total, desc=description, unit="ep", disable=not enabled, dynamic_ncols=True, leave=False,
                    file=stream)
    return _LogBar(total=total, desc=description, unit="ep", disable=not enabled, file=_Lines(stream), ncols=80,
                   mininterval=LOG_INTERVAL_S, maxinterval=float("inf"))
