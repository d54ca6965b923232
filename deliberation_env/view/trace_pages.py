"""The pages of a trace file's view: an index of the problems the policies played, and one page per problem with
each policy's episodes side by side (every round: each agent's action, answer, confidence and text)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from deliberation_env.analysis.traces import ACTIONS, Episode
from deliberation_env.view.episodes import Policy, ProblemKey
from deliberation_env.view.markup import answer_chip, esc, fraction_chip, page, percent, select, table, text_block

ACTION_SHORT = {"PERSIST": "persist", "REFINE": "refine", "CONCEDE": "concede"}


def trace_file(number: int) -> str:
    return f"problems/trace-{number:05d}.html"


def episodes_side_by_side(played: Sequence[tuple[str, Sequence[Episode]]]) -> str:
    """One column per policy label, each with its episodes on the problem."""
    columns = []
    for label, episodes in played:
        shown = "".join(episode_block(e) for e in episodes) or "<p class=\"n\">did not play this problem</p>"
        columns.append(f"<div class=\"policy\" data-label=\"{esc(label)}\"><h3>{esc(label)}</h3>{shown}</div>")
    return f"<div class=\"side\">{''.join(columns)}</div>"


def episode_block(episode: Episode) -> str:
    """An episode as played: per round, each agent's action, answer and confidence, its text where it changed."""
    rows, texts = [], []
    for index, round_ in enumerate(episode.rounds):
        cells = [f"round {round_.index}"]
        for agent_index, agent in enumerate(round_.agents):
            action = "solve" if agent.action is None else agent.action
            cells.append(f"<span class=\"act {ACTION_SHORT.get(action, '')}\">{esc(action)}</span> "
                         f"{answer_chip(agent.answer, agent.correct)} <span class=\"n\">{agent.confidence:.2f}</span>")
            before = episode.rounds[index - 1].agents[agent_index].text if index else None
            if agent.text != before:
                texts.append(text_block(f"round {round_.index}, agent {agent_index}: {action.lower()}", agent.text))
        cells.append(answer_chip(round_.consensus, round_.consensus_correct))
        rows.append(cells)
    header = ["", *(f"agent {i}" for i in range(episode.num_agents)), "consensus"]
    extra = text_block("recorded with the episode (extra)", json.dumps(episode.extra, indent=1), kind="code") \
        if episode.extra else ""
    return (f"<div class=\"episode\"><p class=\"n\">seed {episode.seed} · {esc(episode.split)} · "
            f"{esc(episode.problem_id)}</p>{table(header, rows, 'rounds')}{''.join(texts)}{extra}</div>")


def trace_index_page(title: str, keys: Sequence[ProblemKey], policies: Sequence[Policy]) -> str:
    """Every problem some policy played, each policy's share of right episodes, and filters."""
    splits = sorted({split for split, _ in keys})
    header = ["problem", "split", *(p.label for p in policies), "first-round actions"]
    rows, attrs = [], []
    for number, key in enumerate(keys):
        rights = [policy.right(key) for policy in policies]
        choices = []
        for policy in policies:
            joints = policy.joints(key)
            shown = ", ".join("-".join(ACTIONS[a] for a in joint) for joint in joints)
            choices.append(f"{esc(policy.label)}: {esc(shown or '-')}")
        rows.append([f"<a href=\"{trace_file(number)}\">{esc(key[1])}</a>", esc(key[0]),
                     *(fraction_chip(r) for r in rights), "<br>".join(choices)])
        known = [r for r in rights if r is not None]
        data = {"data-split": key[0],
                "data-differ": str(int(len({r >= 0.5 for r in known}) > 1))}
        data.update({f"data-policy{n}": "" if r is None else str(int(r >= 0.5)) for n, r in enumerate(rights)})
        attrs.append(data)
    figures = table(["policy", "problems played", "episodes", "accuracy"], [
        [esc(p.label), str(len(p.episodes)), str(sum(len(e) for e in p.episodes.values())),
         percent(sum(e.rounds[-1].consensus_correct for es in p.episodes.values() for e in es)
                 / max(1, sum(len(e) for e in p.episodes.values())))] for p in policies], "figures")
    right_wrong = [("1", "right"), ("0", "wrong")]
    controls = [select("split", "split", [(s, s) for s in splits]),
                select("differ", "policies", [("1", "disagree on right/wrong"), ("0", "agree")]),
                *(select(f"policy{n}", p.label, right_wrong) for n, p in enumerate(policies)),
                "<label>problem id <input type=\"search\" id=\"search\" placeholder=\"contains...\"></label>"]
    body = [f"<header><h1>{esc(title)}</h1><p class=\"sub\">Episode traces: each policy's episodes on the same "
            "problems, side by side.</p></header>",
            f"<section class=\"panel\"><h2>Policies</h2>{figures}<p class=\"note\">Traces carry no action "
            "probabilities; what a run recorded with an episode (its <code>extra</code>) is shown on its page."
            "</p></section>",
            f"<section class=\"panel filters\" id=\"filters\"><h2>Problems</h2>{''.join(controls)}"
            "<p class=\"count\" id=\"count\"></p></section>", table(header, rows, "problems", attrs)]
    return page(title, "\n".join(body))


def trace_problem_page(title: str, key: ProblemKey, number: int, total: int, policies: Sequence[Policy]) -> str:
    links = ["<a href=\"../index.html\">all problems</a>"]
    links += [f"<a href=\"../{trace_file(number - 1)}\" rel=\"prev\">previous</a>"] if number > 0 else []
    links += [f"<a href=\"../{trace_file(number + 1)}\" rel=\"next\">next</a>"] if number + 1 < total else []
    played = [(policy.label, policy.episodes.get(key, [])) for policy in policies]
    body = [f"<nav>{' · '.join(links)}</nav>",
            f"<header><h1>{esc(key[1])}</h1><p class=\"sub\">{esc(title)} · split {esc(key[0])}</p></header>",
            episodes_side_by_side(played)]
    return page(f"{title}: {key[1]}", "\n".join(body), root="../")
