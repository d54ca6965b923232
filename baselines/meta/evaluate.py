"""Evaluate learned meta-policy checkpoints and fixed protocols side by side on a fixed test set (the CLI).

Every entry plays test problems ``problem_index = 0..P-1`` with episode seed
``seed * 100003 + index`` for each evaluation seed (the seeding of ``bench/studies/protocols.py``).
Reported per entry: accuracy (final consensus correct, ``infos["consensus_correct"]``; for
environments without it, the mean per-agent episode return as ``score``), tokens per problem
(sum of ``infos["tokens"]``), meta-action shares, each as the mean over all episodes; accuracy, score and
tokens with a 95% per-problem bootstrap interval (``baselines.evaluation.evaluate``). Learned policies act greedily
unless ``--sample``.

    python -m baselines.meta.evaluate --checkpoints sft=runs/x/sft/policy.pt softrankpo=runs/x/policy.pt \\
        --protocols all --problems 200 --seeds 0 1 --out runs/x/eval --metrics runs/x
    python -m baselines.meta.evaluate --replay qwen05-arith-v2 --protocols all --problems 400 --seeds 0

With ``--replay SET`` (or ``--backend replay --backend-option dataset=SET``) the entries play the set's recorded game:
its task, prompts, agents, rounds, confidence source and sampling settings. A flag the set cannot serve is refused;
one it can serve differently (fewer ``--max-rounds``, another recorded ``--env-option confidence=...``) is named in
the line above the table. ``--protocols all`` leaves out ``single`` there (a set is recorded with its agents).
"""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

import torch

from baselines.evaluation.evaluate import (
    Actor,
    cache_line,
    check_problem_count,
    evaluate_entries,
    open_trace,
    plot_accuracy_vs_tokens,
    plot_learning_curves,
    save_table,
)
from baselines.meta.config import BaseConfig, token_weights
from baselines.meta.policy import Policy, load_checkpoint, load_policy
from baselines.runtime import policy_threads
from deliberation_env.backends.transformers import torch_threads
from deliberation_env.cli import (
    TEAM_FLAGS,
    ArgumentParser,
    add_backend_arguments,
    add_config_arguments,
    add_env_arguments,
    backend_settings,
    env_arguments,
    env_options,
    nonnegative_int,
    positive_int,
    report_user_errors,
    user_input,
)
from deliberation_env.protocols import PROTOCOLS, make_protocol, plays_team, protocol_agents
from deliberation_env.replay import ReplayBackend, departures
from deliberation_env.replay.backend import replay_backend


class PolicyActor:
    """A learned policy behind the protocol interface ``reset(seed)`` / ``act(obs, infos)``.

    Forward passes run on ``threads`` torch threads (default: one for a small network, see
    ``baselines.runtime.policy_threads``); the process's own setting is restored after each."""

    def __init__(self, policy: Policy, deterministic: bool = True, threads: int | None = None):
        self.policy, self.deterministic = policy, deterministic
        self.generator = torch.Generator().manual_seed(0)
        self.threads = policy_threads(policy, threads)

    def reset(self, seed: int | None = None) -> None:
        if seed is not None:
            self.generator.manual_seed(seed)

    def act(self, observations: dict[str, Any], infos: dict[str, Any]) -> dict[str, int]:
        with torch_threads(self.threads):
            return self.policy.act(observations, self.deterministic, self.generator)


def standard_entries(checkpoints: dict[str, str], protocols: Sequence[str], env_kwargs: dict[str, Any],
                     deterministic: bool = True, threads: int | None = None,
                     trace: Any = None) -> list[tuple[str, Callable[[], Actor], Callable[[], Any]]]:
    """Entries for learned checkpoints and named protocols on deliberation_env: policies play with the number
    of agents they were trained for, protocols with ``env_kwargs``'s (``single`` with one agent). Checkpoints
    are loaded here, once (a missing file fails now); ``threads``: see ``PolicyActor``. ``trace``: a
    ``deliberation_env.analysis.traces.TraceWriter`` every entry's envs write their episodes to, labelled with the
    entry's name (the caller closes it)."""
    import deliberation_env

    def env_for(name: str, agents: int | None = None):
        kwargs = dict(env_kwargs)
        if agents is not None:
            kwargs["num_agents"] = agents
        if trace is not None:
            kwargs.update(trace=trace, trace_label=name)
        return lambda: deliberation_env.parallel_env(**kwargs)

    entries: list[tuple[str, Callable[[], Actor], Callable[[], Any]]] = []
    for name, path in checkpoints.items():
        policy = load_policy(path)
        agents = policy.layout.num_peers + 1
        entries.append((name, functools.partial(PolicyActor, policy, deterministic, threads), env_for(name, agents)))
    for proto in protocols:
        entries.append((proto, functools.partial(make_protocol, proto), env_for(proto, protocol_agents(proto))))
    return entries


def replay_header(env: Any) -> str:
    """For an env on a replay set: the line above the table naming the set and whether the env plays its recorded
    game or where it departs from it (fewer rounds, another recorded confidence source); else ""."""
    replay = next((r for r in map(replay_backend, env.backends) if r is not None), None)
    if replay is None:
        return ""
    card, differs = replay.set.card, departures(replay.set.card, env.config)
    game = f"departs from the recording: {', '.join(differs)}" if differs else "the recorded game"
    return f"Replay set {card.name!r} ({card.model}), split {env.split!r}: {game}."


