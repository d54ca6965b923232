"""deliberation_env.view: the walk of a recorded tree is the env's own outcomes, the pages hold the recorded texts
(escaped), traces mark their policies, and the command line reports mistakes in one line. The browser checks are in
tests/test_view_browser.py."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest

from deliberation_env.analysis.traces import read_traces
from deliberation_env.backends.sim import SimBackend
from deliberation_env.make import replay_env
from deliberation_env.protocols import make_protocol
from deliberation_env.record import main as record
from deliberation_env.registry import BACKENDS
from deliberation_env.replay import ReplaySet
from deliberation_env.view.__main__ import main as view_main
from deliberation_env.view.episodes import load_policies
from deliberation_env.view.site import build_set_site, build_trace_site
from deliberation_env.view.tree import record_texts, walk_split

INJECTED = "<script>document.title = 'pwned'</script><img src=x onerror=\"document.body.dataset.pwned = 'yes'\"> "
"""Markup a completion may hold (no digits, so the answer extracted after it is the sim's own)."""
FLAGS = ["--backend", "markup-sim", "--task-option", "levels=[0,1]", "--max-tokens", "64", "--agents", "3"]


class MarkupSim(SimBackend):
    """The sim, whose agent 0 opens every solution with markup: untrusted model output."""

    def generate(self, requests):
        completions = super().generate(requests)
        return [replace(c, text=INJECTED + c.text) if r.kind == "solve" and r.agent == 0 else c
                for r, c in zip(requests, completions)]


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


def play_traces(replay, path, labels=("threshold", "random"), problems=5):
    """Episodes of fixed protocols on the set's test split, written as a trace (two seeds a problem)."""
    for label in labels:
        env = replay_env(replay, split="test", trace=str(path), trace_label=label)
        protocol = make_protocol(label)
        for index, seed in itertools.product(range(problems), (0, 1)):
            observations, infos = env.reset(seed=seed, options={"problem_index": index})
            protocol.reset(seed)
            while env.agents:
                observations, _, _, _, infos = env.step(protocol.act(observations, infos))
        env.close()
    return path


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
            assert view.text == texts["test", tree.id, 0, 0, i, "solve"][0]
            assert view.critic == texts["test", tree.id, 0, 0, i, "critic"][0]
            assert tree.moves[i][1].text == texts["test", tree.id, 0, 1, i, "refine"][0]  # its REFINE text
        assert tree.round0[0].text.startswith(INJECTED)


def test_the_site_holds_one_page_per_problem_with_the_recorded_texts_escaped(small_set, tmp_path):
    built = build_set_site(small_set, tmp_path / "site")
    pages = sorted((tmp_path / "site" / "problems").glob("*.html"))
    assert built.pages == len(pages) + 1 == 5 + 3 + 1
    trees = walk_split(small_set, "test")
    page = (tmp_path / "site" / "problems" / "test-00000.html").read_text()
    assert "Content-Security-Policy" in page and "script-src 'self'" in page
    assert re.findall(r"<script\b[^>]*>", page) == ['<script src="../assets/view.js" defer>']
    assert "&lt;script&gt;document.title = &#x27;pwned&#x27;&lt;/script&gt;" in page and "onerror=\"" not in page
    assert page.count("class=\"cell ") == 27
    assert page.count("class=\"cell right") == trees[0].right_cells
    index = (tmp_path / "site" / "index.html").read_text()
    assert index.count("<tr data-split=\"test\"") == 5 and index.count("<tr data-split=\"train\"") == 3
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
    assert "<th>random</th>" in index and "<th>threshold</th>" not in index
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
