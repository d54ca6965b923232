"""Score any meta-policy the leaderboard's way: one call, one command (the protocol: docs/benchmark.md).

    from baselines.benchmark import score
    report = score(my_policy, "qwen05-arith-v2:v2")      # -> the leaderboard row, printed by str(report)
    report.save("runs/mine")                              # per-problem outcomes, to compare or submit later

    python -m baselines.benchmark score runs/softrankpo-seed0/policy.pt --cell qwen05-arith-v2:v2 --out runs/mine
    python -m baselines.benchmark score my_package.agents:make_policy --cell qwen05-team-arith:chosen-v3
    python -m baselines.benchmark cells                   # every cell: set x game, with its size

A *cell* is a shipped replay set played as one game (``GAMES``). A policy is scored on the cell's test split: its
exact expected accuracy and tokens on every test problem (``deliberation_env.engine``; greedy unless asked
otherwise), beside the best fixed protocol, which is chosen on the cell's validation split (never on test). What
``policy`` may be:

| given                                | scored as                                                                |
|--------------------------------------|--------------------------------------------------------------------------|
| ``f(observations, nodes) -> probs``  | the engine's ``Probabilities``: (K, N, A) action probabilities of the K   |
|                                      | nodes' agents from their batched dict observations; exact                 |
| an object with ``reset``/``act``     | an actor of the PettingZoo dict API, played once per test problem         |
| a ``Policy`` or a ``policy.pt`` path | the baselines' policy, greedy (``greedy=False``: its exact expectation)   |
| ``FlatObservations(f)``              | ``f(flat) -> probs``: (M, A) probabilities from (M, D) rows of the env's  |
|                                      | ``observation="flat"`` vector (one row per agent); exact                  |
| a Stable-Baselines3 model            | trained on ``observation="flat"`` (docs/interop.md): its policy's action  |
|                                      | probabilities on the flat vector (``FlatObservations.of_sb3``); exact     |
| ``"module:name"``                    | that object, or what calling it (no arguments) returns                    |

Several training runs (a list of policies, or ``Scores`` saved earlier) give one row whose interval covers the runs
as well as the problems (``hierarchical_bootstrap``), the interquartile mean over runs, and each run's accuracy.
"""

from __future__ import annotations

import csv
import functools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from baselines.policy_forms import (
    FlatObservations,
    composed,
    is_actor,
    is_baselines_policy,
    is_sb3_model,
    resolve,
    uniform,
    validated,
)
from deliberation_env.analysis.metrics import hierarchical_bootstrap
from deliberation_env.cli import ArgumentParser
from deliberation_env.core.actions import num_actions
from deliberation_env.engine import compile_tree, expected_scores, greedy_probabilities
from deliberation_env.formats import ObservationFormat
from deliberation_env.make import replay_env
from deliberation_env.protocols import make_protocol
from deliberation_env.replay import load_card, loaded, shipped
from deliberation_env.replay.dataset import split_problem_ids

SEQUENTIAL = {"max_rounds": 2, "refine_rounds": 1}
"""A second round past a one-round recording: PERSIST and CONCEDE only, exact from the answers the set holds."""
GAMES: dict[str, dict[str, Any]] = {
    "v1": {"features": "v1"},
    "v2": {"features": "v2"},
    "chosen-v3": {"features": "v3", "concede_to_peer": True},
    "v2-r2": {"features": "v2", **SEQUENTIAL},
    "chosen-v3-r2": {"features": "v3", "concede_to_peer": True, **SEQUENTIAL},
}
"""The games a set is played as: the 3-action game seen through the v1 or v2 observation, and CONCEDE naming its peer
(5 actions per agent) seen through the v3 observation (roles and tools); each ``-r2`` game adds a second round that
offers PERSIST and CONCEDE only (``refine_rounds=1``): a sequential game, whose REFINE pays off only through what
round 2 does with the refined answers."""
PROTOCOL_ROWS = ("single", "self_consistency", "debate", "threshold", "random")
"""The fixed protocols the best one is chosen from (on validation); ``oracle`` is reported, never chosen."""
SCORE_SPLITS = ("validation", "test")


