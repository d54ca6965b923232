"""The pages of a replay set's view: the index of problems (card, headline figures, filters) and one page per
problem (round 0, each agent's moves, the grid of joint actions, the policies' episodes where traces are given)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from deliberation_env.core.tools import is_tool_kind
from deliberation_env.replay.dataset import ReplayCard
from deliberation_env.view.episodes import Policy, plays_options
from deliberation_env.view.markup import (
    RIGHT_WRONG,
    Value,
    answer_chip,
    definitions,
    esc,
    fraction_chip,
    listing,
    mark,
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
from deliberation_env.view.trace_pages import episodes_side_by_side
from deliberation_env.view.tree import PROTOCOLS, AgentView, Call, ProblemTree

PROTOCOL_TAGS = {"self_consistency": "SC", "debate": "DB", "threshold": "TH", "oracle": "OR"}
"""How the grid marks each protocol's joint action."""


def problem_file(tree: ProblemTree) -> str:
    """A problem page's path under the site's top folder."""
    return f"problems/{tree.split}-{tree.index:05d}.html"


def policy_tag(number: int) -> str:
    return f"P{number + 1}"


# ------------------------------------------------------------------------------------------------- index
def index_page(card: ReplayCard, trees: Sequence[ProblemTree], policies: Sequence[Policy], game: str,
               built: str) -> str:
    """The set's front page: its card, headline figures per split, and the filterable table of problems."""
    splits = sorted({tree.split for tree in trees})
    roles = card.settings.get("roles")
    team = ", ".join(r["name"] for r in roles) if roles else f"{card.settings.get('num_agents')} agents, one role"
    facts = definitions([
        ("model", esc(card.model)), ("task", esc(f"{card.task} {card.task_kwargs}")), ("team", esc(team)),
        ("rounds", esc(card.rounds)), ("concede targets recorded", esc(card.concede_targets)),
        ("problems recorded", esc(", ".join(f"{s}: {len(ids)}" for s, ids in sorted(card.splits.items())))),
        ("completions", esc(card.stats.get("completions", "-"))), ("grid", esc(game)), ("built", esc(built)),
    ])
    body = [f"<header><h1>{esc(card.name)}</h1><p class=\"sub\">A recorded deliberation tree: every problem, every "
            "agent's texts and every joint action of the first round.</p></header>",
            f"<section class=\"panel\"><h2>Card</h2>{facts}</section>",
            f"<section class=\"panel\"><h2>Headline figures</h2>{headline(trees, splits, policies)}"
            "<p class=\"note\">Accuracy of the final consensus on the problems built here. <em>joint oracle</em>: "
            "some joint action of the grid ends right. The oracle protocol sees correctness (an upper bound).</p>"
            "</section>",
            filters(trees, splits, policies), problem_table(trees, policies)]
    return page(f"{card.name}: deliberation view", "\n".join(body))


def headline(trees: Sequence[ProblemTree], splits: Sequence[str], policies: Sequence[Policy]) -> str:
    header = ["split", "problems", "single solutions", *PROTOCOLS, "joint oracle", *(p.label for p in policies)]
    rows = []
    for split in splits:
        chosen = [tree for tree in trees if tree.split == split]
        single = sum(v.correct for tree in chosen for v in tree.round0) / sum(len(tree.round0) for tree in chosen)
        row = [esc(split), str(len(chosen)), percent(single)]
        row += [percent(sum(tree.cell(tree.protocols[name]).correct for tree in chosen) / len(chosen))
                for name in PROTOCOLS]
        row.append(percent(sum(tree.right_cells > 0 for tree in chosen) / len(chosen)))
        for policy in policies:
            scores = [s for s in (policy.right((split, tree.id)) for tree in chosen) if s is not None]
            row.append(percent(sum(scores) / len(scores)) + f" <span class=\"n\">({len(scores)})</span>"
                       if scores else "-")
        rows.append(row)
    return table(header, rows, "figures")


