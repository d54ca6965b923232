"""``bench/studies/llm_study.py``'s report: it describes the settings the finished chunks were run with (not the flags of the
run that writes it), refuses chunks that differ, and refuses to add chunks under flags that differ from theirs; each
run's accuracy, the spread between runs and the intervals over runs and problems. And the study's GPU preset."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")


@pytest.fixture
def study(tmp_path, monkeypatch):
    """The bench module with its results folder moved to ``tmp_path``."""
    from bench.common import results
    monkeypatch.setattr(results, "RESULTS", str(tmp_path))  # the report reads it at call time
    from bench.studies import llm_study

    return llm_study


def _chunk(bench, folder, cell: str, seed: int, correct: list[int], **changes) -> None:
    """A finished chunk's result file, as ``run_chunk`` writes it, with the study flags below."""
    args = bench.parse_args(["--model", "~/m.gguf", "--max-tokens", "160", "--updates", "16",
                             "--problems-per-update", "1", "--eval-problems", str(len(correct))])
    config = json.loads(json.dumps(bench.asdict(bench.cell_config(args, cell, seed)))) | changes
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{cell}-seed{seed}.json"), "w", encoding="utf-8") as f:
        json.dump({"cell": cell, "seed": seed, "train_seconds": 60.0, "eval_seconds": 60.0, "config": config,
                   "curve": [{"accuracy": 0.5}], "row": _row(correct)}, f)


def _row(correct: list[int]) -> dict:
    """An evaluation row as ``evaluate_team`` returns it, for the report's needs."""
    return {"accuracy": sum(correct) / len(correct), "episodes": len(correct), "per_problem_accuracy": correct,
            "tokens": 100.0}


def test_the_report_describes_the_chunks_settings_not_the_flags(study, tmp_path):
    _chunk(study, tmp_path / "train_llm_2x2", "team-shared", 0, [1, 0, 1, 1])
    _chunk(study, tmp_path / "train_llm_2x2", "team-own", 0, [0, 0, 1, 1])
    study.main(["--design", "2x2", "--report-only"])  # defaults: 192 tokens, 2 problems per update, 20 updates, 200 problems
    text = (tmp_path / "train_llm_2x2.md").read_text()
    assert "m.gguf" in text and "160 tokens per answer" in text and "G=4 x 1 problems per update, 16 updates" in text
    assert "4 held-out test problems" in text and "192" not in text
    assert "| team-shared - team-own | +0.250 [" in text


def test_chunks_that_differ_are_refused_by_name(study, tmp_path):
    _chunk(study, tmp_path / "train_llm_2x2", "team-shared", 0, [1, 0])
    _chunk(study, tmp_path / "train_llm_2x2", "team-own", 0, [1, 0], max_tokens=256)
    with pytest.raises(SystemExit, match="differ in max_tokens"):
        study.main(["--design", "2x2", "--report-only"])


def test_new_chunks_under_other_flags_are_refused_before_any_work(study, tmp_path):
    _chunk(study, tmp_path / "train_llm_2x2", "team-shared", 0, [1, 0])
    with pytest.raises(SystemExit, match=r"max_tokens \(192 here, 160 in the finished chunks\)"):
        study.main(["--design", "2x2", "--model", "~/m.gguf", "--updates", "16", "--problems-per-update", "1", "--eval-problems", "2"])


def test_command_line_is_ready_to_paste_from_the_repository_root(monkeypatch):
    """Started from inside its folder (``bench/studies/``) with a model in the home folder, the recorded command still
    names the script from the repository's root and writes the home folder as ~."""
    from bench.common import results as results
    monkeypatch.chdir(os.path.join(BENCH, "studies"))
    model = os.path.join(os.path.expanduser("~"), "models", "m.gguf")
    monkeypatch.setattr("sys.argv", ["llm_study.py", "--model", model, "--seeds", "0", "1"])
    assert results.command_line() == "python bench/studies/llm_study.py --model ~/models/m.gguf --seeds 0 1"


def test_with_two_seeds_of_every_cell_the_main_effects_are_also_given_per_seed(study, tmp_path):
    """Seed 0: team reward helps (+0.5); seed 1: it hurts (-0.5); pooled, it cancels. The report shows all three."""
    folder = tmp_path / "train_llm_2x2"
    for cell in ("team-shared", "team-own"):
        _chunk(study, folder, cell, 0, [1, 1])
        _chunk(study, folder, cell, 1, [0, 0])
    for cell in ("own-shared", "own-own"):
        _chunk(study, folder, cell, 0, [0, 1])
        _chunk(study, folder, cell, 1, [0, 1])
    study.main(["--design", "2x2", "--report-only"])
    text = (tmp_path / "train_llm_2x2.md").read_text()
    assert "| main effect of the reward (team - own) | +0.000 [" in text
    assert "| main effect of the reward (team - own), seed 0 only | +0.500 [" in text
    assert "| main effect of the reward (team - own), seed 1 only | -0.500 [" in text
    assert "| main effect of the credit (shared - own), seed 1 only | +0.000 [" in text


