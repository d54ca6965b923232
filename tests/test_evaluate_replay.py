"""``baselines.meta.evaluate --replay SET``: the set's recorded game, or a departure named above the table."""

from __future__ import annotations

import pytest

from baselines.meta.evaluate import main as evaluate

SET = "qwen05-arith-v2"
SMALL = ["--protocols", "debate", "--problems", "3", "--seeds", "0", "--num-envs", "3"]


def table(out) -> str:
    return (out / "table.md").read_text()


def test_replay_plays_the_recorded_game_and_says_so(tmp_path, capsys):
    rows = evaluate(["--replay", SET, *SMALL, "--out", str(tmp_path)])
    assert [row["name"] for row in rows] == ["debate"]
    header = table(tmp_path).splitlines()[0]
    assert f"Replay set '{SET}'" in header and "split 'test': the recorded game." in header
    assert header in capsys.readouterr().out


def test_the_backend_replay_form_plays_the_same_game(tmp_path):
    """Before, this form was refused for max_tokens, then max_rounds, then task_kwargs, one attempt at a time."""
    replayed = evaluate(["--replay", SET, *SMALL, "--out", str(tmp_path / "a")])
    backend = evaluate(["--backend", "replay", "--backend-option", f"dataset={SET}", *SMALL, "--out", str(tmp_path / "b")])
    assert [r["accuracy"] for r in replayed] == [r["accuracy"] for r in backend]
    assert table(tmp_path / "a") == table(tmp_path / "b")


def test_another_confidence_source_is_named_above_the_table(tmp_path):
    """Before, leaving out confidence=critic_text silently played the critic's log-probabilities instead."""
    evaluate(["--replay", SET, *SMALL, "--env-option", "confidence=critic", "--out", str(tmp_path)])
    assert "departs from the recording: confidence='critic' (recorded 'critic_text')" in table(tmp_path)


@pytest.mark.parametrize(("flags", "message"), [
    (["--max-tokens", "128"], "recorded with max_tokens=256"),
    (["--max-rounds", "2"], "holds 1 round"),
    (["--num-agents", "2"], "num_agents=3"),
    (["--backend", "openai"], "--replay plays the set's recorded model"),
])
def test_a_setting_the_set_cannot_serve_is_refused_in_one_line(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        evaluate(["--replay", SET, *SMALL, *flags, "--out", str(tmp_path)])
    error = capsys.readouterr().err
    assert exit_.value.code == 2 and message in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "table.md").exists()
