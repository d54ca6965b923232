"""Does the sequential game need temporal credit? Myopic against sequential policies on the compiled trees.

    python bench/studies/sequential_headroom.py                       # both sets, both games, 1 and 2 rounds
    python bench/studies/sequential_headroom.py --sets qwen05-arith-v2 --games v2 --repeats 2

A ``-r2`` game (``baselines.benchmark.GAMES``) adds a round of PERSIST and CONCEDE only after the recorded one, so a
REFINE in round 1 pays off only through what round 2 does with the refined answers. Per set x game x rounds (1 or 2),
on the trees of ``fit``, ``validation`` and ``test`` pooled (every recorded problem; a descriptive table, no choice of
the leaderboard is made here):

| column | what |
|---|---|
| vote / debate | every agent PERSISTs / REFINEs in round 1 (PERSISTs after) |
| best protocol | the best fixed joint action per round, chosen on the training folds (cross-validated) |
| myopic / sequential | the best decentralised policy of the class below, cross-validated; *myopic* picks each round's table for the consensus right after that round, as if it were the last; *sequential* for the final consensus (coordinate ascent over the tables from several starts, a lower bound of the class's best) |
| sequential - myopic | with a paired bootstrap 95% interval over problems (held-out outcomes averaged over the fold splits) |
| ceiling | the sequential policy with each agent's own correctness as its signal (privileged): what no observation of the class reaches |
| joint oracle | the best joint-action sequence per problem |

The policy class: per round and agent, a table from (how many peers hold my answer, my signal above its training
median) to an action (decentralised: each agent reads its own observation only; one table per agent, so a fixed
joint action is in the class); the signal is one column of the game's observation (or none), chosen on the training
folds by the policy's own objective. The ascent starts from every agent PERSISTing, from every agent REFINEing in
round 1, from the best protocol of the training folds, and from a random table. Writes bench/results/sequential_headroom.md.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from baselines.benchmark import loaded, parse_cell
from bench.common.results import command_line, write_report
from deliberation_env.analysis.metrics import paired_bootstrap
from deliberation_env.cli import ArgumentParser
from deliberation_env.engine import compile_tree

SPLITS = ("fit", "validation", "test")


class Pooled:
    """The trees of several splits of one game, side by side: node ids offset per split, roots stacked."""

    def __init__(self, trees: list):
        offsets = np.cumsum([0] + [t.num_nodes for t in trees[:-1]])
        edge_offsets = np.cumsum([0] + [len(t.child) for t in trees[:-1]])
        first = trees[0]
        self.rows = np.concatenate([t.rows for t in trees])
        self.agreement = np.concatenate([t.agreement for t in trees])
        self.mask = np.concatenate([t.mask for t in trees])
        self.correct = np.concatenate([t.correct for t in trees])
        self.consensus = np.concatenate([t.consensus_correct for t in trees]).astype(float)
        self.expand = np.concatenate([np.where(t.expand >= 0, t.expand + e, -1) for t, e in zip(trees, edge_offsets)])
        self.child = np.concatenate([t.child + o for t, o in zip(trees, offsets)])
        self.roots = np.concatenate([t.roots[:, 0] + o for t, o in zip(trees, offsets)])
        self.feature_names = first.feature_names
        self.num_agents, self.num_actions, self.rounds = first.num_agents, first.num_actions, first.max_rounds
        self.weights = first.num_actions ** np.arange(first.num_agents - 1, -1, -1)

    def step(self, nodes: np.ndarray, joint: np.ndarray) -> np.ndarray:
        """The children of ``nodes`` under the joint action indices ``joint`` (an ended node stays)."""
        edges = self.expand[nodes]
        live = edges >= 0
        out = nodes.copy()
        out[live] = self.child[edges[live], joint[live]]
        return out


def states(tree: Pooled, nodes: np.ndarray, signal: np.ndarray | None, threshold: float) -> np.ndarray:
    """(K, N) table index of each agent at ``nodes``: peers agreeing (0..N-1) x signal above ``threshold``."""
    agree = tree.agreement[nodes].sum(-1).astype(np.int64)
    bit = np.zeros_like(agree) if signal is None else (signal[nodes] > threshold).astype(np.int64)
    return agree * 2 + bit


def play(tree: Pooled, roots: np.ndarray, tables: np.ndarray, signal: np.ndarray | None, threshold: float,
         rounds: int | None = None) -> np.ndarray:
    """Per root, whether the consensus is right after ``rounds`` rounds (default all) of the policy ``tables``
    (R, N, states) -> action; a masked action plays as PERSIST, as the env does."""
    nodes, agents = roots.copy(), np.arange(tree.num_agents)
    for r in range(tree.rounds if rounds is None else rounds):
        actions = tables[r][agents, states(tree, nodes, signal, threshold)]
        legal = np.take_along_axis(tree.mask[nodes], actions[..., None], -1)[..., 0] > 0
        nodes = tree.step(nodes, (actions * legal) @ tree.weights)
    return tree.consensus[nodes]


def fit_tables(tree: Pooled, roots: np.ndarray, signal: np.ndarray | None, threshold: float, myopic: bool,
               rng: np.random.Generator, protocol: np.ndarray) -> tuple[np.ndarray, tuple[float, ...]]:
    """The best tables found by coordinate ascent from four starts (every agent PERSISTs; every agent REFINEs in
    round 1; the fixed joint actions ``protocol``, (R, N); random), and their objective: the final consensus; or
    (``myopic``) round by round, each round's table for the consensus right after it with the earlier tables fixed,
    the objective then each round's value in turn (compared in order)."""
    shape = (tree.rounds, tree.num_agents, 2 * tree.num_agents)
    refine = np.zeros(shape, np.int64)
    refine[0] = 1
    inits = [np.zeros(shape, np.int64), refine, np.repeat(protocol[:, :, None], shape[2], axis=2),
             rng.integers(tree.num_actions, size=shape)]
    best, best_objective = inits[0], (-1.0,)
    for tables in inits:
        stages = [[r] for r in range(tree.rounds)] if myopic else [list(range(tree.rounds))]
        objective = []
        for rounds in stages:
            tables, value = _ascend(tree, roots, tables, rounds, signal, threshold, rounds[-1] + 1)
            objective.append(value)
        if tuple(objective) > best_objective:
            best, best_objective = tables, tuple(objective)
    return best, best_objective


