"""How far apart do the leaderboard's runs land on another CPU (or another kernel path of the same one)?

    python bench/studies/machine_spread.py --trainers softrankpo ppo --seeds 0 1 2         # here, as torch runs by default
    ATEN_CPU_CAPABILITY=default python bench/studies/machine_spread.py ...                  # torch's portable kernels
    python bench/studies/machine_spread.py --compare                                        # the table over every run so far

Trains the suite's final runs (bench/benchmark/benchmark_suite.py: the learning rate it chose on validation, ``fit``, the same
seeds) on this machine, scores each on test exactly, and writes one CSV per machine and kernel path under
bench/results/machine_spread/: the CPU, torch's kernel capability (``ATEN_CPU_CAPABILITY`` picks another), each
run's test accuracy and the sha256 of its final weights. ``--record-suite`` writes the suite's own runs the same
way (the reference, once, where they were trained); ``--compare`` sets every machine's file beside it: per trainer and seed, whether the weights are the same bits, and the accuracy differences (mean, the
largest, and a bootstrap interval over seeds). CI runs the first command on its machine and prints the CSV.
"""

from __future__ import annotations

import csv
import glob
import hashlib
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import Scores, parse_cell
from baselines.meta.policy import load_policy
from bench.common.results import RESULTS, command_line, write_report
from bench.common.suite import EPISODES, choices, read, train_and_score
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser

OUT = os.path.join(RESULTS, "machine_spread_leaderboard")
"""Where this leaderboard's machines go (``machine_spread/``: those of the previous split's, reported in
machine_spread.md)."""
SUITE = os.path.join(RESULTS, "leaderboard")
SUITE_RUNS = os.path.join("runs", "leaderboard")
FIELDS = ["machine", "cpu", "isa", "capability", "torch", "trainer", "seed", "lr", "test_accuracy", "weights", "seconds"]


def cpu() -> tuple[str, str]:
    """The CPU's model name and the instruction sets that change float kernels (AVX2, AVX-512, AMX)."""
    name, flags = platform.processor() or "unknown", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
    except OSError:
        pass
    isa = "+".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none"
    return name, isa


def weights_sha256(path: str) -> str:
    """The final weights' bits (the state dict's tensors in order), not the file's (which holds settings)."""
    digest = hashlib.sha256()
    for name, tensor in load_policy(path).state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def train(args) -> None:
    cell = parse_cell(args.cell)
    found = read(os.path.join(SUITE, cell.name.replace(":", "-")))
    name, isa = cpu()
    capability = torch.backends.cpu.get_cpu_capability()
    machine = args.machine or f"{isa}-{capability}"
    runs = os.path.join("runs", "machine_spread", machine)
    path = os.path.join(OUT, f"{machine}.csv")
    os.makedirs(OUT, exist_ok=True)
    done = set()
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            done = {(r["trainer"], int(r["seed"])) for r in csv.DictReader(f)}
    for trainer in args.trainers:
        lr = float(found["trainers"][trainer]["chosen"].removeprefix("lr"))
        for seed in args.seeds:
            if (trainer, seed) in done:
                continue
            began = time.perf_counter()
            stem = f"final-lr{lr:g}-seed{seed}"
            scores = train_and_score(cell, trainer, {"lr": lr}, seed, args.episodes, ("test",),
                                     os.path.join(OUT, machine, trainer), stem, runs=runs)
            row = {"machine": machine, "cpu": name, "isa": isa, "capability": capability, "torch": torch.__version__,
                   "trainer": trainer, "seed": seed, "lr": lr,
                   "test_accuracy": f"{scores['test'].accuracy.mean():.4f}",
                   "weights": weights_sha256(os.path.join(runs, cell.name.replace(":", "-"), trainer, stem, "policy.pt")),
                   "seconds": f"{time.perf_counter() - began:.0f}"}
            new = not os.path.isfile(path)
            with open(path, "a", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, FIELDS)
                if new:
                    writer.writeheader()
                writer.writerow(row)
            print(",".join(str(row[k]) for k in FIELDS), flush=True)


def record_suite(args) -> None:
    """The suite's own final runs (those of the leaderboard, kept under runs/ where they were trained), as a CSV of
    the same form: the reference the other machines are set against."""
    cell = parse_cell(args.cell)
    name, isa = cpu()
    rows = []
    for trainer, found in read(os.path.join(SUITE, cell.name.replace(":", "-"))).get("trainers", {}).items():
        for seed, scores in enumerate(found["runs"]):
            (policy,) = glob.glob(os.path.join(SUITE_RUNS, cell.name.replace(":", "-"), trainer,
                                               f"final-*-seed{seed}", "policy.pt"))
            rows.append({"machine": "suite", "cpu": name, "isa": isa, "capability": "", "torch": torch.__version__,
                         "trainer": trainer, "seed": seed, "lr": found["chosen"].removeprefix("lr"),
                         "test_accuracy": f"{scores.accuracy.mean():.4f}", "weights": weights_sha256(policy),
                         "seconds": ""})
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "suite.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {os.path.join(OUT, 'suite.csv')}: {len(rows)} runs")