@dataclass(frozen=True)
class Cell:
    """A shipped (or local) replay set played as one of ``GAMES``: ``"<set>:<game>"``."""

    dataset: str
    game: str

    @property
    def name(self) -> str:
        return f"{self.dataset}:{self.game}"

    @property
    def options(self) -> dict[str, Any]:
        """The env options of the game (``replay_env(dataset, split, **options)``)."""
        return dict(GAMES[self.game])

    def env(self, split: str, **options: Any) -> Any:
        """The cell's PettingZoo env on ``split`` (``fit``, ``validation`` or ``test``; docs/benchmark.md)."""
        return replay_env(loaded(self.dataset), split, **self.options, **options)

    @property
    def digest(self) -> str:
        """The set digest of the cell's set (``deliberation_env.replay.card``): what its scores were computed on."""
        return loaded(self.dataset).digest

    def tree(self, split: str) -> Any:
        """The cell's compiled tree on ``split`` (cached on disk, checked when first loaded, then kept for the
        process: ``deliberation_env.engine``)."""
        return _tree(self, split)


@functools.lru_cache(maxsize=16)
def _tree(cell: Cell, split: str) -> Any:
    return compile_tree(loaded(cell.dataset), split, **cell.options)


def parse_cell(spec: str | Cell) -> Cell:
    """``"qwen05-arith-v2:v2"`` -> a ``Cell``; ValueError naming the sets and games there are."""
    if isinstance(spec, Cell):
        return spec
    dataset, _, game = str(spec).rpartition(":")
    if not dataset or game not in GAMES:
        raise ValueError(f"a cell is '<set>:<game>' with a game of {sorted(GAMES)}, e.g. 'qwen05-arith-v2:v2'; got "
                         f"{spec!r} (python -m baselines.benchmark cells lists them)")
    card = load_card(dataset)
    if GAMES[game].get("concede_to_peer") and card.concede_targets != "all":
        raise ValueError(f"set {dataset!r} recorded CONCEDE to the rule's peer only, so it has no {game!r} game; "
                         f"its games: {[g for g, o in GAMES.items() if not o.get('concede_to_peer')]}")
    return Cell(dataset, game)


def shipped_cells() -> list[Cell]:
    """Every shipped set x every game it was recorded for."""
    return [Cell(name, game) for name in shipped() for game, options in GAMES.items()
            if not options.get("concede_to_peer") or load_card(name).concede_targets == "all"]


def describe(cell: str | Cell) -> str:
    """One line on a cell: agents, actions, decisions (which of them go past the recording), problems per split."""
    cell = parse_cell(cell)
    card, options = load_card(cell.dataset), cell.options
    agents = card.settings["num_agents"]
    actions = num_actions(agents, bool(options.get("concede_to_peer")))
    rounds = options.get("max_rounds", card.rounds)
    first = options.get("refine_rounds", rounds) + 1
    later = f"round {first}" if first == rounds else f"rounds {first}-{rounds}"
    beyond = f" ({later}: PERSIST and CONCEDE only, past the {card.rounds} recorded)" if rounds > card.rounds else ""
    sizes = " / ".join(f"{len(split_problem_ids(card, split) or [])} {split}" for split in ("fit", "validation", "test"))
    return (f"{cell.name}: {agents} agents x {actions} actions ({actions ** agents} joint), {rounds} decision{'s' if rounds > 1 else ''}"
            f"{beyond}, observation {options['features']}; {sizes} problems")