def _ascend(tree: Pooled, roots: np.ndarray, tables: np.ndarray, rounds: list[int], signal: np.ndarray | None,
            threshold: float, horizon: int) -> tuple[np.ndarray, float]:
    """Coordinate ascent over the entries of ``rounds``' tables for the consensus after ``horizon`` rounds."""
    value = play(tree, roots, tables, signal, threshold, horizon).mean()
    improved = True
    while improved:
        improved = False
        for r, agent, entry in itertools.product(rounds, range(tables.shape[1]), range(tables.shape[2])):
            for action in range(tree.num_actions):
                if action == tables[r, agent, entry]:
                    continue
                trial = tables.copy()
                trial[r, agent, entry] = action
                got = play(tree, roots, trial, signal, threshold, horizon).mean()
                if got > value + 1e-12:
                    tables, value, improved = trial, got, True
    return tables, value


def cross_validated(tree: Pooled, folds: int, repeats: int, seed: int) -> dict[str, np.ndarray]:
    """Per problem, the held-out outcome of each policy (averaged over ``repeats`` fold splits)."""
    problems = len(tree.roots)
    out = {name: np.zeros(problems) for name in ("protocol", "myopic", "sequential", "ceiling")}
    columns = [None, *range(len(tree.feature_names))]
    joints = tree.num_actions ** tree.num_agents
    candidates = np.array(list(itertools.product(range(joints), repeat=tree.rounds)))
    sequences = protocol_outcomes(tree, candidates)
    digits = tree.num_actions ** np.arange(tree.num_agents - 1, -1, -1)
    rng = np.random.default_rng(seed)
    for _ in range(repeats):
        fold = rng.permutation(problems) % folds
        for k in range(folds):
            train, held = tree.roots[fold != k], tree.roots[fold == k]
            best = sequences[fold != k].mean(0).argmax()
            out["protocol"][fold == k] += sequences[fold == k, best]
            protocol = candidates[best][:, None] // digits % tree.num_actions  # (R, N): each agent's action
            for name, myopic in (("myopic", True), ("sequential", False)):
                chosen, chosen_value = None, (-1.0,)
                for column in columns:
                    signal = None if column is None else tree.rows[:, :, column]
                    threshold = 0.0 if signal is None else float(np.median(signal[train]))
                    tables, value = fit_tables(tree, train, signal, threshold, myopic, rng, protocol)
                    if value > chosen_value:
                        chosen, chosen_value = (tables, signal, threshold), value
                tables, signal, threshold = chosen
                out[name][fold == k] += play(tree, held, tables, signal, threshold)
            correct = tree.correct.astype(float)
            tables, _ = fit_tables(tree, train, correct, 0.5, False, rng, protocol)
            out["ceiling"][fold == k] += play(tree, held, tables, correct, 0.5)
    return {name: values / repeats for name, values in out.items()}