def _named(items: Sequence[str]) -> dict[str, str]:
    named = {}
    for item in items:
        name, _, path = item.rpartition("=")
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        named[name or os.path.basename(os.path.normpath(folder)) or path] = path
    return named


def _check_paths(named: dict[str, str], what: str) -> None:
    for path in named.values():
        if not os.path.exists(path):
            raise FileNotFoundError(f"{what} {path!r} does not exist")


PROG = "python -m baselines.meta.evaluate"


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", nargs="*", default=[], help="[name=]path of policy.pt checkpoints")
    parser.add_argument("--protocols", nargs="*", default=["all"], help=f"fixed protocols: all, none or some of {PROTOCOLS}")
    parser.add_argument("--problems", type=positive_int, default=200, help="test problems 0..P-1 (default 200)")
    parser.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0, 1], help="evaluation seeds (default 0 1)")
    parser.add_argument("--replay", default=None, metavar="SET",
                        help="a replay set (shipped name, folder or hf://owner/name): play its recorded game (task, "
                             "prompts, agents, rounds, confidence, tokens) on the recorded model's answers; replaces "
                             "--backend. A flag that changes the game is refused or named above the table")
    parser.add_argument("--task", default=None, help="the task (default: arithmetic, or the replay set's)")
    parser.add_argument("--data-dir", default=None, help="benchmark data folder (default: $DELIBERATION_ENV_DATA)")
    parser.add_argument("--split", default="test")
    # not given: the env's defaults, or the replay set's; policies play their checkpoint's team, a protocol its own
    # when it declares one (single: 1)
    add_env_arguments(parser, TEAM_FLAGS)
    add_config_arguments(parser, BaseConfig, skip=[f.name for f in fields(BaseConfig) if f.name != "token_cost"])
    parser.add_argument("--num-envs", type=positive_int, default=32,
                        help="episodes played together, answered in one backend call per phase (default 32)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch threads of the policies' forward passes (default: 1 for small networks)")
    parser.add_argument("--sample", action="store_true", help="sample learned policies' actions instead of argmax")
    parser.add_argument("--metrics", nargs="*", default=[], help="[name=]run dir or metrics.jsonl for learning curves")
    parser.add_argument("--out", default="runs/eval", help="where table.md/.csv and the PNG plots go")
    parser.add_argument("--trace", default=None, metavar="FILE.jsonl",
                        help="append one JSON line per episode (deliberation_env.analysis.traces), labelled with the entry name")
    add_backend_arguments(parser.add_argument_group("LLM backend"))
    return parser


@report_user_errors(PROG)
def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    import deliberation_env

    parser = build_parser()
    args = parser.parse_args(argv)
    protocols = list(PROTOCOLS) if args.protocols == ["all"] else [p for p in args.protocols if p != "none"]
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        parser.error(f"unknown protocol(s) {unknown}; choose all, none or some of {list(PROTOCOLS)}")
    if not args.checkpoints and not protocols:
        parser.error("nothing to evaluate: give --checkpoints and/or --protocols")
    if args.replay and (args.backend != parser.get_default("backend") or args.model or args.base_url or args.cache):
        parser.error("--replay plays the set's recorded model: drop --backend, --model, --base-url and --cache")
    with user_input():
        checkpoints, metrics = _named(args.checkpoints), _named(args.metrics)
        _check_paths(metrics, "--metrics")
        backend = ReplayBackend(args.replay) if args.replay else backend_settings(args).build()
        env_kwargs = {"backend": backend, "split": args.split, "data_dir": args.data_dir,
                      **({"task": args.task} if args.task is not None else {}), **env_arguments(args, TEAM_FLAGS),
                      **token_weights(args.token_cost), **env_options(args)}
        env = deliberation_env.parallel_env(**env_kwargs)
        check_problem_count(env, args.problems)
        header = replay_header(env)
        if header and args.protocols == ["all"]:  # a set is recorded with its agents: single would play one
            protocols = [p for p in protocols if plays_team(p, env.config.num_agents)]
        for path in checkpoints.values():  # a missing or foreign checkpoint fails before anything is written
            load_checkpoint(path)
        os.makedirs(args.out, exist_ok=True)
        trace = open_trace(args.trace)
        entries = standard_entries(checkpoints, protocols, env_kwargs, deterministic=not args.sample,
                                   threads=args.threads, trace=trace)
    try:
        rows = evaluate_entries(entries, args.problems, args.seeds, batch_size=args.num_envs,
                                cache=backend if args.cache else None)
    finally:
        if trace is not None:
            trace.close()
    print(save_table(rows, args.out, header=header))
    if args.cache:
        print(cache_line(rows, backend))
    plot_accuracy_vs_tokens(rows, os.path.join(args.out, "accuracy_vs_tokens.png"))
    if metrics:
        plot_learning_curves(metrics, os.path.join(args.out, "learning_curves.png"))
    print(f"saved {args.out}/table.md, table.csv, accuracy_vs_tokens.png" + (", learning_curves.png" if metrics else "")
          + (f"; traces appended to {args.trace}" if args.trace else ""))
    close = getattr(backend, "close", None)
    if callable(close):
        close()
    return rows


if __name__ == "__main__":
    main()
