"""Calibrating the sim from traces: knob recovery, clear errors, the JSON config, and the fidelity report."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import subprocess
import sys
from dataclasses import asdict

import pytest

import deliberation_env
from deliberation_env.analysis.calibrate import CalibrationError, fit, main, write_config
from deliberation_env.analysis.traces import TraceWriter, read_traces
from deliberation_env.backends.sim import SimBackend, SimConfig, problem_latent, solve_probability
from deliberation_env.core.deliberation import Action
from deliberation_env.protocols import PROTOCOLS, make_protocol
from deliberation_env.record import main as record_set

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
    return subprocess.run([sys.executable, "-m", "deliberation_env.analysis.calibrate", *map(str, args)],
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


# ------------------------------------------------------------------ correlated agents: problem_spread, level_offsets
CORRELATED = SimConfig(skills=(0.7, 0.5, 0.35), problem_spread=1.5, level_offsets=(0.8, -0.8))


def all_same_share(episodes) -> float:
    """The share of episodes whose agents' first answers are all right or all wrong."""
    return sum(len({a.correct for a in e.rounds[0].agents}) == 1 for e in episodes) / len(episodes)


def test_problem_spread_makes_agents_right_or_wrong_together(tmp_path):
    plan, kwargs = {"self_consistency": 500}, {"task_kwargs": {"levels": [3]}, "split": "train"}
    independent = record(tmp_path / "a.jsonl", SimConfig(), plan, **kwargs)
    correlated = record(tmp_path / "b.jsonl", SimConfig(problem_spread=2.0), plan, **kwargs)
    assert all_same_share(correlated) > all_same_share(independent) + 0.15
    # the latent difficulty is a property of the problem: the same for every agent, seed and run
    assert problem_latent("arithmetic", "arithmetic-train-7") == problem_latent("arithmetic", "arithmetic-train-7")
    latents = [problem_latent("arithmetic", f"arithmetic-train-{i}") for i in range(2000)]
    assert abs(statistics.mean(latents)) < 0.08 and abs(statistics.stdev(latents) - 1) < 0.08


def test_fit_recovers_a_known_spread_and_level_offsets(tmp_path):
    episodes = record(tmp_path / "t.jsonl", CORRELATED, {"self_consistency": 2000}, task_kwargs={"levels": [0, 1]},
                      split="train")
    fitted, notes = fit(episodes)
    assert abs(fitted.problem_spread - CORRELATED.problem_spread) <= 0.3, fitted.problem_spread
    assert all(abs(v - t) <= 0.25 for v, t in zip(fitted.level_offsets, CORRELATED.level_offsets)), fitted.level_offsets
    assert all(abs(v - t) <= 0.06 for v, t in zip(fitted.skills, CORRELATED.skills)), fitted.skills
    for level in ("all", "0", "1"):  # the fitted model reproduces the agreement that independent agents miss
        row = notes["agreement"][level]
        assert abs(row["fitted"] - row["observed"]) <= 0.03 and row["independent"] < row["observed"] - 0.08, row
    # without a spread in the truth, the fit finds (about) none
    plain, _ = fit(record(tmp_path / "p.jsonl", SimConfig(), {"self_consistency": 1000}, split="train"))
    assert plain.problem_spread <= 0.4 and len(plain.level_offsets) == 6  # levels 1-5 traced, 0 is not


def test_fixed_knobs_are_held_and_the_others_fitted_given_them(tmp_path):
    episodes = record(tmp_path / "t.jsonl", CORRELATED, {"self_consistency": 600}, task_kwargs={"levels": [0, 1]},
                      split="train")
    fitted, notes = fit(episodes, fixed=("problem_spread", "level_offsets"))
    assert fitted.problem_spread == 0.0 and fitted.level_offsets == () and notes["fixed"]["problem_spread"] == 0.0
    assert "problem_spread" not in notes["defaults_kept"]
    with pytest.raises(CalibrationError, match="unknown knob"):
        fit(episodes, fixed=("spread",))


def test_default_sim_is_unchanged_bit_for_bit():
    assert SimBackend().identity() == (
        "sim:skills=(0.72, 0.55, 0.4),difficulty_weight=3.0,no_answer_rate=0.05,distractor_decay=0.35,"
        "sycophancy=0.45,refine_self=0.35,refine_peer_gain=0.55,follow_wrong=0.5,confidence_right=0.72,"
        "confidence_wrong=0.5,confidence_noise=0.14,overconfidence=(0.0, 0.08, 0.18),check_rate_right=0.6,"
        "check_rate_wrong=0.2,hedge_rate_right=0.125,hedge_rate_wrong=0.5,solve_tokens=220,refine_tokens=260,"
        "critic_tokens=12")
    assert "problem_spread=0.5" in SimBackend(problem_spread=0.5).identity()
    config = SimConfig()
    for agent, difficulty in itertools.product(range(3), (0.0, 0.3, 1.0)):  # the formula of the sim before the knobs
        skill = config.skills[agent]
        old = 1 / (1 + math.exp(-(math.log(skill / (1 - skill)) - config.difficulty_weight * (difficulty - 0.5))))
        assert solve_probability(config, agent, difficulty, latent=1.7, level=2) == old
    # zero knobs written out are no-ops: every completion is the same as the default sim's
    zeros = SimBackend(problem_spread=0.0, level_offsets=(0.0,) * 6)
    for task_kwargs in ({}, {"levels": [0, 1]}):
        env = deliberation_env.parallel_env(task_kwargs=task_kwargs, max_rounds=2)
        for seed in range(20):
            env.reset(seed=seed)
            env.step({agent: Action.REFINE for agent in env.agents})
            requests = [env.deliberation._request(i, (), "solve") for i in range(3)]
            assert zeros.generate(requests) == SimBackend().generate(requests)