def test_a_resumed_chunks_training_time_counts_the_updates_before_the_resume(study, tmp_path, monkeypatch):
    """The chunk's training time is the sum of its updates' own times from the metrics log, so a chunk resumed after
    all its updates (``train`` returns at once) still reports the hours they took, not the seconds of the resume."""
    args = study.parse_args(["--model", "~/m.gguf", "--out", str(tmp_path / "runs"), "--updates", "2"])
    cfg = study.cell_config(args, "own-own", 1)
    os.makedirs(cfg.out, exist_ok=True)
    with open(os.path.join(cfg.out, "metrics.jsonl"), "w", encoding="utf-8") as f:  # as the interrupted run left it
        for step, seconds in ((1, 200.0), (2, 250.0)):
            f.write(json.dumps({"step": step, "accuracy": 0.5, "seconds": seconds}) + "\n")
    monkeypatch.setattr(study, "train", lambda config: object())
    monkeypatch.setattr(study, "team_backends", lambda *a, **k: [])
    monkeypatch.setattr(study, "cached", lambda backends, out: backends)
    monkeypatch.setattr(study, "evaluate_team", lambda name, backends, config: {"accuracy": 0.5, "tokens": 1.0})
    study.run_chunk(args, "own-own", 1)
    with open(study.result_path(args.stem, "own-own-seed1"), encoding="utf-8") as f:
        result = json.load(f)
    assert result["train_seconds"] == 450.0
    assert [point["accuracy"] for point in result["curve"]] == [0.5, 0.5]


def test_hierarchical_bootstrap_resamples_runs_as_well_as_problems():
    """One run per cell: the paired bootstrap over problems, draw for draw. Identical runs add nothing. Runs that
    disagree widen the interval beyond the problems-only one, and a cell whose runs split 0/1 on every problem has a
    0.5 mean whose interval spans most of [0, 1] even though every problem sits at 0.5."""
    from deliberation_env.analysis.metrics import hierarchical_bootstrap, paired_bootstrap

    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 50).astype(float), rng.integers(0, 2, 50).astype(float)
    assert hierarchical_bootstrap([a, b], [1.0, -1.0]) == pytest.approx(paired_bootstrap(a, b))
    assert hierarchical_bootstrap([np.stack([a, a, a]), b], [1.0, -1.0]) == pytest.approx(paired_bootstrap(a, b))
    split = np.stack([np.zeros(50), np.ones(50)])
    mean, low, high = hierarchical_bootstrap([split], [1.0])
    assert mean == 0.5 and paired_bootstrap(split.mean(0), np.zeros(50))[1:] == (0.5, 0.5)
    assert low == 0.0 and high == 1.0  # 2 runs: a quarter of the draws take run 0 twice, a quarter run 1 twice
    with pytest.raises(ValueError, match="same problems"):
        hierarchical_bootstrap([a, b[:10]], [1.0, -1.0])


def test_the_report_gives_each_run_the_spread_and_says_when_runs_are_too_few(study, tmp_path):
    folder = tmp_path / "train_llm_turns"
    runs = {"own-own": ([1, 1, 1, 1], [0, 0, 1, 1]), "team-shared": ([1, 0, 1, 0], [1, 0, 1, 0])}
    for cell, (first, second) in runs.items():
        _chunk(study, folder, cell, 0, first)
        _chunk(study, folder, cell, 1, second)
    study.main(["--report-only"])
    text = (tmp_path / "train_llm_turns.md").read_text()
    own = next(line for line in text.splitlines() if line.startswith("| own-own |"))
    assert "| 1.000, 0.500 | 0.354 |" in own  # each run's accuracy, their standard deviation
    assert "do not cover training noise yet" in text
    team = next(line for line in text.splitlines() if line.startswith("| team-shared |"))
    assert "| 0.500, 0.500 | 0.000 |" in team
    _chunk(study, folder, "own-own", 2, [1, 1, 0, 1])
    _chunk(study, folder, "team-shared", 2, [1, 0, 1, 0])
    study.main(["--report-only"])
    text = (tmp_path / "train_llm_turns.md").read_text()
    assert "do not cover" not in text and "include training noise as far as these runs show it" in text
    row = next(line for line in text.splitlines() if line.startswith("| team-shared - own-own | -0.250 ["))
    (low, high), (run_low, run_high) = (map(float, cell.split("[")[1].rstrip("] ").split(", "))
                                        for cell in row.split("|")[2:4])
    assert run_high - run_low > high - low  # own-own's runs disagree: resampling them widens the interval