def protocol_outcomes(tree: Pooled, sequences: np.ndarray) -> np.ndarray:
    """(P, number of sequences): each root's final consensus under each fixed joint-action sequence."""
    out = np.zeros((len(tree.roots), len(sequences)))
    for s, sequence in enumerate(sequences):
        nodes = tree.roots.copy()
        for joint in sequence:
            nodes = tree.step(nodes, np.full(len(nodes), joint))
        out[:, s] = tree.consensus[nodes]
    return out


def joint_oracle(tree: Pooled) -> np.ndarray:
    """Per root, the best final consensus over every joint-action sequence (backward over the DAG)."""
    value = tree.consensus.copy()
    live = np.flatnonzero(tree.expand >= 0)
    for _ in range(tree.rounds):  # enough sweeps for values to reach the roots
        value[live] = value[tree.child[tree.expand[live]]].max(-1)
    return value[tree.roots]


def row(name: str, game: str, rounds: int, folds: int, repeats: int, seed: int, problems: int | None) -> dict:
    cell = parse_cell(f"{name}:{game}" if rounds == 1 else f"{name}:{game}-r2")
    trees = [cell.tree(split) if problems is None else
             compile_tree(loaded(cell.dataset), split, problems=range(problems), **cell.options) for split in SPLITS]
    tree = Pooled(trees)
    refine = int(tree.weights.sum())  # all REFINE: every digit 1
    vote = protocol_outcomes(tree, np.zeros((1, rounds), np.int64))[:, 0]
    debate = protocol_outcomes(tree, np.array([[refine] + [0] * (rounds - 1)]))[:, 0]
    found = cross_validated(tree, folds, repeats, seed)
    return {"set": name, "game": game, "rounds": rounds, "problems": len(tree.roots), "vote": vote.mean(),
            "debate": debate.mean(), **{k: v for k, v in found.items()}, "oracle": joint_oracle(tree).mean()}


def points(diff: float, low: float, high: float) -> str:
    return f"{100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}]"


def report(rows: list[dict], folds: int, repeats: int, seconds: float) -> str:
    lines = ["# Sequential headroom: does the two-round game need temporal credit?", "",
             f"`{command_line()}` ({seconds / 60:.1f} min). Trees of {', '.join(SPLITS)} pooled; policies "
             f"cross-validated ({folds} folds, {repeats} fold splits); intervals: paired bootstrap 95% over problems "
             "(bench/studies/sequential_headroom.py's docstring defines every column).", "",
             "| set | game | rounds | problems | vote | debate | best protocol | myopic | sequential | sequential - "
             "myopic, points | sequential - protocol, points | ceiling | joint oracle |", "|" + "---|" * 13]
    for r in rows:
        lines.append(f"| {r['set']} | {r['game']} | {r['rounds']} | {r['problems']} | {r['vote']:.3f} | "
                     f"{r['debate']:.3f} | {r['protocol'].mean():.3f} | {r['myopic'].mean():.3f} | "
                     f"{r['sequential'].mean():.3f} | {points(*paired_bootstrap(r['sequential'], r['myopic']))} | "
                     f"{points(*paired_bootstrap(r['sequential'], r['protocol']))} | {r['ceiling'].mean():.3f} | "
                     f"{r['oracle']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["qwen05-arith-v2", "qwen05-team-arith"])
    parser.add_argument("--games", nargs="+", default=["v2", "chosen-v3"], choices=["v2", "chosen-v3"])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="fold splits averaged (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--problems", type=int, default=None, help="the first N problems of each split (a dev run)")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = [row(name, game, rounds, args.folds, args.repeats, args.seed, args.problems)
            for name in args.sets for game in args.games for rounds in (1, 2)]
    write_report("sequential_headroom", report(rows, args.folds, args.repeats, time.perf_counter() - started))


if __name__ == "__main__":
    main()
