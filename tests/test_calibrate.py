"""Calibrating the sim from traces: knob recovery, clear errors, the JSON config, and the fidelity report."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import pytest

import deliberation_env
from deliberation_env.analysis.calibrate import CalibrationError, fit, main, write_config
from deliberation_env.analysis.traces import TraceWriter, read_traces
from deliberation_env.backends.sim import SimBackend, SimConfig
from deliberation_env.protocols import PROTOCOLS, make_protocol

# A sim far from the defaults: a team whose wrong answers are more confident than its right ones
# (AUROC < 0.5), that copies peers and breaks right answers when it refines.
TRUE = SimConfig(
    skills=(0.8, 0.5, 0.3), difficulty_weight=2.0, no_answer_rate=0.15, distractor_decay=0.6,
    sycophancy=0.7, refine_self=0.5, refine_peer_gain=0.3, follow_wrong=0.3,
    confidence_right=0.6, confidence_wrong=0.65, confidence_noise=0.1, overconfidence=(0.0, -0.1, 0.15),
    check_rate_right=0.3, check_rate_wrong=0.4, hedge_rate_right=0.2, hedge_rate_wrong=0.3,
    solve_tokens=150, refine_tokens=200, critic_tokens=20, copy_peer=0.25, refine_break=0.1,
)
TOLERANCE = {  # absolute, except tokens (relative); about 3 standard errors at these episode counts
    "skills": 0.06, "difficulty_weight": 0.5, "no_answer_rate": 0.05, "distractor_decay": 0.12,
    "sycophancy": 0.1, "refine_self": 0.1, "refine_peer_gain": 0.12, "follow_wrong": 0.12, "copy_peer": 0.12,
    "refine_break": 0.05, "confidence_right": 0.02, "confidence_wrong": 0.02, "confidence_noise": 0.02,
    "overconfidence": 0.02, "check_rate_right": 0.05, "check_rate_wrong": 0.05, "hedge_rate_right": 0.05,
    "hedge_rate_wrong": 0.05, "solve_tokens": 0.05, "refine_tokens": 0.05, "critic_tokens": 0.05,
}


def record(path, config, plan, seed0=0, **env_kwargs):
    """Trace ``plan`` = {protocol: episodes} played by a sim with ``config``."""
    with TraceWriter(path) as writer:
        for label, count in plan.items():
            agents = 1 if label == "single" else 3
            env = deliberation_env.parallel_env(backend=SimBackend(config), trace=writer, trace_label=label,
                                                num_agents=agents, **env_kwargs)
            protocol = make_protocol(label)
            for seed in range(seed0, seed0 + count):
                protocol.reset(seed)
                observations, infos = env.reset(seed=seed)
                while env.agents:
                    observations, _, _, _, infos = env.step(protocol.act(observations, infos))
    return read_traces(path)


def test_fit_recovers_every_knob_of_a_known_sim(tmp_path):
    episodes = record(tmp_path / "t.jsonl", TRUE, {"debate": 700, "threshold": 150, "self_consistency": 150})
    fitted, notes = fit(episodes)
    assert notes["defaults_kept"] == {}
    for name, tolerance in TOLERANCE.items():
        truth, value = getattr(TRUE, name), getattr(fitted, name)
        if name.endswith("_tokens"):
            assert abs(value - truth) <= tolerance * truth, (name, value, truth)
        elif isinstance(truth, tuple):
            assert len(value) == len(truth) and all(abs(v - t) <= tolerance for v, t in zip(value, truth)), (name, value)
        else:
            assert abs(value - truth) <= tolerance, (name, value, truth)
    assert notes["confidence_auroc"]["real"] < 0.5  # wrong answers more confident: kept by the fit
    assert fitted.confidence_wrong > fitted.confidence_right


def test_unidentifiable_knobs_keep_their_default_and_say_why(tmp_path):
    # One difficulty level and no REFINE at all: difficulty_weight and the refine knobs cannot be fitted.
    episodes = record(tmp_path / "t.jsonl", TRUE, {"self_consistency": 60}, task_kwargs={"levels": [3]})
    fitted, notes = fit(episodes)
    kept = notes["defaults_kept"]
    for name in ("difficulty_weight", "sycophancy", "refine_self", "refine_peer_gain", "follow_wrong",
                 "copy_peer", "refine_break", "refine_tokens"):
        assert name in kept and getattr(fitted, name) == getattr(SimConfig(), name)
    assert "solve_tokens" not in kept and abs(fitted.solve_tokens - TRUE.solve_tokens) < 15


def test_empty_and_too_small_traces_are_clear_errors(tmp_path):
    with pytest.raises(CalibrationError, match="no episodes"):
        fit([])
    episodes = record(tmp_path / "t.jsonl", TRUE, {"debate": 3})
    with pytest.raises(CalibrationError, match=r"only 9 round-0 solutions .* at least 20"):
        fit(episodes)


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "deliberation_env.calibrate", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_cli_mistakes_are_one_line_and_exit_code_2(tmp_path):
    missing = run_cli(tmp_path / "nope.jsonl", "-o", tmp_path / "sim.json")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such trace file" in missing.stderr
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"version": 1, "task": "arithmetic"}\n')
    result = run_cli(garbage)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "garbage.jsonl:1: missing field" in result.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = run_cli(empty)
    assert result.returncode == 2 and "no episodes" in result.stderr
    result = run_cli("--compare", empty)
    assert result.returncode == 2 and "needs the sim config" in result.stderr
    assert main([str(empty)]) == 2


def test_fitted_config_file_drives_the_sim(tmp_path):
    config_path = tmp_path / "sim.json"
    write_config(TRUE, {"note": "written by the test"}, config_path)
    env = deliberation_env.parallel_env(backend="sim", backend_kwargs={"config": str(config_path)})
    assert env.backends[0].config == TRUE
    assert env.backends[0].identity() == SimBackend(TRUE).identity()
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"skills": [0.6, 0.4], "copy_peer": 0.5}))
    assert SimBackend(config=plain).config == SimConfig(skills=(0.6, 0.4), copy_peer=0.5)


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not a readable JSON file"),
    ('["skills"]', "must be a JSON object of SimConfig knobs"),
    ('{"skils": [0.5]}', r"unknown knob\(s\) \['skils'\]"),
    ('{"skills": "high"}', "knob 'skills' must be a list of numbers"),
    ('{"solve_tokens": 10.5}', "knob 'solve_tokens' must be int"),
    ('{"copy_peer": 1.5}', r"copy_peer must be in \[0, 1\]"),
])
def test_bad_config_files_name_the_file_and_the_knob(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=rf"bad\.json.*{message}"):
        SimBackend(config=str(path))
    with pytest.raises(FileNotFoundError, match="missing.json.*calibrate"):
        SimBackend(config=str(tmp_path / "missing.json"))


def test_new_knobs_at_their_defaults_leave_the_sim_and_its_identity_unchanged():
    assert "copy_peer" not in SimBackend().identity() and "refine_break" not in SimBackend().identity()
    assert "copy_peer=0.3" in SimBackend(copy_peer=0.3).identity()
    assert asdict(SimConfig())["copy_peer"] == 0.0 and SimConfig().refine_break == 0.0


def test_copy_peer_makes_refiners_adopt_peer_answers(tmp_path):
    episodes = record(tmp_path / "t.jsonl", SimConfig(copy_peer=1.0), {"debate": 30})
    for episode in episodes:
        for before, after in zip(episode.rounds, episode.rounds[1:]):
            for i, agent in enumerate(after.agents):
                peers = {before.agents[j].answer for j in range(3) if j != i} - {None}
                if peers:
                    assert agent.answer in peers


def test_fidelity_report_end_to_end(tmp_path):
    """A sim calibrated on a different sim's traces reproduces its protocol ranking on held-out problems."""
    train = record(tmp_path / "train.jsonl", TRUE, {"debate": 500, "threshold": 100, "self_consistency": 100})
    config_path = tmp_path / "sim.json"
    write_config(*fit(train), config_path)
    plan = {name: 120 for name in PROTOCOLS}
    record(tmp_path / "heldout.jsonl", TRUE, plan, seed0=10_000)
    outdir = tmp_path / "report"
    result = run_cli("--compare", tmp_path / "heldout.jsonl", config_path, "-o", outdir)
    assert result.returncode == 0, result.stderr
    report = (outdir / "report.md").read_text()
    assert report == result.stdout
    assert (outdir / "report.png").stat().st_size > 10_000
    for name in PROTOCOLS:
        assert f"| {name} | 120 |" in report
    rho = float(report.split("| Spearman of the protocol ranking by accuracy | ")[1].split(" ")[0])
    assert rho >= 0.8, report
    simulated = read_traces(outdir / "sim_traces.jsonl")
    heldout = read_traces(tmp_path / "heldout.jsonl")
    assert [(e.label, e.problem_id, e.seed) for e in simulated] == [(e.label, e.problem_id, e.seed) for e in heldout]