# ----------------------------------------------------------------------------- per-problem scores
@dataclass
class Scores:
    """One policy's (or protocol's) expected outcome on every problem of a cell's split."""

    label: str
    cell: str
    split: str
    problem_ids: list[str]
    accuracy: np.ndarray
    """Expected final-consensus accuracy per problem (0/1 for a greedy policy on a one-stream set)."""
    tokens: np.ndarray
    """Expected tokens per problem (the whole episode's, round 0 included)."""
    digest: str | None = None
    """The set digest of the cell's set these scores were computed on (None in files written before it was kept)."""

    def save(self, path: str | os.PathLike[str]) -> str:
        """A CSV (``problem_id,accuracy,tokens``) with a ``# {json}`` first line naming label, cell, split and the set
        digest."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        meta = {"label": self.label, "cell": self.cell, "split": self.split, "digest": self.digest}
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write("# " + json.dumps(meta) + "\n")
            writer = csv.writer(f)
            writer.writerow(["problem_id", "accuracy", "tokens"])
            writer.writerows([pid, f"{a:.6g}", f"{t:.6g}"] for pid, a, t in zip(self.problem_ids, self.accuracy, self.tokens))
        return str(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Scores:
        """Scores saved by ``save``: runs scored in other processes or on other machines pool into one row with
        ``score([Scores.load(p) for p in paths], cell)`` (every file of the cell's test split and set digest)."""
        with open(path, encoding="utf-8") as f:
            meta = json.loads(f.readline().removeprefix("# "))
            rows = list(csv.DictReader(f))
        return cls(meta["label"], meta["cell"], meta["split"], [r["problem_id"] for r in rows],
                   np.array([float(r["accuracy"]) for r in rows]), np.array([float(r["tokens"]) for r in rows]),
                   meta.get("digest"))


def policy_scores(policy: Any, cell: str | Cell, split: str = "test", *, greedy: bool = True,
                  label: str = "policy") -> Scores:
    """``policy`` (any form of the module docstring's table) on every problem of the cell's ``split``."""
    cell = parse_cell(cell)
    policy = resolve(policy)
    if is_actor(policy):
        return _played(policy, cell, split, label)
    tree = cell.tree(split)
    if is_sb3_model(policy):
        policy = FlatObservations.of_sb3(policy)
    if isinstance(policy, FlatObservations):
        checked = validated(policy)
        exact = expected_scores(tree, composed(greedy_probabilities, checked) if greedy else checked,
                                format=ObservationFormat(observation="flat"))
        return Scores(label, cell.name, split, list(tree.problem_ids), exact["accuracy"], exact["tokens"], cell.digest)
    if is_baselines_policy(policy):
        probabilities = _policy_probabilities(policy, cell, greedy)
    elif greedy:
        probabilities = composed(greedy_probabilities, validated(policy))
    else:
        probabilities = validated(policy)
    exact = expected_scores(tree, probabilities)
    return Scores(label, cell.name, split, list(tree.problem_ids), exact["accuracy"], exact["tokens"], cell.digest)


def protocol_scores(cell: str | Cell, split: str, names: Sequence[str] = (*PROTOCOL_ROWS, "oracle")) -> dict[str, Scores]:
    """The fixed protocols on the cell's split: ``random`` as its exact expectation (uniform over legal actions),
    ``single`` as agent 0's own round-0 answer (the requests a one-agent env makes), the others played."""
    cell = parse_cell(cell)
    tree = cell.tree(split)
    out = {}
    for name in names:
        if name == "random":
            out[name] = policy_scores(uniform, cell, split, greedy=False, label=name)
        elif name == "single":
            roots = tree.roots
            out[name] = Scores(name, cell.name, split, list(tree.problem_ids), tree.correct[roots, 0].mean(1),
                               tree.tokens[roots, 0].mean(1).astype(float), cell.digest)
        else:
            out[name] = _played(make_protocol(name), cell, split, name)
    return out


def pick_protocol(validation: Mapping[str, Scores]) -> str:
    """The leaderboard's one rule: the protocol of ``PROTOCOL_ROWS`` with the highest validation accuracy (ties: the
    first listed). ``validation``: each protocol's scores on the validation split."""
    return max(PROTOCOL_ROWS, key=lambda name: (validation[name].accuracy.mean(), -PROTOCOL_ROWS.index(name)))


def best_protocol(cell: str | Cell) -> str:
    """The cell's protocol to beat, chosen on its validation split (``pick_protocol``)."""
    return pick_protocol(protocol_scores(cell, "validation", PROTOCOL_ROWS))


# ----------------------------------------------------------------------------- the row
@dataclass
class Report:
    """A leaderboard row: the runs' test scores against the best protocol's (chosen on validation)."""

    cell: str
    label: str
    runs: list[Scores]
    protocol: str
    protocol_scores: Scores
    level: float = 0.95
    extra: dict[str, Any] = field(default_factory=dict)
    digest: str | None = None
    """The set digest of the cell's set (``Cell.digest``): cite it with the cell."""
    departures: list[str] = field(default_factory=list)
    """Where the policies were not trained as the leaderboard trains (``trained_departures``): each printed."""

    @property
    def per_run(self) -> list[float]:
        return [float(run.accuracy.mean()) for run in self.runs]

    @property
    def accuracy(self) -> float:
        return float(np.mean(self.per_run))

    @property
    def iqm(self) -> float:
        """The interquartile mean of the runs' accuracies (rliable's aggregate; the mean below 4 runs)."""
        return interquartile_mean(self.per_run)

    @property
    def difference(self) -> tuple[float, float, float]:
        """Accuracy minus the protocol's, with its hierarchical bootstrap interval at ``level`` (runs, then paired
        problems)."""
        runs = np.stack([run.accuracy for run in self.runs])
        return hierarchical_bootstrap([runs, self.protocol_scores.accuracy], [1.0, -1.0], level=self.level)

    @property
    def tokens(self) -> float:
        return float(np.mean([run.tokens.mean() for run in self.runs]))

    def __str__(self) -> str:
        diff, low, high = self.difference
        runs = ", ".join(f"{a:.3f}" for a in self.per_run)
        return (f"{self.label} on {self.cell} (test, {len(self.runs[0].problem_ids)} problems, {len(self.runs)} "
                f"run(s)): accuracy {self.accuracy:.3f} (IQM {self.iqm:.3f}; runs {runs}), {self.tokens:,.0f} tokens "
                f"per problem; vs {self.protocol} ({self.protocol_scores.accuracy.mean():.3f}, the best protocol on "
                f"validation): {100 * diff:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] points "
                f"({100 * self.level:g}% interval over runs and problems); set digest {self.digest}, "
                f"deliberation-env {package_version()}"
                + "".join(f"\n  departure: {line}" for line in self.departures))

    def save(self, folder: str | os.PathLike[str]) -> str:
        """Every run's per-problem scores (``run<k>.csv``), the protocol's, and ``row.json``."""
        os.makedirs(folder, exist_ok=True)
        for k, run in enumerate(self.runs):
            run.save(os.path.join(folder, f"run{k}.csv"))
        self.protocol_scores.save(os.path.join(folder, f"protocol-{self.protocol}.csv"))
        diff, low, high = self.difference
        row = {"cell": self.cell, "label": self.label, "accuracy": self.accuracy, "iqm": self.iqm,
               "per_run": self.per_run, "tokens": self.tokens, "protocol": self.protocol,
               "protocol_accuracy": float(self.protocol_scores.accuracy.mean()), "difference": diff,
               "low": low, "high": high, "level": self.level, "set_digest": self.digest,
               "package_version": package_version(), "departures": self.departures, **self.extra}
        path = os.path.join(folder, "row.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(row, f, indent=1)
        return path


def score(policies: Any, cell: str | Cell, *, greedy: bool = True, label: str = "policy",
          level: float = 0.95) -> Report:
    """The leaderboard row of ``policies`` (one policy, a list of training runs' policies, or their test ``Scores``)
    on ``cell``: exact test scores against the best protocol chosen on validation (module docstring)."""
    cell = parse_cell(cell)
    many = policies if isinstance(policies, (list, tuple)) else [policies]
    if not many:
        raise ValueError("score() needs at least one policy")
    resolved = [p if isinstance(p, Scores) else resolve(p) for p in many]
    departed = [line for p in resolved if not isinstance(p, Scores) for line in trained_departures(p, cell)]
    runs = [p if isinstance(p, Scores) else policy_scores(p, cell, "test", greedy=greedy, label=label) for p in resolved]
    if any(run.split != "test" or run.cell != cell.name for run in runs):
        raise ValueError(f"every Scores given must be of {cell.name}'s test split")
    other = next((run for run in runs if run.digest not in (None, cell.digest)), None)
    if other is not None:
        raise ValueError(f"Scores {other.label!r} were computed on set digest {other.digest}, {cell.name} here is "
                         f"{cell.digest}: another version of the set; score every run on the same set")
    protocol = best_protocol(cell)
    reference = protocol_scores(cell, "test", (protocol,))[protocol]
    return Report(cell.name, label, runs, protocol, reference, level, digest=cell.digest,
                  departures=list(dict.fromkeys(departed)))


def trained_departures(policy: Any, cell: Cell) -> list[str]:
    """How ``policy`` was trained unlike the leaderboard's runs on ``cell``, from what its checkpoint records
    (``baselines.meta.policy.trained_game``): another set or set version, a split that holds validation or test
    problems (the protocol is chosen on validation, the row read on test), env options beyond the cell's game (another
    confidence source, fewer rounds). Empty for a policy that records nothing (a function, an actor)."""
    game = getattr(policy, "trained_on", None)
    if not game:
        return []
    out, name = [], loaded(cell.dataset).card.name
    if game.get("set") != name or game.get("digest") not in (None, cell.digest):
        out.append(f"trained on set {game.get('set')!r} (digest {game.get('digest')}), scored on {name!r} "
                   f"(digest {cell.digest}): another set, or another version of it")
    split = game.get("split")
    if split != "fit":
        holds = {"train": "the validation problems the protocol is chosen on", "validation": "the validation problems",
                 "test": "the test problems the row is read on"}.get(str(split), "problems other than fit's")
        out.append(f"trained on split {split!r}, which holds {holds}: the leaderboard trains on 'fit' "
                   "(--train-split fit)")
    options = {key: value for key, value in dict(game.get("env_options") or {}).items()
               if cell.options.get(key, _DEFAULTS.get(key)) != value}
    if options:
        out.append(f"trained with env options {options}, the cell's game is {cell.options}: another game")
    return out


_DEFAULTS: dict[str, Any] = {"features": "v1", "concede_to_peer": False}
"""The game options a run states even at their default (``baselines.meta.train.benchmark_cell`` reads them alike)."""


def package_version() -> str:
    """The version of ``deliberation_env`` that scored a row (cite it with the set digest)."""
    import deliberation_env

    return deliberation_env.__version__


def interquartile_mean(values: Sequence[float]) -> float:
    """The mean of the middle half of ``values`` (rliable's IQM; plain mean below 4 values)."""
    ordered = np.sort(np.asarray(values, float))
    if len(ordered) < 4:
        return float(ordered.mean())
    cut = len(ordered) // 4
    return float(ordered[cut:len(ordered) - cut].mean())


# ----------------------------------------------------------------------------- what a policy may be
def _policy_probabilities(policy: Any, cell: Cell, greedy: bool) -> Any:
    from baselines.meta.policy import agent_layout
    from baselines.meta.tree_rollout import policy_probabilities

    layout = agent_layout(cell.env("test"))
    if policy.layout != layout:
        raise ValueError(f"the policy was trained on another observation than {cell.name}'s ({policy.layout.obs_dim} "
                         f"inputs and {policy.layout.num_actions} actions, the cell has {layout.obs_dim} and "
                         f"{layout.num_actions}): score it on the cell of its game")
    return policy_probabilities(policy.eval(), layout, greedy)


def _played(actor: Any, cell: Cell, split: str, label: str) -> Scores:
    """Each problem of the split played once (reset seed 0) by ``actor`` through the cell's env."""
    from baselines.evaluation.evaluate import play_episodes

    env = cell.env(split)
    records = play_episodes([env], [actor], [(0, p) for p in range(len(env.problems))])
    return Scores(label, cell.name, split, [p.id for p in env.problems],
                  np.array([float(r["correct"]) for r in records]), np.array([float(r["tokens"]) for r in records]),
                  cell.digest)


# ----------------------------------------------------------------------------- command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m baselines.benchmark", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    scoring = commands.add_parser("score", help="a policy's leaderboard row on a cell")
    scoring.add_argument("policies", nargs="+", help="policy.pt checkpoints or 'module:name' specs (several: runs)")
    scoring.add_argument("--cell", required=True, help="'<set>:<game>', e.g. qwen05-arith-v2:v2")
    scoring.add_argument("--stochastic", action="store_true", help="score the policies' exact expectation, not greedy")
    scoring.add_argument("--label", default="policy")
    scoring.add_argument("--out", help="a folder for the per-problem outcomes and row.json")
    commands.add_parser("cells", help="every shipped cell")
    args = parser.parse_args(argv)
    if args.command == "cells":
        for cell in shipped_cells():
            print(describe(cell))
        return 0
    try:
        report = score(list(args.policies), args.cell, greedy=not args.stochastic, label=args.label)
    except (ValueError, FileNotFoundError) as error:
        print(f"python -m baselines.benchmark: error: {error}", file=sys.stderr)
        return 2
    print(report)
    if args.out:
        print(f"saved {report.save(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
