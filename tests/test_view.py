"""deliberation_env.view: the walk of a recorded tree is the env's own outcomes and keeps every call's prompt and
tokens, the pages hold the recorded texts (escaped, bidi controls written out), traces mark their policies (and
record the probabilities a policy exposes), and the command line reports mistakes in one line. The browser checks
are in tests/test_view_browser.py."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from deliberation_env.analysis.traces import ACTIONS, PolicyActions, TraceError, read_traces
from deliberation_env.backends.sim import SimBackend
from deliberation_env.make import replay_env
from deliberation_env.protocols import make_protocol
from deliberation_env.record import main as record
from deliberation_env.registry import BACKENDS
from deliberation_env.replay import ReplaySet
from deliberation_env.replay.card import load_card, write_card
from deliberation_env.vector import Start, run_episodes
from deliberation_env.view.__main__ import main as view_main
from deliberation_env.view.episodes import load_policies
from deliberation_env.view.markup import esc, show_controls
from deliberation_env.view.site import build_set_site, build_trace_site
from deliberation_env.view.tree import walk_split

INJECTED = "<script>document.title = 'pwned'</script><img src=x onerror=\"document.body.dataset.pwned = 'yes'\"> "
"""Markup a completion may hold (no digits, so the answer extracted after it is the sim's own)."""
REVERSED = "\u202eABC DEF"
"""A right-to-left override (U+202E) and the text it would reverse: agent 1 opens every solution with it."""
VERDICT = "\u202eGHI JKL"
"""The same in agent 1's critic verdicts (after the confidence line)."""
LONG = "9" * 150
"""The answer agents 1 and 2 give on test problem 1: a round-0 vote (and consensus) with no place to break."""
FLAGS = ["--backend", "markup-sim", "--task-option", "levels=[0,1]", "--max-tokens", "64", "--agents", "3"]


class MarkupSim(SimBackend):
    """The sim, whose agents write untrusted output: agent 0 opens every solution with markup, agent 1 its solutions
    and verdicts with a bidi override, and agents 1 and 2 answer test problem 1 with a 150-digit number."""

    def generate(self, requests):
        completions = super().generate(requests)
        return [replace(c, text=self.untrusted(r, c.text)) for r, c in zip(requests, completions)]

    @staticmethod
    def untrusted(request, text):
        if request.kind == "critic":
            return text + "\n" + VERDICT if request.agent == 1 else text
        if request.kind != "solve":
            return text
        if request.problem == "arithmetic-test-1" and request.agent in (1, 2):
            text += f"\nThe answer is {LONG}."
        return {0: INJECTED, 1: REVERSED + "\n"}.get(request.agent, "") + text


def record_markup_set(tmp_path_factory) -> ReplaySet:
    """A small set of the sim (5 test and 3 train problems) whose agent 0 writes markup."""
    BACKENDS.register("markup-sim", MarkupSim, overwrite=True)  # --backend takes any registered name
    out = tmp_path_factory.mktemp("sets") / "markup"
    record(["--out", str(out), "--split", "test", "--problems", "0:5", "--chunk", "5", *FLAGS])
    record(["--out", str(out), "--split", "train", "--problems", "0:3", "--chunk", "3", *FLAGS])
    return ReplaySet(out)


@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    return record_markup_set(tmp_path_factory)


class Uniform:
    """A uniformly random legal action that exposes its probabilities (``PolicyActions``), as a trained policy may."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def act(self, observations, infos):
        actions, probabilities = {}, {}
        for agent, observation in observations.items():
            mask = np.asarray(observation["action_mask"], dtype=float)
            probabilities[agent] = mask / mask.sum()
            actions[agent] = int(self.rng.choice(len(mask), p=probabilities[agent]))
        return PolicyActions(actions, probabilities)


def play_traces(replay, path, labels=("threshold", "random"), problems=5):
    """Episodes on the set's test split, written as a trace (two seeds a problem): fixed protocols played by hand,
    and ``uniform`` (``Uniform``) played by the library's episode runner."""
    for label in labels:
        env = replay_env(replay, split="test", trace=str(path), trace_label=label)
        if label == "uniform":
            uniform = Uniform()
            run_episodes([env], [Start(seed, {"problem_index": index}) for index, seed in
                                 itertools.product(range(problems), (0, 1))],
                         lambda steps, policy=uniform: [policy.act(step.observations, step.infos) for step in steps])
            env.close()
            continue
        protocol = make_protocol(label)
        for index, seed in itertools.product(range(problems), (0, 1)):
            observations, infos = env.reset(seed=seed, options={"problem_index": index})
            protocol.reset(seed)
            while env.agents:
                observations, _, _, _, infos = env.step(protocol.act(observations, infos))
        env.close()
    return path


def record_texts(replay):
    """The set's completions by (split, problem id, stream, round, agent, kind), read from its records."""
    found = {}
    for row in replay.records.values():
        found.setdefault((row["split"], row["problem"], row["stream"], row["round"], row["agent"], row["kind"]),
                         []).append(row)
    return found


def test_every_cell_of_the_walk_is_the_env_s_own_outcome(small_set):
    trees = walk_split(small_set, "test")
    env = replay_env(small_set, split="test", invalid_action="persist", max_rounds=1)
    texts = record_texts(small_set)
    assert [tree.id for tree in trees] == [p.id for p in env.problems]
    for tree in trees:
        assert len(tree.cells) == 27 and tree.num_actions == 3
        for joint in itertools.product(range(3), repeat=3):
            env.reset(seed=0, options={"problem_id": tree.id})
            infos = env.step({f"agent_{i}": a for i, a in enumerate(joint)})[4]
            cell = tree.cell(joint)
            assert cell.joint == joint
            assert cell.correct == infos["agent_0"]["consensus_correct"]
            assert list(cell.answers) == [infos[a]["answer"] for a in env.possible_agents]
            assert cell.masked == (joint != tuple(env.last_actions))
        assert tree.protocols["self_consistency"] == (0, 0, 0) and tree.protocols["debate"] == (1, 1, 1)
        assert tree.cell((0, 0, 0)).correct == tree.vote_correct
        for i, view in enumerate(tree.round0):
            solve, critic = texts["test", tree.id, 0, 0, i, "solve"][0], texts["test", tree.id, 0, 0, i, "critic"][0]
            refine = texts["test", tree.id, 0, 1, i, "refine"][0]
            assert view.text == solve["text"] and view.critic == critic["text"]
            assert tree.moves[i][1].text == refine["text"]  # its REFINE text
            # every call that made a state, with its prompt and the recorded tokens
            assert [(c.kind, c.text, c.prompt_tokens, c.completion_tokens) for c in view.calls] == [
                (r["kind"], r["text"], r["prompt_tokens"], r["completion_tokens"]) for r in (solve, critic)]
            assert tree.question in view.calls[0].messages[-1].content  # the solve prompt holds the question
            assert view.text in view.calls[1].messages[-1].content  # the critic was shown the solution
            call = tree.moves[i][1].calls[0]
            assert (call.kind, call.text, call.prompt_tokens) == ("refine", refine["text"], refine["prompt_tokens"])
            shown = call.messages[-1].content  # what REFINE was shown: the question and each peer's answer
            assert tree.question in shown and all(
                f"answered {tree.round0[j].answer or '(no answer)'}" in shown for j in range(3) if j != i)
            assert tree.moves[i][0].calls == [] and tree.moves[i][1].critic == tree.moves[i][1].calls[-1].text
        assert tree.round0[0].text.startswith(INJECTED) and tree.round0[1].text.startswith(REVERSED)
    assert trees[1].vote == LONG


def test_the_site_holds_one_page_per_problem_with_the_recorded_texts_escaped(small_set, tmp_path):
    built = build_set_site(small_set, tmp_path / "site")
    pages = sorted((tmp_path / "site" / "problems").glob("*.html"))
    assert built.pages == len(pages) + 1 == 5 + 3 + 1
    trees = walk_split(small_set, "test")
    page = (tmp_path / "site" / "problems" / "test-00000.html").read_text()
    assert "Content-Security-Policy" in page and "script-src 'self'" in page
    assert re.findall(r"<script\b[^>]*>", page) == ['<script src="../data.js" defer>',
                                                    '<script src="../assets/view.js" defer>']
    assert "&lt;script&gt;document.title = &#x27;pwned&#x27;&lt;/script&gt;" in page and "onerror=\"" not in page
    assert page.count("class=\"cell ") == 27
    assert page.count("class=\"cell right") == trees[0].right_cells
    # a bidi control of a completion is written out, never left to reorder the page
    assert "[U+202E]ABC DEF" in page and "[U+202E]GHI JKL" in page
    assert not any("\u202e" in path.read_text() for path in [*pages, tmp_path / "site" / "index.html"])
    assert show_controls(REVERSED + "\u2066x\u200f") == "[U+202E]ABC DEF[U+2066]x[U+200F]"
    index = (tmp_path / "site" / "index.html").read_text()
    assert index.count("<tr data-n=") == 8
    data = json.loads((tmp_path / "site" / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))
    files = [row[0] for row in data["rows"]]
    assert files == [f"problems/test-{i:05d}.html" for i in range(5)] + [f"problems/train-{i:05d}.html" for i in range(3)]
    vote = data["filters"].index("vote")
    assert [row[2][vote] for row in data["rows"][:5]] == [str(int(tree.vote_correct)) for tree in trees]
    only = build_set_site(small_set, tmp_path / "some", splits=["test"], problems=range(1, 3))
    assert only.pages == 3 and sorted(p.name for p in (tmp_path / "some" / "problems").iterdir()) == [
        "test-00001.html", "test-00002.html"]


def test_a_traced_policy_is_marked_where_its_protocol_is(small_set, tmp_path):
    trace = play_traces(small_set, tmp_path / "traces.jsonl")
    threshold, random = load_policies([trace])
    assert (threshold.label, random.label) == ("threshold", "random")
    for tree in walk_split(small_set, "test"):
        key = ("test", tree.id)
        assert threshold.joints(key) == [tree.protocols["threshold"]]  # the same protocol, played by the env
        assert threshold.right(key) == tree.cell(tree.protocols["threshold"]).correct
        assert all(joint in [cell.joint for cell in tree.cells] for joint in random.joints(key))
    build_set_site(small_set, tmp_path / "site", splits=["test"], traces=[trace])
    page = (tmp_path / "site" / "problems" / "test-00000.html").read_text()
    assert "As the policies played it" in page and page.count("<div class=\"policy\"") == 2
    built = build_trace_site([trace], tmp_path / "traces")
    assert built.pages == 5 + 1
    side = (tmp_path / "traces" / "problems" / "trace-00000.html").read_text()
    episodes = [e for e in read_traces(trace) if e.problem_id == tree_id(side)]
    assert side.count("<div class=\"episode\">") == len(episodes) == 4


def tree_id(page: str) -> str:
    return re.search(r"<h1>(.*?)</h1>", page).group(1)


def test_the_command_builds_a_site_and_reports_mistakes_in_one_line(small_set, tmp_path, capsys):
    built = view_main([str(small_set.path), "--out", str(tmp_path / "site"), "--split", "test", "--problems", "0:2"])
    assert built.pages == 3 and "3 pages" in capsys.readouterr().out
    trace = play_traces(small_set, tmp_path / "traces.jsonl")
    view_main([str(trace), "--out", str(tmp_path / "traces"), "--labels", "random"])
    index = (tmp_path / "traces" / "index.html").read_text()
    assert ">random</button></th>" in index and ">threshold</button></th>" not in index
    cases = [([str(small_set.path)], "--out DIR"),
             ([str(small_set.path), "--out", str(tmp_path / "x"), "--split", "validation"], "no split 'validation'"),
             ([str(small_set.path), "--out", str(tmp_path / "x"), "--problems", "5:2"], "START < END"),
             ([str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "x")], "no such trace file"),
             ([str(trace), "--out", str(tmp_path / "x"), "--labels", "nobody"], "no label 'nobody'"),
             ([str(trace), "--out", str(tmp_path / "x"), "--split", "test"], "is a trace file"),
             ([str(small_set.path), "--out", str(small_set.path)], "holds other files")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            view_main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and err.count("\n") == 1, err
    assert (small_set.path / "card.json").is_file()  # a folder of other files is never cleared


def test_a_policy_s_action_probabilities_are_traced_and_traces_without_them_still_read(small_set, tmp_path):
    trace = play_traces(small_set, tmp_path / "traces.jsonl", labels=("uniform", "threshold"))
    uniform, threshold = load_policies([trace])
    for episode in (e for episodes in uniform.episodes.values() for e in episodes):
        assert all(agent.probabilities is None for agent in episode.rounds[0].agents)  # round 0: no action
        for agent in episode.rounds[1].agents:  # uniform over the legal actions, the one played among them
            legal = [p for p in agent.probabilities if p > 0]
            assert len(agent.probabilities) == 3 and sum(legal) == pytest.approx(1) and len(set(legal)) == 1
            assert agent.probabilities[ACTIONS.index(agent.action)] > 0
    assert all(a.probabilities is None for es in threshold.episodes.values() for e in es for r in e.rounds
               for a in r.agents)  # a plain dict of actions exposes none
    # a line written before probabilities were traced (no such field) reads as it did
    line = json.loads(trace.read_text().splitlines()[0])
    for round_ in line["rounds"]:
        for agent in round_["agents"]:
            del agent["probabilities"]
    (tmp_path / "old.jsonl").write_text(json.dumps(line) + "\n")
    assert read_traces(tmp_path / "old.jsonl")[0].rounds[1].agents[0].probabilities is None
    line["rounds"][1]["agents"][0]["probabilities"] = [0.5, "x", 0.5]
    (tmp_path / "bad.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(TraceError, match=r"bad.jsonl:1: rounds\[1\].agents\[0\].probabilities must be"):
        read_traces(tmp_path / "bad.jsonl")
    env = replay_env(small_set, split="test", trace=str(tmp_path / "refused.jsonl"))
    observations, _ = env.reset(seed=0, options={"problem_index": 0})
    with pytest.raises(ValueError, match="agent_0's action must be 3 numbers in"):
        env.step(PolicyActions({a: 0 for a in observations}, {a: [0.5, 0.2, 0.2] for a in observations}))
    env.close()


def test_trace_pages_show_the_question_gold_and_probabilities_and_compare_choices(small_set, tmp_path):
    trace = play_traces(small_set, tmp_path / "traces.jsonl", labels=("uniform", "threshold"))
    uniform, threshold = load_policies([trace])
    trees = walk_split(small_set, "test")
    site = build_trace_site([trace], tmp_path / "traces").out
    first = (site / "problems" / "trace-00000.html").read_text()
    assert f"<p class=\"q\" id=\"question\">{esc(trees[0].question)}</p>" in first  # the task rebuilt from the trace
    assert f"<span class=\"chip gold\" id=\"gold\">{trees[0].gold}</span>" in first
    assert first.count("class=\"prob\"") == 2 * 3  # two uniform episodes, three agents acting in round 1
    data = json.loads((site / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))
    plays = data["filters"].index("plays0")  # uniform's choices against the protocol among the labels
    for row, tree in zip(data["rows"], trees):
        ours, theirs = uniform.joints(("test", tree.id)), threshold.joints(("test", tree.id))
        assert ("=threshold" in row[2][plays]) == any(j in theirs for j in ours)
        assert ("!threshold" in row[2][plays]) == any(j not in theirs for j in ours)
    # beside the set, the threshold policy plays the threshold protocol's joint action, and no other
    build_set_site(small_set, tmp_path / "site", splits=["test"], traces=[trace], labels=["threshold"])
    data = json.loads((tmp_path / "site" / "data.js").read_text().removeprefix("window.VIEW_DATA = ").rstrip(";\n"))
    plays = data["filters"].index("plays0")
    assert all("=TH" in row[2][plays] and "!TH" not in row[2][plays] for row in data["rows"])
    # a trace whose task cannot be built here says so instead of a question
    line = json.loads(trace.read_text().splitlines()[0])
    line["task_settings"] = {"levels": "no such level"}
    (tmp_path / "unbuildable.jsonl").write_text(json.dumps(line) + "\n")
    page = (build_trace_site([tmp_path / "unbuildable.jsonl"], tmp_path / "x").out / "problems" / "trace-00000.html")
    assert "cannot be built here" in page.read_text()


def test_a_trace_played_on_another_set_is_refused_beside_this_set_s_grids(small_set, tmp_path, capsys):
    """A trace names the set it was played on (name#digest); the view of another set, or of this set's name at
    another digest, refuses it instead of marking another recording's choices on these grids."""
    trace = play_traces(small_set, tmp_path / "traces.jsonl", labels=("threshold",), problems=1)
    assert {e.replay_set for e in read_traces(trace)} == {small_set.identity}
    other = Path(shutil.copytree(small_set.path, tmp_path / "other"))
    card = load_card(other)
    card.notes = [*card.notes, "re-recorded elsewhere"]  # the same name, another set: another digest
    write_card(other, card)
    with pytest.raises(ValueError, match=rf"played on replay set {small_set.identity}, the view shows markup#"):
        build_set_site(other, tmp_path / "site", splits=["test"], traces=[trace])
    with pytest.raises(SystemExit):
        view_main([str(other), "--out", str(tmp_path / "x"), "--split", "test", "--trace", str(trace)])
    assert "played on replay set" in capsys.readouterr().err
