"""What each lever makes learnable: the headroom table across replay sets, concede-target rules and feature sets.

    python bench/studies/headroom.py                                   # every shipped set, train and test trees pooled
    python bench/studies/headroom.py --sets qwen05-arith-v2 runs/my-set --splits train --repeats 20

For each set x concede rule x feature set, on the recorded 1-round trees of ``--splits`` (pooled):

| column | what |
|---|---|
| vote / debate | every agent PERSISTs / REFINEs |
| best protocol | the best fixed joint action, chosen on the training folds (cross-validated), among every joint action or among those where every agent plays the same action (vote, debate, ...): which of the two, each training fold chooses by an inner cross-validation on its own problems |
| policy | the best shared decentralised policy over each agent's round-0 view (peers agreeing x one signal of the feature set split at its median; under ``chosen``, also which of its two peers has the higher value), signal, threshold and policy chosen on the training folds (cross-validated; sd over fold splits); under v3, which shows each agent its role, one such policy per role |
| policy - protocol | what learning adds over the best fixed protocol, with a paired bootstrap 95% interval over problems (each problem's held-out outcome averaged over the fold splits, which both share) |
| ceiling | the same with correctness as the signal (privileged: its own; under ``chosen``, also which peer is right), one policy per role where the team has several |
| oracle | the best joint action per problem |

Rules: ``most_confident`` and ``plurality`` (the peer CONCEDE adopts), ``chosen`` (``concede_to_peer=True``:
CONCEDE names its peer). A rule a set was not recorded for is listed as such. Under ``chosen`` the policy space
(5 actions, 12 states) and the per-role spaces beyond 20,000 policies are searched by coordinate ascent, a lower bound of their best. Then, per set, how well each
verifier signal separates right round-0 answers from wrong ones (AUROC, bootstrap 95% interval over problems).
Writes bench/results/headroom.md and headroom.csv.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # run by its path: the repository root, for `bench`

from bench.common.results import RESULTS
from bench.common.trees import best_constant, feature_columns, headroom, pool_trees, role_groups, tree_of
from deliberation_env.analysis.metrics import clustered_auroc, paired_bootstrap
from deliberation_env.cli import ArgumentParser
from deliberation_env.core import features
from deliberation_env.replay import ReplayError, ReplaySet, shipped

RULES = {"most_confident": {"concede_target": "most_confident"}, "plurality": {"concede_target": "plurality"},
         "chosen": {"concede_to_peer": True}}
FEATURE_SETS = ("agreement alone", "v1", "v2", "v3")
VERIFIERS = ("confidence", "answer_prob", "code", "equations_valid", "tool_ran", "tool_agrees")
"""Signals of a right answer whose AUROC the report gives (v3 row columns; ``confidence`` is the set's source)."""


def signals_of(tree: dict, feature_set: str) -> dict:
    """The signals a policy may split on under a feature set: none (agreement alone is always observed) and the
    set's columns that vary in the tree."""
    return {"none": None, **({} if feature_set == "agreement alone" else feature_columns(tree, feature_set))}


def program_rules(tree: dict, program: int) -> dict[str, np.ndarray]:
    """Per problem, whether the consensus is right under two fixed rules of the chosen-target game that a policy
    seeing roles and its peers' tool columns can play: where the program-aided agent ``program``'s program printed
    an answer, it PERSISTs and every other agent CONCEDEs to it; elsewhere every agent PERSISTs (vote) or REFINEs
    (debate)."""
    joints, agents = [tuple(j) for j in tree["joints"]], tree["joints"].shape[1]
    printed = tree["rows"][:, program, features.feature_names("v3").index("tool_ran")] > 0
    # agent a sees its peers in the order a+1, a+2, ... (cyclic); CONCEDE to peer k is action 3 + k
    to_program = tuple(0 if a == program else 3 + (program - a - 1) % agents for a in range(agents))
    rules = {}
    for otherwise, action in (("vote", 0), ("debate", 1)):
        fallback = joints.index((action,) * agents)
        rules[f"the program's answer where it printed, else the {otherwise}"] = np.where(
            printed, tree["outcome"][:, joints.index(to_program)], tree["outcome"][:, fallback])
    return rules


def rows_of(name: str, splits: list[str], repeats: int) -> tuple[list[dict], dict | None, list[str], list[dict]]:
    """The table rows of one set, its tree under the default rule (for the signal table), notes, and the fixed
    program rules' rows (a set with one program-aided agent, under chosen targets)."""
    dataset = ReplaySet(name)
    rows, notes, default_tree, rules = [], [], None, []
    tools = [(role or {}).get("tool") for role in dataset.card.settings.get("roles") or []]
    for rule, options in RULES.items():
        try:
            tree = pool_trees([tree_of(dataset, split, **options) for split in splits])
        except ReplayError as error:
            notes.append(f"`{name}`, {rule}: not recorded ({str(error).replace(f' ({dataset.path})', '')})")
            continue
        default_tree = default_tree if default_tree is not None else tree
        joints = [tuple(j) for j in tree["joints"]]
        agents = tree["joints"].shape[1]
        # On a few hundred problems, picking the best of every joint action on the training folds overfits (held
        # out it fell 2-4 points below debate on 256 problems), so each training fold also chooses, by an inner
        # cross-validation, between that and the joint actions every agent plays alike.
        protocol = best_constant(tree, repeats=repeats, nested=True)
        base = {"set": name, "rule": rule, "problems": len(tree["outcome"]),
                "vote": tree["outcome"][:, joints.index((0,) * agents)].mean(),
                "debate": tree["outcome"][:, joints.index((1,) * agents)].mean(),
                "protocol": protocol["cross_validated"], "oracle": tree["outcome"].any(1).mean()}
        roles = role_groups(tree)
        roles = roles if roles.max() > 0 else None  # a team of one role: one shared policy
        ceiling = headroom(tree, {"correct": tree["correct0"] * 1.0}, peer_bit=rule == "chosen",
                           repeats=repeats, groups=roles)["cross_validated"]
        if rule == "chosen" and tools.count("python") == 1:
            for label, right in program_rules(tree, tools.index("python")).items():
                _, low, high = paired_bootstrap(right * 1.0, protocol["per_problem"])
                rules.append({"set": name, "rule": label, "accuracy": right.mean(), "protocol": protocol["cross_validated"],
                              "gain_low": low, "gain_high": high})
        previous = None
        for feature_set in FEATURE_SETS:
            signals = signals_of(tree, feature_set)
            groups = roles if feature_set == "v3" else None  # v3 shows each agent its role: one policy per role
            if groups is not None:
                signals = {signal: column for signal, column in signals.items() if not signal.startswith("role_")}
            elif previous is not None and signals.keys() == previous:
                rows.append({**base, "features": feature_set, "same_as_previous": True})
                continue
            previous = signals.keys()
            room = headroom(tree, signals, peer_bit=rule == "chosen", repeats=repeats, groups=groups)
            _, low, high = paired_bootstrap(room["per_problem"], protocol["per_problem"])  # same fold splits
            rows.append({**base, "features": feature_set, "policy": room["cross_validated"], "sd": room["cv_std"],
                         "gain_low": low, "gain_high": high,
                         "in_sample": room["in_sample"], "chosen": room["chosen"], "ceiling": ceiling})
            print(f"{name} {rule} {feature_set}: policy {room['cross_validated']:.3f}", flush=True)
    return rows, default_tree, notes, rules


def verifier_table(tree: dict, resamples: int = 1000, seed: int = 0) -> list[tuple[str, float, float, float, int]]:
    """(signal, AUROC, low, high, agents) for round-0 answers' correctness, bootstrap over problems."""
    names = features.feature_names("v3")
    right, rng = tree["correct0"], np.random.default_rng(seed)
    table = []
    for signal in VERIFIERS:
        values = tree["confidence"] if signal == "confidence" else tree["rows"][:, :, names.index(signal)]
        if np.ptp(values) == 0:
            continue
        value, low, high = clustered_auroc(list(zip(values, right)), resamples, rng)
        table.append((signal, value, low, high, values.size))
    ran = tree["rows"][:, :, names.index("tool_ran")] > 0
    if ran.any():  # the external check where it applies: a tool's verdict is 0 where no program ran, as well
        agrees = tree["rows"][:, :, names.index("tool_agrees")]
        value, low, high = clustered_auroc([(a[r], c[r]) for a, c, r in zip(agrees, right, ran)], resamples, rng)
        table.append(("tool_agrees where the tool ran", value, low, high, int(ran.sum())))
    return table


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=shipped(), help="replay sets: shipped names, folders or hf://")
    parser.add_argument("--splits", nargs="+", default=["train", "test"], help="splits whose trees are pooled")
    parser.add_argument("--repeats", type=int, default=10, help="cross-validation fold splits per cell")
    parser.add_argument("--out", default=os.path.join(RESULTS, "headroom"))
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows, notes, verifiers, rules = [], [], {}, []
    for name in args.sets:
        found, tree, said, fixed = rows_of(name, args.splits, args.repeats)
        rows += found
        notes += said
        rules += fixed
        if tree is not None:
            verifiers[name] = verifier_table(tree)
    report(args, rows, notes, verifiers, rules, time.perf_counter() - started)


