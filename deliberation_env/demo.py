"""Play a few deliberation episodes and print a transcript.

    python -m deliberation_env.demo                       # arithmetic task, sim backend
    python -m deliberation_env.demo --policy threshold --episodes 5 --show-text
    python -m deliberation_env.demo --task gsm8k --data-dir path/to/data
    python -m deliberation_env.demo --backend transformers --model smollm2 --max-tokens 128 --episodes 1
    python -m deliberation_env.demo --backend openai --base-url http://127.0.0.1:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import textwrap

import deliberation_env
from deliberation_env.cli import (
    OLD_TEAM_FLAGS,
    TEAM_FLAGS,
    ArgumentParser,
    add_backend_arguments,
    add_env_arguments,
    backend_settings,
    env_arguments,
    env_options,
    nonnegative_float,
    nonnegative_int,
    positive_int,
    report_user_errors,
    user_input,
)
from deliberation_env.protocols import PROTOCOLS, FixedProtocol, make_protocol

PROG = "python -m deliberation_env.demo"

POLICY_ALIASES = {"persist": "self_consistency", "refine": "debate"}
"""The demo's older policy names, still accepted: each names the fixed protocol it always was."""
POLICIES = (*PROTOCOLS, *POLICY_ALIASES)


def demo_protocol(policy: str, threshold: float) -> FixedProtocol:
    """The fixed protocol ``--policy`` names (``deliberation_env.protocols``; trainable ones live in ``baselines``)."""
    name = POLICY_ALIASES.get(policy, policy)
    return make_protocol(name, threshold=threshold)


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="arithmetic", help="task name (default: arithmetic)")
    parser.add_argument("--data-dir", default=None, help="benchmark data folder (else $DELIBERATION_ENV_DATA)")
    parser.add_argument("--episodes", type=positive_int, default=3)
    # --agents and --rounds are their old names, still accepted with a warning
    add_env_arguments(parser, TEAM_FLAGS, aliases=OLD_TEAM_FLAGS)
    parser.add_argument("--policy", choices=POLICIES, default="random", metavar="POLICY",
                        help=f"a fixed protocol: {', '.join(PROTOCOLS)} (persist and refine are older names of "
                             "self_consistency and debate; default: random)")
    parser.add_argument("--threshold", type=nonnegative_float, default=0.7, help="confidence threshold of --policy threshold")
    parser.add_argument("--seed", type=nonnegative_int, default=0)
    parser.add_argument("--show-text", action="store_true", help="print each agent's latest text")
    parser.add_argument("--trace", default=None, metavar="FILE.jsonl",
                        help="append one JSON line per episode (deliberation_env.analysis.traces), labelled with "
                             "the policy")
    add_backend_arguments(parser.add_argument_group("LLM backend"))
    return parser


@report_user_errors(PROG)
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)

    with user_input():
        env = deliberation_env.parallel_env(task=args.task, backend=backend_settings(args).build(),
                                            **env_arguments(args, TEAM_FLAGS), data_dir=args.data_dir,
                                            render_mode="ansi", **env_options(args),
                                            **({"trace": args.trace, "trace_label": args.policy} if args.trace else {}))
    protocol = demo_protocol(args.policy, args.threshold)
    solved, tokens = 0, 0
    for episode in range(args.episodes):
        observations, infos = env.reset(seed=args.seed + episode)
        protocol.reset(args.seed + episode)  # reseeds the random protocol
        print(f"\n=== episode {episode} ===")
        problem = env.deliberation.problem
        if problem is None:  # reset() draws the episode's problem
            raise RuntimeError("the env has no problem after reset()")
        print(textwrap.fill(problem.question, 100))
        print(env.render())
        episode_tokens = sum(info["tokens"] for info in infos.values())
        while env.agents:
            observations, rewards, _, _, infos = env.step(protocol.act(observations, infos))
            episode_tokens += sum(info["tokens"] for info in infos.values())
            print(env.render())
            print("  rewards: " + ", ".join(f"{agent}={reward:+.1f}" for agent, reward in rewards.items()))
        if args.show_text:
            for index, state in enumerate(env.deliberation.agents):
                print(f"--- agent_{index} text ---\n{state.text}")
        final = next(iter(infos.values()))
        solved += final["consensus_correct"]
        tokens += episode_tokens
        print(f"  final consensus {final['consensus']!r}: {'correct' if final['consensus_correct'] else 'wrong'}; "
              f"{episode_tokens} tokens")
    print(f"\n{solved}/{args.episodes} solved, {tokens / args.episodes:.0f} tokens per problem (policy: {args.policy})")
    env.close()


if __name__ == "__main__":
    main()
