"""The human dataset card (README.md) of a replay set, written from its ``card.json``."""

from __future__ import annotations

import json

from deliberation_env.replay.dataset import ReplayCard

_TARGETS = {"rule": "the `concede_target` rule's peer only", "all": "every peer holding another answer (any rule)"}


def hub_configs(card: ReplayCard) -> list[str]:
    """The README's YAML header: the hub viewer's and ``datasets.load_dataset``'s two configs, one split each."""
    lines = ["---", "configs:"]
    for config, pattern in (("completions", "chunks/{}-*.parquet"), ("problems", "problems/{}.parquet")):
        lines += [f"- config_name: {config}", *(["  default: true"] if config == "completions" else []),
                  "  data_files:"]
        for split in card.splits:
            lines += [f"  - split: {split}", f"    path: {pattern.format(split)}"]
    return [*lines, "---", ""]


def accuracy_table(stats: dict) -> list[str]:
    """The README's round-0 accuracy: of each agent's answer as the env grades it (a program-aided agent's: its
    program's output), per level, and per role for a team with roles; the solve texts' for a card without it."""
    if "round0_accuracy" not in stats:
        return ["Round-0 accuracy of single solutions, per level:", "", "| level | solves | accuracy |", "|---|---|---|",
                *[f"| {level} | {row['solves']} | {row['accuracy']:.3f} |"
                  for level, row in stats.get("solve_accuracy_by_level", {}).items()]]
    team = stats["round0_accuracy"]["team"]
    tallies = [team, *stats["round0_accuracy"].get("roles", {}).values()]
    names = ["team", *(f"role `{name}`" for name in stats["round0_accuracy"].get("roles", {}))]

    def row(label: str, cells: list[dict]) -> str:
        return f"| {label} | " + " | ".join(f"{cell['accuracy']:.3f} ({cell['answers']})" for cell in cells) + " |"

    return ["Round-0 accuracy of the agents' answers as the env grades them (a program-aided agent's answer is its "
            "program's output where it printed one), and the number of answers (problems x streams x agents):", "",
            f"| level | {' | '.join(names)} |", "|---" * (1 + len(names)) + "|",
            *[row(level, [tally["by_level"][level] for tally in tallies]) for level in team["by_level"]],
            row("all", tallies)]


def reproducibility_text(stated: dict) -> str:
    """The card's sentence on whether the recording engine gives a request's completion again."""
    if not stated:
        return ("Not measured for this set: do not assume that sending a recorded request again returns the recorded "
                "completion (recording again makes a new set).")
    verdict = {True: "The recording engine reproduces a completion from its request.",
               False: "The recording engine does not reproduce a completion from its request: recording again makes a "
                      "new set (another sample of the model), not a copy.",
               None: "Whether the recording engine reproduces a completion from its request is not known."}
    return f"{verdict[stated.get('reproduces')]} {stated.get('summary', '')} ({stated.get('measured', 'unmeasured')})"


def card_markdown(card: ReplayCard) -> str:
    stats = card.stats
    weights = card.weights
    hashed = (f"`{weights.get('file')}`, sha256 `{weights['sha256']}`, {weights.get('bytes', 0):,} bytes, from "
              f"{weights.get('source') or 'an unnamed source'} ({weights.get('license') or 'license not given'})"
              if weights.get("sha256") else f"not hashed: {weights.get('reason', 'not recorded')}")
    lines = [
        *hub_configs(card),
        f"# Replay set `{card.name}`",
        "",
        "A real model's whole deliberation tree, recorded once with `deliberation_env` "
        "(format: docs/replay.md of the project). Each row of `chunks/*.parquet` is one completion; "
        "`problems/<split>.parquet` holds each problem's question, gold answer, level and solve prompt.",
        "",
        "| | |",
        "|---|---|",
        f"| model | `{card.model}` |",
        f"| weights | {hashed} |",
        f"| backend | `{card.backend}` |",
        f"| library versions | {', '.join(f'{k} {v}' for k, v in card.versions.items()) or 'not recorded'} |",
        f"| task | `{card.task}` with `{json.dumps(card.task_kwargs)}` (prompt fingerprint `{card.prompt_fingerprint}`) |",
        f"| env settings | `{json.dumps(card.settings)}`, {card.rounds} round(s) |",
        f"| sampling | `{json.dumps({k: v for k, v in card.sampling.items() if not isinstance(v, str)})}` |",
        f"| confidence sources | {', '.join(card.confidence_sources)} (replay default: {card.confidence}) |",
        f"| streams | {card.streams} per problem (an episode seed picks stream `seed % {card.streams}`) |",
        f"| coverage | {stats.get('coverage', '')}{' (partial)' if card.partial else ''} |",
        f"| concede targets | {_TARGETS[card.concede_targets]} |",
        f"| problems | {', '.join(f'{split}: {len(ids)}' for split, ids in card.splits.items())} |",
        f"| completions | {stats.get('completions', 0):,} ({stats.get('bytes', 0) / 1e6:.1f} MB compressed) |",
        f"| unique requests per problem, by round | {stats.get('requests_per_problem', {})} |",
        f"| tokens per problem (prompt + completion) | {stats.get('tokens_per_problem', 0):,} |",
        f"| recording time | {stats.get('recording_seconds', 0) / 3600:.2f} h |",
        f"| request format | {card.request_format} ({card.format}) |",
        "",
        *accuracy_table(stats),
    ]
    lines += ["", "## Reproducibility", "", reproducibility_text(card.reproducibility)]
    foreign = {name: entry["model"] for name, entry in card.files.items() if entry.get("model", card.model) != card.model}
    if card.notes or foreign:
        lines += ["", "## Known limits", "", *[f"- {note}" for note in card.notes],
                  *[f"- `{name}` holds completions of another model, `{model}`, written back by a replay fallback."
                    for name, model in foreign.items()]]
    lines += ["", "Problem ids per split are in `card.json` (`splits`). Made with:", ""]
    lines += [f"    {command}" for command in card.commands]
    return "\n".join(lines) + "\n"
