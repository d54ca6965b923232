"""The benchmark suite's runs, shared by ``bench/benchmark/benchmark_suite.py`` and the studies that read or redo them
(``bench/studies/machine_spread.py``, ``template_overlap.py``, ``live_check.py``, ``peer_budget.py``): one training run
trained on ``fit`` and scored, a cell's folder read back, and what validation chooses in it.

The scripts import it as ``bench.common.suite``."""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from baselines.benchmark import Scores, loaded, pick_protocol, policy_scores
from baselines.meta.config import make_env_fn
from baselines.meta.train import config_class, run
from baselines.meta.trainers import leaderboard_rows
from deliberation_env.replay import ReplayBackend

EPISODES = 4000
"""Episodes of each leaderboard run (the suite's default; the tracks' 4,000-episode point and machine_spread's runs)."""
EXTERNAL = "benchmarl-"
"""The prefix of external rows in a cell's folder (``bench/benchmark/peers_benchmarl.py``: a peer library's algorithm
with its own configs, untuned, its final runs named ``final-default-seed<k>``)."""


def folder_name(cell) -> str:
    """A cell's folder name: ``<set>-<game>`` (a local set by its folder's name, so no path of this machine)."""
    return f"{os.path.basename(cell.dataset.rstrip('/'))}-{cell.game}"


def external_frames(folder: str) -> list[int]:
    """The training frames of an external row's runs (its runs' JSON files, ``peers_benchmarl.py``), distinct, sorted;
    on the one-round sets a frame is one episode."""
    frames = set()
    for path in glob.glob(os.path.join(folder, "final-*.json")):
        with open(path, encoding="utf-8") as f:
            frames.add(int(json.load(f)["frames"]))
    return sorted(frames)


def train_and_score(cell, algo: str, config: dict, seed: int, episodes: int, splits: tuple[str, ...],
                    folder: str, stem: str, runs: str = os.path.join("runs", "benchmark_suite")) -> dict[str, Scores]:
    """One training run on ``fit``, scored on ``splits``; its scores saved as ``<folder>/<stem>-<split>.csv``, the
    run itself (policy.pt) under ``<runs>/<cell>/<algo>/<stem>``."""
    paths = {split: os.path.join(folder, f"{stem}-{split}.csv") for split in splits}
    if all(os.path.isfile(path) for path in paths.values()):
        return {split: Scores.load(path) for split, path in paths.items()}
    trained, keywords = leaderboard_rows()[algo]  # the row's trainer and its settings (mappo: ppo's, centralized)
    cfg = config_class(trained)(
        replay=cell.dataset, env_options=cell.options, train_split="fit", episodes=episodes, seed=seed,
        out=os.path.join(runs, folder_name(cell), algo, stem), progress=False,
        tensorboard=False, **keywords, **config)
    backend = ReplayBackend(loaded(cell.dataset))
    policy = run(trained, cfg, make_env_fn(cfg, "fit", backend))
    scores = {split: policy_scores(policy, cell, split, label=algo) for split in splits}
    for split, path in paths.items():
        scores[split].save(path)
    return scores


def final_tests(folder: str) -> list[str]:
    """A row's finished final runs in its folder: their test CSVs (written last), by seed; each run's validation CSV
    is the same path with ``-validation.csv``."""
    return sorted(glob.glob(os.path.join(folder, "final-*-test.csv")), key=lambda p: int(p.rsplit("seed", 1)[1].split("-")[0]))


def read(folder: str) -> dict:
    """What a cell's folder holds: protocols per split, and per trainer its tuning and final runs (an external row's
    training frames too: ``external_frames``), and the set digests its scores name (``digests``)."""
    found: dict = {"protocols": {}, "trainers": {}}
    for path in glob.glob(os.path.join(folder, "protocols", "*.csv")):
        scores = Scores.load(path)
        found["protocols"].setdefault(scores.split, {})[scores.label] = scores
    externals = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, EXTERNAL + "*")))
    for algo in [*leaderboard_rows(), *externals]:
        finals = final_tests(os.path.join(folder, algo))
        tunes = glob.glob(os.path.join(folder, algo, "tune-*-validation.csv"))
        if finals:
            grid: dict[str, list[float]] = {}
            grid_runs: dict[str, list[np.ndarray]] = {}
            for path in sorted(tunes):
                value, accuracy = os.path.basename(path).split("-")[1], Scores.load(path).accuracy
                grid.setdefault(value, []).append(float(accuracy.mean()))
                grid_runs.setdefault(value, []).append(accuracy)
            chosen = os.path.basename(finals[0]).split("-")[1]
            validation = [Scores.load(p.replace("-test.csv", "-validation.csv")) for p in finals]
            found["trainers"][algo] = {"runs": [Scores.load(p) for p in finals], "grid": grid, "chosen": chosen,
                                       "grid_runs": {value: np.stack(runs) for value, runs in grid_runs.items()},
                                       "validation": float(np.mean([v.accuracy.mean() for v in validation])),
                                       "frames": external_frames(os.path.join(folder, algo))}
    loaded_scores = [*(s for split in found["protocols"].values() for s in split.values()),
                     *(s for trainer in found["trainers"].values() for s in trainer["runs"])]
    found["digests"] = sorted({s.digest for s in loaded_scores if s.digest is not None})  # none in older files
    return found


def check_digests(cell, found: dict) -> None:
    """A cell's folder (``read``) holds scores of the cell's set only: ValueError naming the other digest if not."""
    other = [digest for digest in found["digests"] if digest != cell.digest]
    if other:
        raise ValueError(f"{cell.name}: its folder holds scores computed on set digest {other[0]}, the set is "
                         f"{cell.digest} here (another version of it): score them again, or move them aside")


def choices(found: dict) -> tuple[str, list[tuple[str, dict]]]:
    """What validation chooses in a cell's folder (``read``): the best protocol, and the trainers in headline order
    (mean validation accuracy over their final seeds, best first)."""
    trainers = sorted(found["trainers"].items(), key=lambda item: -item[1]["validation"])
    return pick_protocol(found["protocols"]["validation"]), trainers


def stability(candidates: dict[str, np.ndarray], resamples: int = 2000, seed: int = 0) -> dict[str, float]:
    """How often each candidate would be chosen (the highest mean accuracy; ties: the first listed) if the validation
    problems were drawn again: ``candidates`` maps a name to its (runs, problems) or (problems,) validation scores on
    the same problems; returns each name's share of ``resamples`` bootstrap resamples of the problems."""
    names = list(candidates)
    means = np.stack([np.atleast_2d(candidates[name]).mean(0) for name in names])  # (candidates, problems)
    draws = np.random.default_rng(seed).integers(0, means.shape[1], (resamples, means.shape[1]))
    winners = means[:, draws].mean(-1).argmax(0)  # (resamples,): argmax takes the first of ties
    return {name: float((winners == k).mean()) for k, name in enumerate(names)}


def margins(found: dict) -> dict[str, float]:
    """Each trainer's mean validation accuracy over its cell's best protocol on validation (``read``'s folder)."""
    validation = found["protocols"]["validation"]
    protocol = validation[pick_protocol(validation)].accuracy.mean()
    return {algo: trainer["validation"] - protocol for algo, trainer in found["trainers"].items()}


def headline(cells: list[tuple]) -> tuple[object, str]:
    """The row to headline, chosen on validation across cells (``(cell, read(folder))`` pairs): the cell and trainer
    with the largest ``margins``."""
    cell, algo, _ = max(((cell, algo, margin) for cell, found in cells for algo, margin in margins(found).items()),
                        key=lambda item: item[2])
    return cell, algo


