"""Fit the simulator to real episode traces, and measure how faithful the fitted simulator is.

    python -m deliberation_env.analysis.calibrate TRACES.jsonl -o sim.json
    python -m deliberation_env.analysis.calibrate --compare HELDOUT.jsonl sim.json -o report/
    python -m deliberation_env.analysis.calibrate --replay qwen05-arith-v2 -o report/

The fit reads events off the traces (``deliberation_env.analysis.traces``) and estimates every
``SimConfig`` knob by the sim's own model of that event (``docs/calibration.md`` lists each
knob, its events and its estimator). A knob without enough events keeps its default, and the
output says so under ``calibration.defaults_kept``. ``--compare`` replays the held-out episodes
(same problems, episode seeds and protocols, named by the trace labels) on the fitted sim and
reports real vs sim (``deliberation_env.analysis.fidelity``). ``--replay`` does both on a replay set: it
plays the fixed protocols on the set's train split, fits the sim to those traces, and compares the
protocols on the test split, replayed vs simulated (``deliberation_env.analysis.compare``).

The fit itself lives in ``deliberation_env.analysis.sim_fit`` (its names are re-exported here).

This program is the one module of ``analysis`` above the env factories: its ``main`` hands
``deliberation_env.make.parallel_env`` to ``compare`` and ``replay_comparison``, which take the factory as an argument
(``make`` wraps envs in ``analysis.traces.TraceWrapper``, so the rest of analysis sits below it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from deliberation_env.analysis.sim_fit import (  # noqa: F401 - re-exported: the fit's public names
    MIN_EVENTS,
    CalibrationError,
    Events,
    extract_events,
    fit,
    refine_probabilities,
    traced_problem,
    traced_problems,
    write_config,
)
from deliberation_env.analysis.traces import TraceError, read_traces
from deliberation_env.backends.sim import SimConfig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deliberation_env.analysis.calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="?", help="a trace file (JSON lines) written with parallel_env(trace=...)")
    parser.add_argument("sim_config", nargs="?", help="with --compare: the fitted sim.json")
    parser.add_argument("-o", "--output", help="fit: the sim.json to write (default: print it); --compare, --replay: "
                        "the folder for the report (default: fidelity_report, replay_report)")
    parser.add_argument("--compare", action="store_true", help="replay the traces' protocols on the sim and compare")
    parser.add_argument("--replay", metavar="NAME_OR_PATH", help="a replay set: fit the sim on its train split, "
                        "compare the protocols on its test split, replayed vs simulated")
    parser.add_argument("--seeds", type=int, default=None, help="--replay: episode seeds per problem and protocol "
                        "(default 16)")
    parser.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                        help="hold a knob at this JSON value instead of fitting it (repeatable), e.g. problem_spread=0")
    args = parser.parse_args(argv)
    from deliberation_env.make import parallel_env  # the program picks the factory; the analysis below takes it

    try:
        from deliberation_env.analysis.compare import DEFAULT_SEEDS, parse_fixed

        fixed = parse_fixed(args.fix)
        if args.replay is not None:
            if args.traces is not None or args.compare:
                parser.error("--replay takes no trace file and no --compare: --replay NAME_OR_PATH -o OUTDIR")
            from deliberation_env.analysis.compare import replay_comparison

            report = replay_comparison(args.replay, args.output or "replay_report",
                                       DEFAULT_SEEDS if args.seeds is None else args.seeds, fixed,
                                       make_env=parallel_env)
            print(report, end="")
            return 0
        if args.seeds is not None:
            parser.error("--seeds goes with --replay")
        if args.traces is None:
            parser.error("give a trace file (TRACES.jsonl) or --replay NAME_OR_PATH")
        episodes = read_traces(args.traces)
        if args.compare:
            if args.sim_config is None:
                parser.error("--compare needs the sim config: --compare HELDOUT.jsonl sim.json")
            from deliberation_env.analysis.fidelity import compare

            print(compare(episodes, args.sim_config, Path(args.output or "fidelity_report"), parallel_env), end="")
            return 0
        if args.sim_config is not None:
            parser.error(f"unexpected argument {args.sim_config!r} (only --compare takes a sim config)")
        config, notes = fit(episodes, _fixed_base(fixed), fixed=tuple(fixed))
    except (TraceError, CalibrationError, FileNotFoundError, ValueError) as error:
        print(f"calibrate: error: {error}", file=sys.stderr)
        return 2
    if args.output:
        write_config(config, notes, args.output)
        print(f"wrote {args.output}")
    else:
        print(json.dumps({"config": asdict(config), "calibration": notes}, indent=2))
    for name, why in notes["defaults_kept"].items():
        print(f"kept the default {name} = {getattr(config, name)!r}: {why}", file=sys.stderr)
    for level, row in notes["agreement"].items():
        print(f"all agents right or all wrong, level {level}: observed {row['observed']:.3f}, fitted "
              f"{row['fitted']:.3f}, independent agents {row['independent']:.3f} ({row['episodes']} episodes)",
              file=sys.stderr)
    return 0


def _fixed_base(fixed: dict[str, Any]) -> SimConfig:
    from deliberation_env.backends.sim import load_sim_config

    return load_sim_config(fixed)


if __name__ == "__main__":
    sys.exit(main())
