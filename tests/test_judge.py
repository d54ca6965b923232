"""bench/studies/judge.py: the judge baseline on a shipped replay set, answered by a loopback OpenAI-compatible server.
The judge is shown each problem's round-0 solutions (the env's), its reply is parsed (the plurality vote where it
names no solution), each finished chunk survives a killed run and a rerun judges only what no chunk holds, and the
CSV is the Scores of those outcomes."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from baselines.benchmark import Scores, loaded
from deliberation_env.backends.openai import BackendError
from deliberation_env.make import replay_env
from deliberation_env.testing.servers import LoopbackServer, chat_reply, send_json

pytestmark = pytest.mark.server

SET = "qwen05-arith-v2"
PROBLEMS = 5
REPLIES = ["2", "Solution 3 is correct.", "I cannot tell which one.", "**1**", "Solution 1 is wrong, solution 2 is right"]
"""The reply to problem k of the test split: a bare number, a named solution, and three the parse must fall back on
or read (no number; a number alone in markdown; two different solutions named)."""
KEPT = [1, 2, None, 0, None]


@pytest.fixture
def judge():
    from bench.studies import judge

    return judge


@pytest.mark.parametrize("reply, count, kept", [
    ("2", 3, 1), (" 3.\n", 3, 2), ("**1**", 3, 0), ("Solution 2", 3, 1), ("The correct solution is Solution #3.", 3, 2),
    ("the second one", 3, 1), ("Solution 2 is correct: 5 + 7 = 12", 3, 1), ("4", 3, None), ("Solution 4", 3, None),
    ("Solution 1 is wrong, solution 2 is right", 3, None), ("The answer is 12", 3, None), ("", 3, None),
    ("I keep 2 of them", 3, 1), ("1 or 3", 3, None), ("4", 5, 3), ("Solution 2.5", 3, None)])
def test_parse_choice_reads_one_named_solution_and_nothing_else(judge, reply, count, kept):
    assert judge.parse_choice(reply, count) == kept


def round0(split_env, index):
    """What the test expects of problem ``index``: its question, solutions, correctness, consensus and tokens."""
    _, infos = split_env.reset(seed=0, options={"problem_index": index})
    agents = split_env.deliberation.agents
    first = next(iter(infos.values()))
    return {"id": split_env.deliberation.problem.id, "question": split_env.deliberation.problem.question,
            "texts": [a.text.strip() for a in agents], "correct": [a.correct for a in agents],
            "consensus_correct": first["consensus_correct"], "tokens": sum(i["tokens"] for i in infos.values())}


def serve(expected, fail_after=None):
    """A loopback server answering each judge call with its problem's reply (HTTP 400 after ``fail_after`` POSTs)."""
    def respond(handler, server):
        if fail_after is not None and server.posts > fail_after:
            send_json(handler, 400, {"error": "the server went away"})
            return
        user = server.bodies[-1]["messages"][-1]["content"]
        (k,) = [k for k, e in enumerate(expected) if e["question"] in user]
        send_json(handler, 200, chat_reply(REPLIES[k], prompt_tokens=700 + k, completion_tokens=1))

    return LoopbackServer(respond)


def test_the_judge_keeps_a_solution_resumes_by_chunk_and_writes_its_scores(judge, tmp_path):
    env = replay_env(loaded(SET), "test")
    expected = [round0(env, k) for k in range(PROBLEMS)]
    out = str(tmp_path / "judge")

    def run(server, *extra):
        judge.main(["run", "--backend", "openai", "--base-url", server.url, "--model", "m",
                    "--backend-option", "max_retries=0", "--sets", SET, "--splits", "test", "--limit", str(PROBLEMS),
                    "--chunk", "2", "--out", out, *extra])

    chunks = os.path.join(out, "chunks", f"{SET}-test")
    dying = serve(expected, fail_after=3)  # killed while judging the second chunk: the first one stays
    with pytest.raises(BackendError):
        run(dying)
    dying.close()
    assert sorted(os.listdir(chunks)) == ["chunk-0000-0001.json"]

    server = serve(expected)
    run(server)
    assert sorted(os.listdir(chunks)) == ["chunk-0000-0001.json", "chunk-0002-0003.json", "chunk-0004-0004.json"]
    assert server.posts == PROBLEMS - 2  # only what no chunk held
    body = server.bodies[0]
    assert body["temperature"] == 0 and body["max_tokens"] == judge.MAX_TOKENS
    user = body["messages"][-1]["content"]
    problem = expected[2]
    places = [user.index(f"### Solution {n + 1}\n{text}") for n, text in enumerate(problem["texts"])]
    assert places == sorted(places) and user.startswith(f"Problem: {problem['question']}")

    os.remove(os.path.join(chunks, "chunk-0002-0003.json"))
    run(server)  # a lost chunk is judged again, nothing else
    assert server.posts == PROBLEMS - 2 + 2

    scores = Scores.load(os.path.join(out, f"{SET}-test.csv"))
    right = [e["consensus_correct"] if kept is None else e["correct"][kept] for e, kept in zip(expected, KEPT)]
    assert (scores.label, scores.cell, scores.split) == ("judge", SET, "test")
    assert scores.problem_ids == [e["id"] for e in expected]
    np.testing.assert_array_equal(scores.accuracy, np.array(right, float))
    np.testing.assert_array_equal(scores.tokens, [e["tokens"] + 700 + k + 1 for k, e in enumerate(expected)])

    report = (tmp_path / "judge.md").read_text(encoding="utf-8")
    row = next(line for line in report.splitlines() if line.startswith(f"| {SET} | test | {PROBLEMS} / 400 |"))
    assert f"| {KEPT.count(None)} ({KEPT.count(None) / PROBLEMS:.1%}) |" in row
    assert f"| {SET} | test | 1 | {1 / 3:.3f} (1) |" in report  # one of the three parsed replies keeps position 1
    server.close()


def test_a_chunk_of_another_prompt_is_refused(judge, tmp_path):
    env = replay_env(loaded(SET), "test")
    expected = [round0(env, k) for k in range(PROBLEMS)]
    out = str(tmp_path / "judge")
    server = serve(expected)
    flags = ["--backend", "openai", "--base-url", server.url, "--model", "m", "--sets", SET, "--splits", "test",
             "--limit", "2", "--out", out]
    judge.main(["run", *flags])
    (path,) = glob.glob(os.path.join(out, "chunks", f"{SET}-test", "chunk-*.json"))
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    document["judge"] = "0" * 16
    with open(path, "w", encoding="utf-8") as f:
        json.dump(document, f)
    with pytest.raises(SystemExit, match="another judge prompt"):
        judge.main(["run", *flags])
    server.close()
