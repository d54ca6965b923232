"""Train a meta-policy from the command line, then compare it with the fixed protocols.

    python -m baselines.meta.train --algo softrankpo --task arithmetic --backend sim
    python -m baselines.meta.train --algo grpo --episodes 4000 --seed 1 --out runs/grpo1 --reward-scale 10
    python -m baselines.meta.train --algo ppo --help          # every field of that algorithm's config

    python -m baselines.meta.train --algo sft --backend transformers --model smollm2 --cache runs/smol.sqlite
    python -m baselines.meta.train --backend openai --base-url http://127.0.0.1:8000/v1 --model NAME --max-tokens 256
    python -m baselines.meta.train --algo grpo --num-workers 4 [--ray-address HEAD:6379]   # rollouts in Ray actors

Algorithms: softrankpo (SFT stage, then SoftRankPO), grpo, ppo (+ --centralized-critic for
MAPPO), magrpo, sft, and every trainer registered in ``baselines.meta.trainers``. Writes <out>/metrics.jsonl, metrics.csv, tb/ (TensorBoard) and
<out>/policy.pt (``baselines.meta.policy.load_policy``); then, unless --no-evaluate, evaluates the
policy (and the SFT stage's) against the fixed protocols on the test split and saves
<out>/eval/table.md, table.csv and PNG plots.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from baselines.meta.config import BaseConfig, build_backend, env_kwargs, make_env_fn
from baselines.meta.policy import Policy, load_checkpoint, trained_game
from baselines.meta.trainers import trainer, trainers
from deliberation_env.cli import (
    BACKEND_FLAGS,
    ArgumentParser,
    add_backend_arguments,
    add_config_arguments,
    cache_report,
    config_from_args,
    report_user_errors,
    user_input,
)

PROG = "python -m baselines.meta.train"



@dataclass
class EvalOptions:
    """What the CLI does after training."""

    evaluate: bool = True
    """Evaluate the trained policy against the fixed protocols on the test split afterwards."""
    eval_problems: int = 200
    """Test problems (problem_index 0..P-1) per evaluation seed."""
    eval_seeds: int = 2
    """Evaluation seeds 0..n-1 (confidence intervals are across these)."""
    trace: str | None = None
    """Append one JSON line per evaluation episode to this file (deliberation_env.analysis.traces), labelled with the entry."""

    def validate(self) -> None:
        """Raise ValueError on counts below 1."""
        if self.eval_problems < 1 or self.eval_seeds < 1:
            raise ValueError(f"eval_problems and eval_seeds must be >= 1, got {self.eval_problems}, {self.eval_seeds}")


def config_class(algo: str) -> type:
    """The config dataclass of a registered trainer (``baselines.meta.trainers``); ValueError for unknown names."""
    return trainer(algo).config


def run(algo: str, cfg: BaseConfig, env_fn: Callable[[], Any] | None = None) -> Policy:
    """Train ``algo`` with ``cfg`` (validated) on ``env_fn`` (default: the deliberation env of cfg)."""
    declared = trainer(algo)
    cfg.validate()
    return declared.train(cfg, env_fn)


def __getattr__(name: str) -> Any:
    if name == "ALGORITHMS":  # its old table of module paths: now every registered trainer, plugins included
        return tuple(trainers())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_parser(algo: str) -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=sorted(trainers()), default="softrankpo",
                        help="training algorithm (default: softrankpo); --help after --algo X lists X's fields")
    add_config_arguments(parser.add_argument_group(f"{algo} config"), config_class(algo), skip=BACKEND_FLAGS)
    add_backend_arguments(parser.add_argument_group("LLM backend (one backend object shared by every env)"))
    add_config_arguments(parser.add_argument_group("after training"), EvalOptions)
    return parser


def evaluate_run(algo: str, cfg: BaseConfig, out: str, options: EvalOptions, backend: Any = None) -> str:
    """Evaluate ``<out>/policy.pt`` (and ``<out>/sft/policy.pt``) and the fixed protocols on the test split with
    the training env's settings (agents, rounds, token cost, sampling; ``single`` keeps one agent); save the
    table and plots under ``<out>/eval``. ``backend``: the backend object to share (default: the config's)."""
    from baselines.evaluation import evaluate
    from baselines.meta.evaluate import standard_entries
    from deliberation_env.protocols import PROTOCOLS, plays_team

    checkpoints = {}
    if os.path.exists(os.path.join(out, "sft", "policy.pt")):
        checkpoints["sft"] = os.path.join(out, "sft", "policy.pt")
    checkpoints[algo] = os.path.join(out, "policy.pt")
    backend = backend if backend is not None else build_backend(cfg)
    kwargs = {**env_kwargs(cfg, "test", backend), "backend": backend}
    # A replay set is recorded with its agents: a protocol that declares another team (single: one agent) would ask
    # for other requests (single is the first agent's round-0 answer there; bench/benchmark/replay_benchmark.py reports
    # it from the tree).
    protocols = [p for p in PROTOCOLS if not cfg.replay or plays_team(p, kwargs["num_agents"])]
    trace = evaluate.open_trace(options.trace)
    try:
        entries = standard_entries(checkpoints, protocols, kwargs, threads=cfg.threads, trace=trace)
        rows = evaluate.evaluate_entries(entries, options.eval_problems, list(range(options.eval_seeds)),
                                         batch_size=cfg.num_envs, cache=backend if cfg.cache else None)
    finally:
        if trace is not None:
            trace.close()
    table = evaluate.save_table(rows, os.path.join(out, "eval"))
    if cfg.cache:
        table += "\n\n" + evaluate.cache_line(rows, backend)
    evaluate.plot_accuracy_vs_tokens(rows, os.path.join(out, "eval", "accuracy_vs_tokens.png"))
    runs = {algo: out, **({"sft": os.path.join(out, "sft")} if "sft" in checkpoints and algo != "sft" else {})}
    evaluate.plot_learning_curves({algo: out} if algo == "sft" else runs, os.path.join(out, "eval", "learning_curves.png"))
    return table


@report_user_errors(PROG)
def main(argv: Sequence[str] | None = None) -> Policy:
    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--algo", default="softrankpo")
    algo = pre.parse_known_args(argv)[0].algo
    if algo not in trainers():
        build_parser("softrankpo").parse_args(argv)  # argparse reports the invalid choice and exits
    parser = build_parser(algo)
    args = parser.parse_args(argv)
    cfg = config_from_args(config_class(algo), args)
    options = config_from_args(EvalOptions, args)
    if not cfg.out:
        cfg = replace(cfg, out=os.path.join("runs", f"{algo}-seed{cfg.seed}"))
    try:
        cfg.validate()
        options.validate()
        if cfg.num_workers:
            from baselines.meta.distributed import require_ray

            require_ray()
    except (ValueError, ImportError) as error:
        parser.error(str(error))
    for name in ("init", "reference", "sft_init"):  # checkpoints to start from: a missing one fails now
        if getattr(cfg, name, None):
            with user_input(f"--{name.replace('_', '-')}"):
                load_checkpoint(getattr(cfg, name))
    if cfg.num_workers:
        from baselines.meta.distributed import connect

        with user_input(f"--ray-address {cfg.ray_address}" if cfg.ray_address else "starting a local Ray instance"):
            connect(cfg.ray_address)
    with user_input():
        backend = build_backend(cfg)
        env_fn = make_env_fn(cfg, cfg.train_split, backend)
        train_env = env_fn()  # an unknown task, missing data or a bad env option fails here, in one line
        if cfg.replay:
            print(replay_line(train_env, cfg))
            if benchmark_cell(cfg) is None:
                print(f"No leaderboard row: {no_cell_reason(cfg)}")
        if options.evaluate:
            from baselines.evaluation.evaluate import check_problem_count

            test_env = make_env_fn(cfg, "test", backend)()
            if cfg.replay:  # every recorded test problem, once per recorded stream (more seeds replay the same episodes)
                streams = test_env.config.streams or 1
                options = replace(options, eval_problems=len(test_env.problems),
                                  eval_seeds=min(options.eval_seeds, streams))
            check_problem_count(test_env, options.eval_problems)
            if options.trace:
                open(options.trace, "a").close()  # a trace file that cannot be written fails now, not after training
        os.makedirs(cfg.out, exist_ok=True)
    start = time.time()
    policy = run(algo, cfg, env_fn)
    policy.trained_on = trained_game(asdict(cfg))
    print(f"trained {algo} in {time.time() - start:.0f}s -> {os.path.join(cfg.out, 'policy.pt')}")
    if cfg.cache:
        print(cache_report(backend))
    if options.evaluate:
        start = time.time()
        table = evaluate_run(algo, cfg, cfg.out, options, backend)
        print(f"\nTest split, {options.eval_problems} problems x {options.eval_seeds} seeds "
              f"(mean over all episodes, 95% per-problem bootstrap intervals; evaluated in {time.time() - start:.0f}s):\n{table}")
        print(f"saved {os.path.join(cfg.out, 'eval')}/table.md, table.csv, accuracy_vs_tokens.png, learning_curves.png")
        if cfg.replay and (cell := benchmark_cell(cfg)) is not None:
            from baselines.benchmark import score

            report = score(policy, cell, label=algo)
            report.save(os.path.join(cfg.out, "benchmark"))
            print(f"\nThe leaderboard's row (docs/benchmark.md):\n{report}")
    close = getattr(backend, "close", None)
    if callable(close):
        close()
    return policy


def replay_line(env: Any, cfg: BaseConfig) -> str:
    """The set a replay run plays, by name and digest, and each departure of its game from the set's recording."""
    from deliberation_env.replay import departures
    from deliberation_env.replay.backend import replay_backend

    replay = next(r for r in map(replay_backend, env.backends) if r is not None)
    departed = departures(replay.set.card, env.config, extensions=False)
    line = f"replay set {replay.set.identity} (name#digest: cite it with results)"
    return line + "".join(f"\ndeparture from the recording: {item}" for item in departed)


def no_cell_reason(cfg: BaseConfig) -> str:
    """Why a replay run's env options are no benchmark cell (``benchmark_cell`` gave None)."""
    from baselines.benchmark import GAMES

    games = "; ".join(f"{game}: {options}" for game, options in GAMES.items())
    return (f"--env-option {cfg.env_options} plays no benchmark game: a cell is the recording's settings with one "
            f"game's options ({games}), and any other option (another confidence source, fewer rounds, ...) is "
            "another game; train with a game's options to get the row")


def benchmark_cell(cfg: BaseConfig) -> str | None:
    """The benchmark cell (``baselines.benchmark.GAMES``) a replay run plays, or None when its env options are
    another game."""
    from baselines.benchmark import GAMES

    options = {"features": "v1", "concede_to_peer": False, **cfg.env_options}
    for game, settings in GAMES.items():
        if options == {"concede_to_peer": False, **settings}:
            return f"{cfg.replay}:{game}"
    return None


if __name__ == "__main__":
    main()