def filter_specs(trees: Sequence[ProblemTree], splits: Sequence[str],
                 policies: Sequence[Policy]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """The index's filters: (key, label, options); ``row_values`` gives each problem's value of every key."""
    first = trees[0]
    levels = sorted({str(tree.level) for tree in trees if tree.level is not None})
    specs = [("split", "split", [(s, s) for s in splits]), ("level", "level", [(level, level) for level in levels]),
             ("distinct", "round-0 answers", [("1", "unanimous"), ("2", "two answers"), ("3", "three or more")]),
             ("vote", "vote", RIGHT_WRONG), ("debate", "debate", RIGHT_WRONG),
             ("oracle", "joint oracle", [("1", "some joint action right"), ("0", "none right")])]
    for i, agent in enumerate(first.agents):
        role = first.roles[i]
        specs.append((f"agent{i}", f"{agent}{f' ({role})' if role else ''} at round 0", RIGHT_WRONG))
    tags = {PROTOCOL_TAGS[name]: name for name in PROTOCOLS}
    for number, policy in enumerate(policies):
        specs.append((f"policy{number}", f"{policy_tag(number)} {policy.label}", RIGHT_WRONG))
        specs.append((f"plays{number}", f"{policy_tag(number)}'s first-round choice", plays_options(tags)))
    return specs


def row_values(tree: ProblemTree, policies: Sequence[Policy]) -> dict[str, Value]:
    """A problem's value of each filter of ``filter_specs`` ("" where it has none)."""
    key = (tree.split, tree.id)
    values: dict[str, Value] = {
        "split": tree.split, "level": "" if tree.level is None else str(tree.level),
        "distinct": str(min(tree.distinct_answers, 3)), "vote": str(int(tree.vote_correct)),
        "debate": str(int(tree.cell(tree.protocols["debate"]).correct)), "oracle": str(int(tree.right_cells > 0))}
    for i, view in enumerate(tree.round0):
        values[f"agent{i}"] = str(int(view.correct))
    references = {PROTOCOL_TAGS[name]: [tree.protocols[name]] for name in PROTOCOLS}
    for number, policy in enumerate(policies):
        right = policy.right(key)
        values[f"policy{number}"] = "" if right is None else str(int(right >= 0.5))
        values[f"plays{number}"] = policy.plays(key, references)
    return values


def sorts_and_groups(trees: Sequence[ProblemTree], policies: Sequence[Policy]) -> tuple[
        list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """The index's sort keys, the filters it groups by, and the right/wrong filters a group's heading shares."""
    agents = trees[0].agents
    sorts = [("order", "set order"), ("level", "level"), ("right", "right joint actions"),
             ("distinct", "round-0 answers"), ("tokens", "round-0 tokens"),
             *((f"policy{n}", f"{policy_tag(n)} {p.label}: share right") for n, p in enumerate(policies))]
    groups = [("split", "split"), ("level", "level"), ("distinct", "round-0 answers"), ("vote", "vote"),
              ("debate", "debate"), ("oracle", "joint oracle"),
              *((f"agent{i}", f"{agent} at round 0") for i, agent in enumerate(agents)),
              *((f"policy{n}", f"{policy_tag(n)} {p.label}") for n, p in enumerate(policies))]
    outcomes = [("vote", "vote"), ("debate", "debate"), ("oracle", "joint oracle"),
                *((f"policy{n}", policy_tag(n)) for n in range(len(policies)))]
    return sorts, groups, outcomes


def set_listing(trees: Sequence[ProblemTree], policies: Sequence[Policy]) -> str:
    """The site's ``data.js``: every problem's filter values, sort values and search text."""
    specs = filter_specs(trees, sorted({tree.split for tree in trees}), policies)
    sorts, groups, outcomes = sorts_and_groups(trees, policies)
    rows = []
    for n, tree in enumerate(trees):
        order: dict[str, Any] = {"order": n, "level": tree.level, "right": tree.right_cells,
                                 "distinct": tree.distinct_answers, "tokens": tree.tokens0}
        order.update({f"policy{number}": policy.right((tree.split, tree.id)) for number, policy in enumerate(policies)})
        search = " ".join(str(part) for part in (f"{tree.split} #{tree.index}", tree.id, tree.question, tree.gold,
                                                 *(view.answer for view in tree.round0), tree.vote))
        rows.append((problem_file(tree), search, row_values(tree, policies), order))
    return listing(rows, [key for key, _, _ in specs], sorts, groups, outcomes)


def filters(trees: Sequence[ProblemTree], splits: Sequence[str], policies: Sequence[Policy]) -> str:
    parts = [select(key, label, options) for key, label, options in filter_specs(trees, splits, policies)]
    sorts, groups, _ = sorts_and_groups(trees, policies)
    return (f"<section class=\"panel filters\" id=\"filters\"><h2>Problems</h2>{''.join(parts)}"
            f"{search_box('search')}{ordering(sorts, groups)}<p class=\"count\" id=\"count\"></p></section>")


def problem_table(trees: Sequence[ProblemTree], policies: Sequence[Policy]) -> str:
    first = trees[0]
    header = ["problem", "split", "level", "question", "gold", *(f"{a}" for a in first.agents), "vote", "debate",
              "right joint actions", "round-0 tokens", *(f"{policy_tag(n)} {p.label}" for n, p in enumerate(policies))]
    columns = len(header) - len(policies)
    sorts = {0: "order", 2: "level", columns - 2: "right", columns - 1: "tokens",
             **{columns + n: f"policy{n}" for n in range(len(policies))}}
    rows, attrs = [], []
    for n, tree in enumerate(trees):
        key = (tree.split, tree.id)
        debate = tree.cell(tree.protocols["debate"])
        row = [f"<a href=\"{problem_file(tree)}\">{esc(tree.split)} #{tree.index}</a>", esc(tree.split),
               esc(tree.level), f"<span class=\"clamp\">{esc(tree.question)}</span>", esc(tree.gold),
               *(answer_chip(v.answer, v.correct) for v in tree.round0), answer_chip(tree.vote, tree.vote_correct),
               answer_chip(debate.consensus, debate.correct), f"{tree.right_cells}/{len(tree.cells)}", str(tree.tokens0),
               *(fraction_chip(policy.right(key)) for policy in policies)]
        rows.append(row)
        attrs.append({"data-n": str(n)})
    return table(header, rows, "problems", attrs, sorts)


# ------------------------------------------------------------------------------------------------- problem
def problem_page(card: ReplayCard, tree: ProblemTree, policies: Sequence[Policy], number: int,
                 neighbours: tuple[str | None, str | None], tags: dict[str, str]) -> str:
    """One problem (``number``: its row in the index): the question, round 0 with every call's prompt and tokens,
    each agent's moves, the grid, and the policies' episodes."""
    meta = f"{esc(tree.split)} #{tree.index} · {esc(tree.id)}"
    meta += f" · level {esc(tree.level)}" if tree.level is not None else ""
    more = (f" · vote of round 0 {answer_chip(tree.vote, tree.vote_correct)} · {tree.right_cells} of "
            f"{len(tree.cells)} joint actions end right · round 0 spent {tree.tokens0} tokens")
    body = [nav_bar(number, *neighbours),
            f"<header><h1>{esc(card.name)}: {esc(tree.split)} #{tree.index}</h1><p class=\"sub\">{meta}</p></header>",
            question_panel(tree.question, tree.gold, more),
            "<h2>Round 0: each agent solves</h2>", round_zero(tree),
            "<h2>Round 1: what each move leads to</h2>", moves_table(tree),
            "<h2>Joint actions of round 1</h2>", grid(tree, policies, tags)]
    played = [(policy.label, policy.episodes.get((tree.split, tree.id), [])) for policy in policies]
    if any(episodes for _, episodes in played):
        body += ["<h2>As the policies played it</h2>", episodes_side_by_side(played)]
    return page(f"{card.name} {tree.split} #{tree.index}", "\n".join(body), root="../")


def agent_title(tree: ProblemTree, agent: int) -> str:
    role = tree.roles[agent]
    return f"{tree.agents[agent]}" + (f" · {role}" if role else "")


def round_zero(tree: ProblemTree) -> str:
    cards = []
    for i, view in enumerate(tree.round0):
        target = tree.concede_targets[i]
        target_view = tree.round0[tree.agents.index(target)] if target is not None else None
        items = [("answer", answer_chip(view.answer, view.correct)),
                 ("confidence", f"{view.confidence:.2f} <span class=\"n\">({esc(view.confidence_source)})</span>")]
        if view.critic is not None:
            items.append(("critic's verdict", f"<q class=\"verdict\">{esc(view.critic)}</q>"))
        items.append(("CONCEDE adopts", "nobody (every peer agrees)" if target_view is None else
                      f"{esc(target)}'s {answer_chip(target_view.answer, target_view.correct)}"))
        items.append(("oracle plays", esc(tree.action_label(i, tree.oracle_actions[i]))))
        solution = text_block("solution", view.text, open_=True)
        cards.append(f"<article class=\"agent {mark(view.correct)}\" data-agent=\"{i}\"><h3>{esc(agent_title(tree, i))}"
                     f"</h3>{definitions(items)}{solution}{tool_part(view)}{calls_part(view.calls)}</article>")
    return f"<div class=\"agents\">{''.join(cards)}</div>"


def tool_part(view: AgentView) -> str:
    """The program an agent's tool ran and what it printed."""
    if view.program is None:
        return ""
    verdict = ("printed an answer that agrees with the text" if view.tool_agrees else
               "printed an answer the text does not state" if view.tool_ran else "printed no answer")
    output = "(no run recorded)" if view.output is None else view.output
    program = text_block("program", view.program, kind="code")
    return (f"<div class=\"tool\"><p class=\"n\">program: {verdict}</p>{program}"
            f"{text_block('its output', output, open_=True, kind='code')}</div>")


def calls_part(calls: Sequence[Call]) -> str:
    """The calls that made a state, each with its tokens and, opened, the prompt it was shown (a program's run is
    no model call: its prompt is the program shown above, and it costs no tokens)."""
    if not calls:
        return ""
    parts = []
    for call in calls:
        if is_tool_kind(call.kind):
            parts.append(f"<p class=\"call n\">{esc(call.kind)}: the program above, no tokens</p>")
            continue
        messages = "".join(f"<p class=\"role\">{esc(m.role)}</p><pre>{esc(m.content)}</pre>" for m in call.messages)
        parts.append(f"<details class=\"call\" data-kind=\"{esc(call.kind)}\"><summary>{esc(call.kind)} prompt: "
                     f"<span class=\"tokens\">{call.prompt_tokens} + {call.completion_tokens}</span> tokens</summary>"
                     f"<div class=\"messages\">{messages}</div></details>")
    total = sum(call.prompt_tokens + call.completion_tokens for call in calls)
    return f"<div class=\"calls\"><p class=\"n\">calls: {total} tokens (prompt + completion)</p>{''.join(parts)}</div>"


def moves_table(tree: ProblemTree) -> str:
    actions = tree.num_actions
    names = ["PERSIST", "REFINE", "CONCEDE (rule's peer)"] + [f"CONCEDE to peer {k + 1}" for k in range(actions - 3)]
    header = ["agent", *names]
    rows = []
    for i in range(len(tree.agents)):
        row = [esc(agent_title(tree, i))]
        for action in range(actions):
            after = tree.moves[i].get(action)
            if after is None:
                row.append("<span class=\"n\">masked (played as PERSIST)</span>")
                continue
            parts = [answer_chip(after.answer, after.correct), f"<span class=\"n\">conf {after.confidence:.2f}</span>"]
            if after.target is not None:
                parts.insert(0, f"<span class=\"n\">adopts {esc(after.target)}'s</span>")
            if action == 1:
                parts.append(text_block("refined text", after.text))
                parts.append(tool_part(after))
            if after.critic is not None:
                parts.append(f"<p class=\"n\">critic's verdict <q class=\"verdict\">{esc(after.critic)}</q></p>")
            parts.append(calls_part(after.calls))
            row.append(" ".join(parts))
        rows.append(row)
    return table(header, rows, "moves")


def grid(tree: ProblemTree, policies: Sequence[Policy], tags: dict[str, str]) -> str:
    """Every joint action of round 1 as small tables: one per action of the first N-2 agents, rows the
    second-to-last agent's action, columns the last agent's; each cell coloured by its consensus."""
    marks: dict[tuple[int, ...], list[str]] = {}
    for name in PROTOCOLS:
        marks.setdefault(tree.protocols[name], []).append(PROTOCOL_TAGS[name])
    for number, policy in enumerate(policies):
        for joint in policy.joints((tree.split, tree.id)):
            marks.setdefault(joint, []).append(policy_tag(number))
    count, actions = len(tree.agents), tree.num_actions
    rows_agent, cols_agent = max(count - 2, 0), count - 1
    tables = []
    for prefix in itertools.product(range(actions), repeat=max(count - 2, 0)):
        caption = ", ".join(f"{tree.agents[i]} {tree.action_label(i, a)}" for i, a in enumerate(prefix))
        head = "".join(f"<th>{esc(tree.action_label(cols_agent, a))}</th>" for a in range(actions))
        body = []
        for row_action in range(actions) if count > 1 else [None]:
            cells = []
            for col_action in range(actions):
                joint = (*prefix, *(() if row_action is None else (row_action,)), col_action)
                cells.append(grid_cell(tree, joint, marks.get(joint, [])))
            label = "" if row_action is None else f"<th>{esc(tree.action_label(rows_agent, row_action))}</th>"
            body.append(f"<tr>{label}{''.join(cells)}</tr>")
        corner = f"<th class=\"corner\">{esc(tree.agents[rows_agent])} ↓ {esc(tree.agents[cols_agent])} →</th>" \
            if count > 1 else ""
        tables.append(f"<table class=\"grid\"><caption>{esc(caption)}</caption><thead><tr>{corner}{head}</tr></thead>"
                      f"<tbody>{''.join(body)}</tbody></table>")
    legend = " · ".join(f"<b>{esc(tag)}</b> {esc(name)}" for tag, name in tags.items())
    return (f"<div class=\"grids\" id=\"grid\">{''.join(tables)}</div><p class=\"legend\"><span class=\"chip right\">"
            "right</span> <span class=\"chip wrong\">wrong</span> final consensus; <span class=\"chip masked\">"
            f"hatched</span> a masked CONCEDE, played as PERSIST. Marks: {legend}</p>")


def grid_cell(tree: ProblemTree, joint: tuple[int, ...], tags: list[str]) -> str:
    cell = tree.cell(joint)
    title = "; ".join(f"{tree.agents[i]} {played} -> {answer}" for i, (played, answer)
                      in enumerate(zip(cell.played, cell.answers)))
    title += f"; consensus {cell.consensus} ({'right' if cell.correct else 'wrong'}); {cell.tokens} tokens"
    classes = " ".join(filter(None, ["cell", mark(cell.correct), "masked" if cell.masked else ""]))
    badges = "".join(f"<span class=\"tag\">{esc(tag)}</span>" for tag in tags)
    answer = "none" if cell.consensus is None else cell.consensus
    return (f"<td class=\"{classes}\" title=\"{esc(title)}\" data-joint=\"{'-'.join(map(str, joint))}\">"
            f"<span class=\"consensus\">{esc(answer)}</span>{badges}</td>")


def legend_tags(policies: Sequence[Policy]) -> dict[str, str]:
    """The grid's marks and what they stand for."""
    tags = {PROTOCOL_TAGS[name]: name for name in PROTOCOLS}
    tags.update({policy_tag(n): policy.label for n, policy in enumerate(policies)})
    return tags