def test_the_gpu_preset_is_the_redesigned_study_at_its_budget_and_flags_still_win(study):
    args = study.parse_args(["--preset", "gpu", "--updates", "50"])
    assert (args.model, args.design, args.seeds, args.updates) == ("Qwen/Qwen2.5-1.5B-Instruct", "turns", [0, 1, 2, 3], 50)
    assert args.cells == list(study.DESIGNS["turns"]) and args.stem == "train_llm_gpu"
    cfg = study.cell_config(args, "teamturn-shared", 3)
    cfg.validate()  # a valid trainer config (LoRA, sampling on the vLLM server), checked without a GPU
    assert cfg.generate_url == ["http://127.0.0.1:8000/v1"] and cfg.reward_weights["team_turn"] == 1.0
    assert (cfg.device, cfg.dtype, cfg.weights, cfg.seed) == ("cuda", "bfloat16", "lora", 3)
    assert study.cell_config(study.parse_args(["--preset", "gpu", "--generate-url"]), "own-own", 0).generate_url == []
    assert args.levels == [1, 2, 3] and study.parse_args(["--preset", "gpu", "--levels", "2"]).levels == [2]


def test_the_gpu_preset_runs_jigsaw_under_its_own_stem_on_the_tasks_levels(study):
    args = study.parse_args(["--preset", "gpu", "--task", "jigsaw"])
    assert (args.stem, args.levels) == ("train_llm_gpu_jigsaw", [0, 1, 2]) and args.out.endswith("bench-train-llm-gpu-jigsaw")
    cfg = study.cell_config(args, "own-own", 0)
    cfg.validate()
    assert cfg.task == "jigsaw" and cfg.task_options["levels"] == (0, 1, 2) and len(cfg.env_options["roles"]) == 2
    with pytest.raises(SystemExit):  # jigsaw has no level 3: refused at the command line, not after the model loads
        study.parse_args(["--task", "jigsaw", "--levels", "3"])


def _untrained(folder, correct: list[int]) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "untrained.json"), "w", encoding="utf-8") as f:
        json.dump({"eval_seconds": 60.0, "row": _row(correct)}, f)


STUDY_FLAGS = ["--model", "~/m.gguf", "--max-tokens", "160", "--updates", "16", "--problems-per-update", "1",
               "--eval-problems", "2", "--cells", "teamturn-shared", "own-own", "--seeds", "0"]


def test_workers_run_their_share_of_the_cells_in_the_parents_results_folder(study, tmp_path):
    """Every chunk already finished: each worker (a spawned process) finds its cells' chunks in the parent's results
    folder, so it trains nothing; a worker that looked elsewhere would try to load the missing model and fail."""
    folder = tmp_path / "train_llm_turns"
    _untrained(folder, [1, 0])
    for cell in ("teamturn-shared", "own-own"):
        _chunk(study, folder, cell, 0, [1, 1] if cell == "own-own" else [0, 1])
    study.main([*STUDY_FLAGS, "--out", str(tmp_path / "runs"), "--workers", "2"])
    logs = sorted(os.listdir(tmp_path / "runs"))
    assert logs == ["worker0.log", "worker1.log"]
    assert "| own-own | 1 | 1.000" in (tmp_path / "train_llm_turns.md").read_text()


def test_a_failed_worker_is_named_and_its_log_says_why(study, tmp_path):
    folder = tmp_path / "train_llm_turns"
    _untrained(folder, [1, 0])
    _chunk(study, folder, "teamturn-shared", 0, [0, 1])  # own-own's chunk is missing: its worker must train
    with pytest.raises(SystemExit, match="a worker failed, see .*worker1.log"):
        study.main([*STUDY_FLAGS, "--out", str(tmp_path / "runs"), "--workers", "2"])
    assert "Traceback" in (tmp_path / "runs" / "worker1.log").read_text()
    assert "Traceback" not in (tmp_path / "runs" / "worker0.log").read_text()


def test_more_workers_than_cells_is_one_line_naming_the_cells(study, capsys):
    with pytest.raises(SystemExit):
        study.parse_args(["--cells", "own-own", "--workers", "2"])
    assert "--workers 2: give 1 to 1, one worker per cell at most (1 cells: own-own)" in capsys.readouterr().err