def compare(args) -> None:
    rows = []
    for path in sorted(glob.glob(os.path.join(OUT, "*.csv"))):
        with open(path, encoding="utf-8") as f:
            rows += list(csv.DictReader(f))
    table = {(r["machine"], r["trainer"], int(r["seed"])): r for r in rows}
    machines = sorted({r["machine"] for r in rows} - {"suite"})
    lines = ["# Machine spread", "", f"`{command_line()}`", "",
             "Each machine's runs against the suite's own (the runs of the leaderboard), seed by seed: weights equal "
             "bit for bit, and the test accuracy difference in points (mean over the seeds with a 95% bootstrap "
             "interval over seeds, and the largest).", "",
             "| machine (isa-torch kernels) | cpu | trainer | seeds | same weights | accuracy - suite's | largest |",
             "|---|---|---|---|---|---|---|"]
    rng = np.random.default_rng(0)
    for machine in machines:
        for trainer in sorted({t for m, t, _ in table if m == machine}):
            seeds = sorted(s for m, t, s in table if m == machine and t == trainer and ("suite", t, s) in table)
            if not seeds:
                continue
            mine = [table[(machine, trainer, s)] for s in seeds]
            theirs = [table[("suite", trainer, s)] for s in seeds]
            same = sum(a["weights"] == b["weights"] for a, b in zip(mine, theirs))
            diff = 100 * np.array([float(a["test_accuracy"]) - float(b["test_accuracy"]) for a, b in zip(mine, theirs)])
            draws = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(4000)]
            lines.append(f"| {machine} | {mine[0]['cpu']} | {trainer} | {len(seeds)} | {same}/{len(seeds)} | "
                         f"{diff.mean():+.1f} [{np.percentile(draws, 2.5):+.1f}, {np.percentile(draws, 97.5):+.1f}] | "
                         f"{diff[np.argmax(np.abs(diff))]:+.1f} |")
    lines += pooled(parse_cell(args.cell), machines, table)
    text = "\n".join(lines) + "\n"
    write_report("machine_spread", text)


def pooled(cell, machines: list[str], table: dict, level: float = 1 - 0.05 / 6) -> list[str]:
    """Each trainer's difference to the best protocol with the leaderboard's interval, over the suite's runs alone
    and over its runs pooled with every machine's (the interval then covers the machines' spread too); a run whose
    weights are the suite's run's bits is not another run, and is left out."""
    found = read(os.path.join(SUITE, cell.name.replace(":", "-")))
    best, ordered = choices(found)
    reference = found["protocols"]["test"][best].accuracy
    lines = ["", f"Difference to {best} in points, hierarchical bootstrap over runs and, paired, problems at the "
             f"leaderboard's level ({100 * level:.2f}%): the suite's runs alone, then pooled with each machine's runs "
             "of the same seeds as further runs of the row.", "",
             "| trainer | runs | suite alone | pooled runs | pooled |", "|---|---|---|---|---|"]
    for trainer, row in ordered:
        theirs = [scores.accuracy for scores in row["runs"]]
        mine = []
        for machine in machines:
            for path in sorted(glob.glob(os.path.join(OUT, machine, trainer, "*-test.csv"))):
                seed = int(path.rsplit("seed", 1)[1].split("-")[0])
                run, suite = table.get((machine, trainer, seed)), table.get(("suite", trainer, seed))
                if run is not None and (suite is None or run["weights"] != suite["weights"]):
                    mine.append(Scores.load(path).accuracy)
        if not mine:
            continue
        cells = [hierarchical_bootstrap([np.stack(runs), reference], [1.0, -1.0], level=level)
                 for runs in (theirs, theirs + mine)]
        lines.append(f"| {trainer} | {len(theirs)} + {len(mine)} | "
                     + f" | {len(theirs) + len(mine)} | ".join(f"{100 * e:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]"
                                                             for e, lo, hi in cells) + " |")
    return lines


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="qwen05-arith-v2:chosen-v3-r2")
    parser.add_argument("--trainers", nargs="+", default=["softrankpo", "ppo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=EPISODES, help="as the suite's runs")
    parser.add_argument("--machine", default=None, help="the label of this machine's CSV (default: isa-kernels)")
    parser.add_argument("--compare", action="store_true", help="the table over every machine's CSV so far")
    parser.add_argument("--record-suite", action="store_true",
                        help="write the suite's own runs (under runs/leaderboard) as the reference CSV")
    args = parser.parse_args(argv)
    if args.record_suite:
        record_suite(args)
    elif args.compare:
        compare(args)
    else:
        train(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
