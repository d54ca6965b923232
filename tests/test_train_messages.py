"""What the trainer's command line says about a replay run (issue: numbers you can cite): the set's name#digest, each
departure from the recording, why a run has no leaderboard row, and, in a redirected log, a few progress lines (the
trainers' per-update postfix no longer redraws the bar)."""

from __future__ import annotations

import re

from baselines.meta import train as train_cli
from deliberation_env.replay import PINNED

MAIN_JOB = ["--algo", "softrankpo", "--replay", "qwen05-arith-v2", "--env-option", "features=v2", "--train-split", "fit"]
"""The README's main job."""
PROGRESS = re.compile(r"^(sft data|sft|softrankpo): +\d+%\|")


def test_the_main_job_names_its_set_and_writes_a_few_progress_lines_to_a_log(tmp_path, capsys):
    """The README's main job on a small budget, its stderr not a terminal: before, every update's postfix drew a line
    (98 lines in 25 s at the full budget); now a line at most every 30 s, and each bar's first and last."""
    train_cli.main([*MAIN_JOB, "--episodes", "1200", "--no-evaluate", "--no-tensorboard", "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert f"replay set qwen05-arith-v2#{PINNED['qwen05-arith-v2']}" in out.splitlines()[0]
    assert "departure" not in out and "No leaderboard row" not in out
    progress = [line for line in err.splitlines() if PROGRESS.match(line)]
    assert progress and len(progress) <= 8, progress  # three bars (sft data, sft, softrankpo): 2 lines each, + 30 s ones
    assert all("\r" not in line for line in progress)


def test_a_confidence_option_is_a_departure_and_says_why_the_row_is_dropped(tmp_path, capsys):
    train_cli.main([*MAIN_JOB, "--env-option", "confidence=critic", "--episodes", "64", "--no-evaluate",
                    "--no-tensorboard", "--no-progress", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "departure from the recording: confidence='critic' (recorded 'critic_text')" in out
    assert "No leaderboard row: --env-option {'features': 'v2', 'confidence': 'critic'} plays no benchmark game" in out