def report(args, rows: list[dict], notes: list[str], verifiers: dict, rules: list[dict], seconds: float) -> None:
    lines = ["# Headroom: what each lever makes learnable", "",
             f"`python bench/studies/headroom.py --sets {' '.join(args.sets)} --splits {' '.join(args.splits)} "
             f"--repeats {args.repeats}` ({seconds / 60:.1f} min). Trees of splits {', '.join(args.splits)} pooled; "
             f"cross-validated columns: 5 folds, mean over {args.repeats} fold splits (sd: over those splits). "
             "The best protocol is a fixed joint action chosen on the training folds, among every joint action or "
             "among those every agent plays alike (vote, debate, ...): which of the two, each training fold chooses "
             "by an inner cross-validation on its own problems. "
             "Policy - protocol is what learning adds over it, with a paired bootstrap 95% "
             "interval over problems (each problem's held-out outcomes averaged over the fold splits, which policy "
             "and protocol share); ceiling - policy is what no observation of this feature set reaches.", "",
             "| set | problems | rule | features | vote | debate | best protocol | policy (sd) | policy - protocol "
             "[95%, problems] | ceiling | oracle | signals chosen |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    csv = ["set,rule,features,problems,vote,debate,protocol,policy,sd,gain_low,gain_high,ceiling,oracle"]
    for row in rows:
        head = f"| {row['set']} | {row['problems']} | {row['rule']} | {row['features']} | {row['vote']:.3f} | " \
               f"{row['debate']:.3f} | {row['protocol']:.3f} |"
        if row.get("same_as_previous"):
            lines.append(f"{head} as the row above (no new varying column) | | | | |")
            continue
        chosen = ", ".join(f"{k} ({v})" for k, v in row["chosen"])
        lines.append(f"{head} {row['policy']:.3f} ({row['sd']:.3f}) | {row['policy'] - row['protocol']:+.3f} "
                     f"[{row['gain_low']:+.3f}, {row['gain_high']:+.3f}] | {row['ceiling']:.3f} | {row['oracle']:.3f} | "
                     f"{chosen} |")
        csv.append(",".join(str(row[k]) if isinstance(row[k], str) else f"{row[k]:.4f}" for k in
                            ("set", "rule", "features", "problems", "vote", "debate", "protocol", "policy", "sd",
                             "gain_low", "gain_high", "ceiling", "oracle")))
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    if rules:
        lines += ["", "Two fixed rules of the chosen-target game for a team with a program-aided agent, nothing "
                  "fitted (the second falls back on debate where the first falls back on the vote): what a policy "
                  "that sees roles and its peers' tool columns can play. Interval: paired bootstrap 95% over "
                  "problems against the best protocol's held-out outcomes.", "",
                  "| set | rule | accuracy | - best protocol [95%, problems] |", "|---|---|---|---|"]
        for rule in rules:
            lines.append(f"| {rule['set']} | {rule['rule']} | {rule['accuracy']:.3f} | "
                         f"{rule['accuracy'] - rule['protocol']:+.3f} [{rule['gain_low']:+.3f}, {rule['gain_high']:+.3f}] |")
    lines += ["", "AUROC of each verifier signal for 'this agent's round-0 answer is right' (bootstrap 95% interval "
              "resampling problems; 0.5: no signal); the set's confidence source is the self-critic.", "",
              "| set | signal | AUROC [95% CI] | answers |", "|---|---|---|---|"]
    for name, table in verifiers.items():
        for signal, value, low, high, count in table:
            lines.append(f"| {name} | {signal} | {value:.3f} [{low:.3f}, {high:.3f}] | {count} |")
    text = "\n".join(lines) + "\n"
    with open(f"{args.out}.md", "w", encoding="utf-8") as f:
        f.write(text)
    with open(f"{args.out}.csv", "w", encoding="utf-8") as f:
        f.write("\n".join(csv) + "\n")
    print(text)


if __name__ == "__main__":
    main()
