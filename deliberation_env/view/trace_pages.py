"""The pages of a trace file's view: an index of the problems the policies played, and one page per problem with
its question and gold answer (where the trace's task can be built here) and each policy's episodes side by side
(every round: each agent's action, the acting policy's action probabilities where the trace records them, answer,
confidence and text)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from deliberation_env.analysis.traces import ACTIONS, AgentRound, Episode
from deliberation_env.protocols import PROTOCOLS
from deliberation_env.tasks.base import Problem
from deliberation_env.view.episodes import Policy, ProblemKey, plays_options
from deliberation_env.view.markup import (
    RIGHT_WRONG,
    Value,
    answer_chip,
    esc,
    fraction_chip,
    listing,
    nav_bar,
    ordering,
    page,
    percent,
    question_panel,
    search_box,
    select,
    table,
    text_block,
)

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


def probabilities_part(agent: AgentRound) -> str:
    """The acting policy's probability of each action index (P, R, C, then C→k: CONCEDE to peer k)."""
    if agent.probabilities is None:
        return ""
    names = [name[0] for name in ACTIONS] + [f"C→{k + 1}" for k in range(len(agent.probabilities) - len(ACTIONS))]
    shown = " ".join(f"{name} {p:.2f}" for name, p in zip(names, agent.probabilities))
    spelled = ", ".join(f"{name} {p:.4f}" for name, p in zip([*ACTIONS, *names[len(ACTIONS):]], agent.probabilities))
    return f" <span class=\"prob\" title=\"the policy's probabilities: {esc(spelled)}\">{esc(shown)}</span>"


def episode_block(episode: Episode) -> str:
    """An episode as played: per round, each agent's action (with the policy's action probabilities where the trace
    has them), answer and confidence, its text where it changed."""
    rows, texts = [], []
    for index, round_ in enumerate(episode.rounds):
        cells = [f"round {round_.index}"]
        for agent_index, agent in enumerate(round_.agents):
            action = "solve" if agent.action is None else agent.action
            cells.append(f"<span class=\"act {ACTION_SHORT.get(action, '')}\">{esc(action)}</span>"
                         f"{probabilities_part(agent)} {answer_chip(agent.answer, agent.correct)} "
                         f"<span class=\"n\">{agent.confidence:.2f}</span>")
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


def references_of(policies: Sequence[Policy]) -> dict[int, dict[str, str]]:
    """Per policy, the labels its first-round choices are compared with (tag -> label): the labels that name a
    fixed protocol, or, where none does, every other label."""
    protocols = [p.label for p in policies if p.label in PROTOCOLS]
    return {n: {other: other for other in (protocols or [p.label for p in policies]) if other != policy.label}
            for n, policy in enumerate(policies)}


def trace_values(key: ProblemKey, policies: Sequence[Policy], references: Mapping[int, Mapping[str, str]]
                 ) -> dict[str, Value]:
    """A problem's value of each filter of the trace index."""
    rights = [policy.right(key) for policy in policies]
    known = [r for r in rights if r is not None]
    choices = [tuple(policy.joints(key)) for policy in policies if policy.joints(key)]
    values: dict[str, Value] = {"split": key[0], "differ": str(int(len({r >= 0.5 for r in known}) > 1)),
                                "choices": str(int(len(set(choices)) > 1))}
    by_label = {policy.label: policy.joints(key) for policy in policies}
    for n, (policy, right) in enumerate(zip(policies, rights)):
        values[f"policy{n}"] = "" if right is None else str(int(right >= 0.5))
        values[f"plays{n}"] = policy.plays(key, {tag: by_label[label] for tag, label in references[n].items()})
    return values


def trace_listing(keys: Sequence[ProblemKey], policies: Sequence[Policy],
                  problems: Mapping[ProblemKey, Problem | None]) -> str:
    """The trace site's ``data.js``."""
    references = references_of(policies)
    rows = []
    for number, key in enumerate(keys):
        problem = problems.get(key)
        search = " ".join([key[0], key[1], *([problem.question, problem.answer] if problem else [])])
        order: dict[str, Any] = {"order": number, "id": key[1]}
        order.update({f"policy{n}": policy.right(key) for n, policy in enumerate(policies)})
        rows.append((trace_file(number), search, trace_values(key, policies, references), order))
    filters = [key for key, _, _ in trace_filter_specs(keys, policies)]
    return listing(rows, filters, trace_sorts(policies), trace_groups(policies),
                   [(f"policy{n}", p.label) for n, p in enumerate(policies)])


