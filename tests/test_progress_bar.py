"""The trainers' progress bar: redrawn in place on a terminal, a few lines in a log."""

from __future__ import annotations

import io
import time

from baselines import logger


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_at_start_and_end_not_one_per_update():
    out = io.StringIO()  # not a terminal
    with logger.progress_bar(2000, "train", file=out) as bar:
        for _ in range(2000):
            bar.update(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in out.getvalue(), lines  # tqdm's default would redraw every 0.1 s
    assert "0/2000" in lines[0] and "2000/2000" in lines[-1]


def test_a_log_gets_a_line_per_interval_each_on_its_own_line(monkeypatch):
    monkeypatch.setattr(logger, "LOG_INTERVAL_S", 0.2)
    out = io.StringIO()
    with logger.progress_bar(12, "train", file=out) as bar:
        for _ in range(12):
            time.sleep(0.05)
            bar.update(1)
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 6, lines  # 0.6 s of updates: about one line per 0.2 s, plus the first and the last
    assert all(line.startswith("train:") for line in lines)


def test_a_terminal_gets_the_usual_bar_redrawn_in_place():
    out = Terminal()
    with logger.progress_bar(50, "train", file=out) as bar:
        for _ in range(50):
            bar.update(1)
    assert "\r" in out.getvalue() and bar.mininterval == 0.1


def test_a_log_gets_no_line_per_postfix_either():
    """The trainers set a postfix after every update: in a log that waits for the next line, as the counts do."""
    out = io.StringIO()
    with logger.progress_bar(500, "ppo", file=out) as bar:
        for step in range(500):
            bar.update(1)
            bar.set_postfix(acc=step / 500, ret=1.0)
            bar.set_description("ppo")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines  # the first and the last, which shows the last postfix
    assert "500/500" in lines[-1] and "acc=0.998" in lines[-1]
