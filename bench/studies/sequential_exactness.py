"""The sequential games are compiled exactly: every joint-action sequence of sampled problems, tree against env.

    python bench/studies/sequential_exactness.py                        # every shipped sequential cell
    python bench/studies/sequential_exactness.py --cells qwen05-arith-v2:v2-r2 --problems 10

For each sequential cell (a game of ``baselines.benchmark.GAMES`` that plays past the recording: ``refine_rounds``),
problems drawn from its ``test`` split with a fixed seed are compiled, and every one of their ``J ** rounds``
joint-action sequences is played through ``replay_env`` (``deliberation_env.engine.tree.verify_plays``): each step's
observations, masks, labels, consensus, tokens, rewards, reward components and termination against the compiled
arrays. A difference stops the run and is reported. Writes bench/results/sequential_exactness.md.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import loaded, parse_cell, shipped_cells
from bench.common.results import command_line, write_report
from deliberation_env.cli import ArgumentParser
from deliberation_env.engine import StaleTree, compile_tree
from deliberation_env.engine.tree import reference_env, verify_plays

PROBLEMS = {125: 4, 27: 40}
"""Problems sampled per cell, by joint actions (15,625 sequences per problem with 125 joint actions, 729 with 27)."""


def check(cell, problems: int | None, seed: int) -> dict:
    started = time.perf_counter()
    env = reference_env(loaded(cell.dataset), "test", cell.options)
    joints = env.action_space(env.possible_agents[0]).n ** len(env.possible_agents)
    count = problems or PROBLEMS.get(joints, 4)
    chosen = sorted(np.random.default_rng(seed).choice(len(env.problems), count, replace=False).tolist())
    tree = compile_tree(loaded(cell.dataset), "test", problems=chosen, cache=False, **cell.options)
    sequences = list(itertools.product(range(tree.num_joint), repeat=tree.max_rounds))
    plays = [(p, 0, sequence) for p in range(len(chosen)) for sequence in sequences]
    try:
        steps, difference = verify_plays(tree, env, plays), "none"
    except StaleTree as error:
        steps, difference = 0, str(error)
    return {"cell": cell.name, "problems": chosen, "sequences": len(plays), "steps": steps, "difference": difference,
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", nargs="+", default=None, help="sequential cells (default: every shipped one)")
    parser.add_argument("--problems", type=int, default=None, help="problems per cell (default: 40, or 4 with "
                        "125 joint actions)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cells = [parse_cell(c) for c in args.cells] if args.cells else \
        [c for c in shipped_cells() if "refine_rounds" in c.options]
    rows = [check(cell, args.problems, args.seed) for cell in cells]
    lines = ["# The sequential games against the env, every joint-action sequence", "", f"`{command_line()}`", "",
             "| cell | test problems (indices) | sequences played | steps compared | differences | seconds |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['cell']} | {len(r['problems'])} ({', '.join(map(str, r['problems']))}) | "
                     f"{r['sequences']:,} | {r['steps']:,} | {r['difference']} | {r['seconds']:.0f} |")
    write_report("sequential_exactness", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