@pytest.mark.parametrize("knobs,message", [
    ({"problem_spread": -0.5}, r"problem_spread must be in \[0, 20"),
    ({"problem_spread": float("nan")}, "problem_spread must be in"),
    ({"level_offsets": (0.0, float("inf"))}, "level_offsets must be a tuple of logit offsets"),
    ({"level_offsets": [0.5]}, "level_offsets must be a tuple"),
])
def test_new_knobs_are_validated(knobs, message):
    with pytest.raises(ValueError, match=message):
        SimConfig(**knobs)


def test_bad_new_knobs_in_a_config_file_name_the_knob(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"level_offsets": "high"}')
    with pytest.raises(ValueError, match=r"bad\.json': knob 'level_offsets' must be a list of numbers"):
        SimBackend(config=str(path))
    path.write_text('{"level_offsets": [0.5, -0.5], "problem_spread": 1}')
    assert SimBackend(config=str(path)).config == SimConfig(level_offsets=(0.5, -0.5), problem_spread=1.0)


# ------------------------------------------------------------------------------- --replay: train, fit, compare
@pytest.fixture(scope="module")
def spread_set(tmp_path_factory):
    """A small replay set recorded from a sim with correlated agents (24 problems a split, one round)."""
    folder = tmp_path_factory.mktemp("replay")
    config = folder / "truth.json"
    write_config(SimConfig(skills=(0.6, 0.45, 0.3), problem_spread=1.5, copy_peer=0.3), {}, config)
    out = folder / "spread-arith"
    for split in ("train", "test"):
        assert record_set(["--out", str(out), "--split", split, "--problems", "0:24", "--rounds", "1", "--chunk", "24",
                           "--backend", "sim", "--backend-option", f"config={config}", "--task-option", "levels=[2,3]",
                           "--max-tokens", "64", "--agents", "3", "--sources", "critic_text"]) == 0
    return out


def test_replay_compare_end_to_end(spread_set, tmp_path):
    outdir = tmp_path / "report"
    assert main(["--replay", str(spread_set), "-o", str(outdir), "--seeds", "2"]) == 0
    report = (outdir / "report.md").read_text()
    result = json.loads((outdir / "report.json").read_text())
    assert list(result["protocols"]) == [name for name in PROTOCOLS if name != "single"]
    assert "`single`" in report and "num_agents=1" in report
    assert result["test_problems"] == 24 and result["seeds_per_problem"] == 2
    assert -1.0 <= result["spearman"] <= 1.0 and f"{result['spearman']:.3f}" in report
    assert result["config"]["problem_spread"] > 0.5  # the correlation of the recorded sim is found
    assert {"all", "2", "3"} <= set(result["agreement_test"]["real"])
    real, sim = read_traces(outdir / "test_real.jsonl"), read_traces(outdir / "test_sim.jsonl")
    assert [(e.label, e.problem_id) for e in real] == [(e.label, e.problem_id) for e in sim]
    assert SimBackend(config=str(outdir / "sim.json")).config.problem_spread == result["config"]["problem_spread"]
    fixed = tmp_path / "fixed"
    assert main(["--replay", str(spread_set), "-o", str(fixed), "--seeds", "1", "--fix", "problem_spread=0"]) == 0
    assert json.loads((fixed / "report.json").read_text())["config"]["problem_spread"] == 0


def test_replay_mistakes_are_one_line_and_exit_code_2(tmp_path, spread_set, capsys):
    for argv, message in [
        (["--replay", str(tmp_path / "nope")], "no replay set"),
        (["--replay", str(spread_set), "--fix", "problem_spread"], "--fix takes KNOB=VALUE"),
        (["--replay", str(spread_set), "--fix", "problem_spread=-1"], "problem_spread must be in"),
        (["--replay", str(spread_set), "--fix", "level_offsets=[oops]"], "the value must be JSON"),
        (["--replay", str(spread_set), "--seeds", "0"], "seeds must be >= 1"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("calibrate: error: ") and err.count("\n") == 1 and message in err, err
    result = run_cli("--replay", spread_set, tmp_path / "t.jsonl")
    assert result.returncode == 2 and "--replay takes no trace file" in result.stderr