def trace_filter_specs(keys: Sequence[ProblemKey], policies: Sequence[Policy]
                       ) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """The trace index's filters: (key, label, options); ``trace_values`` gives each problem's value of every key."""
    references = references_of(policies)
    return [("split", "split", [(s, s) for s in sorted({split for split, _ in keys})]),
            ("differ", "policies", [("1", "disagree on right/wrong"), ("0", "agree")]),
            ("choices", "first-round choices", [("1", "differ between policies"), ("0", "alike")]),
            *((f"policy{n}", p.label, RIGHT_WRONG) for n, p in enumerate(policies)),
            *((f"plays{n}", f"{p.label}'s first-round choice", plays_options(references[n]))
              for n, p in enumerate(policies))]


def trace_sorts(policies: Sequence[Policy]) -> list[tuple[str, str]]:
    return [("order", "order of the traces"), ("id", "problem id"),
            *((f"policy{n}", f"{p.label}: share right") for n, p in enumerate(policies))]


def trace_groups(policies: Sequence[Policy]) -> list[tuple[str, str]]:
    return [("split", "split"), ("differ", "right/wrong"), ("choices", "first-round choices"),
            *((f"policy{n}", p.label) for n, p in enumerate(policies))]


def trace_index_page(title: str, keys: Sequence[ProblemKey], policies: Sequence[Policy],
                     problems: Mapping[ProblemKey, Problem | None]) -> str:
    """Every problem some policy played, each policy's share of right episodes, and filters."""
    header = ["problem", "split", "question", "gold", *(p.label for p in policies), "first-round actions"]
    rows, attrs = [], []
    for number, key in enumerate(keys):
        choices = []
        for policy in policies:
            shown = ", ".join("-".join(ACTIONS[a] for a in joint) for joint in policy.joints(key))
            choices.append(f"{esc(policy.label)}: {esc(shown or '-')}")
        problem = problems.get(key)
        rows.append([f"<a href=\"{trace_file(number)}\">{esc(key[1])}</a>", esc(key[0]),
                     f"<span class=\"clamp\">{esc(problem.question)}</span>" if problem else "-",
                     esc(problem.answer) if problem else "-",
                     *(fraction_chip(policy.right(key)) for policy in policies), "<br>".join(choices)])
        attrs.append({"data-n": str(number)})
    episodes = [e for p in policies for es in p.episodes.values() for e in es]
    figures = table(["policy", "problems played", "episodes", "accuracy"], [
        [esc(p.label), str(len(p.episodes)), str(sum(len(e) for e in p.episodes.values())),
         percent(sum(e.rounds[-1].consensus_correct for es in p.episodes.values() for e in es)
                 / max(1, sum(len(e) for e in p.episodes.values())))] for p in policies], "figures")
    with_probabilities = sum(any(a.probabilities is not None for r in e.rounds for a in r.agents) for e in episodes)
    controls = [*(select(key, label, options) for key, label, options in trace_filter_specs(keys, policies)),
                search_box("search"), ordering(trace_sorts(policies), trace_groups(policies))]
    sorts = {0: "order", **{4 + n: f"policy{n}" for n in range(len(policies))}}
    body = [f"<header><h1>{esc(title)}</h1><p class=\"sub\">Episode traces: each policy's episodes on the same "
            "problems, side by side.</p></header>",
            f"<section class=\"panel\"><h2>Policies</h2>{figures}<p class=\"note\">{with_probabilities} of "
            f"{len(episodes)} episodes record the acting policy's action probabilities (shown with each action on "
            "a problem's page); what a run recorded with an episode (its <code>extra</code>) is shown there too."
            "</p></section>",
            f"<section class=\"panel filters\" id=\"filters\"><h2>Problems</h2>{''.join(controls)}"
            "<p class=\"count\" id=\"count\"></p></section>", table(header, rows, "problems", attrs, sorts)]
    return page(title, "\n".join(body))


def trace_problem_page(title: str, key: ProblemKey, number: int, total: int, policies: Sequence[Policy],
                       problem: Problem | None) -> str:
    """One problem: its question and gold answer (``problem``: None where the trace's task cannot be built here),
    and each policy's episodes side by side."""
    previous = trace_file(number - 1) if number > 0 else None
    following = trace_file(number + 1) if number + 1 < total else None
    played = [(policy.label, policy.episodes.get(key, [])) for policy in policies]
    episode = next(e for _, episodes in played for e in episodes)
    question = question_panel(problem.question, problem.answer) if problem is not None else (
        f"<p class=\"note\" id=\"question\">The question and gold answer are not shown: the trace's task "
        f"{esc(episode.task)} {esc(json.dumps(episode.task_settings))} cannot be built here (its data is missing).</p>")
    body = [nav_bar(number, previous, following),
            f"<header><h1>{esc(key[1])}</h1><p class=\"sub\">{esc(title)} · split {esc(key[0])}</p></header>",
            question, episodes_side_by_side(played)]
    return page(f"{title}: {key[1]}", "\n".join(body), root="../")
