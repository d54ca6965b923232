"""The request format: per-problem stream seeds, disjoint arithmetic splits, chosen concede targets and
recordings that serve every concede-target rule."""

from __future__ import annotations

import itertools

import pytest

import deliberation_env
from deliberation_env.backends.sim import SimBackend
from deliberation_env.core.deliberation import Action, Deliberation, DeliberationConfig
from deliberation_env.core.seeds import REQUEST_FORMAT, stream_seed
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.replay import ReplaySet
from deliberation_env.tasks.arithmetic import ArithmeticTask
from tests.test_replay import SIM_FLAGS, same


def solve_seeds(task, problems, request_format: int = REQUEST_FORMAT) -> list[tuple[int, ...]]:
    """Each problem's solve-request seeds (one per agent) on stream 0."""
    config = DeliberationConfig(streams=1, request_format=request_format)
    seeds = []
    for problem in problems:
        core = Deliberation(task, config)
        core.start(problem, 0)
        seeds.append(tuple(request.seed for request in core.pending_requests()))
    return seeds


def test_no_two_problems_share_a_request_seed():
    task = ArithmeticTask(levels=(0, 1))
    problems = list(task.problems("test")[:200]) + list(task.problems("train")[:200])
    seeds = solve_seeds(task, problems)
    flat = [seed for row in seeds for seed in row]
    assert len(set(flat)) == len(flat) == 3 * len(problems)
    # Format 1 (kept to read old sets) gave agent k the same seed on every problem: the flaw format 2 removes.
    old = solve_seeds(task, problems, request_format=1)
    assert len(set(old)) == 1
    assert stream_seed(0, problems[0].id) != stream_seed(0, problems[1].id)
    assert stream_seed(0, problems[0].id, request_format=1) == stream_seed(0, problems[1].id, request_format=1)


def test_request_format_is_validated():
    with pytest.raises(ValueError, match="request_format must be one of"):
        DeliberationConfig(request_format=3)


@pytest.mark.parametrize("levels", [(0,), (0, 1), (1, 2, 3, 4, 5)])
def test_arithmetic_splits_are_disjoint_and_free_of_repeats(levels):
    task = ArithmeticTask(levels=levels)
    train = [p.question for p in task.problems("train")]
    test = [p.question for p in task.problems("test")]
    assert len(set(train)) == len(train) == 2000
    assert len(set(test)) == len(test) == 500
    assert not set(train) & set(test)
    # Only repeated problems were drawn again: the rest are what the generator always gave.
    old = ArithmeticTask(levels=levels, unique=False)
    changed = [p.id for p, q in zip(task.problems("test"), old.problems("test")) if p.question != q.question]
    assert len(changed) < 0.1 * len(test)
    if levels == (0, 1):  # the repeats the first qwen05-arith recording held, among them
        assert {"arithmetic-test-216", "arithmetic-test-276", "arithmetic-test-369", "arithmetic-test-384"} <= set(changed)
    # A shorter split is a prefix of the full one.
    assert [p.question for p in ArithmeticTask(levels=levels, num_problems=50).problems("test")] == test[:50]


def test_arithmetic_unique_must_be_a_bool():
    with pytest.raises(ValueError, match="unique must be True or False"):
        ArithmeticTask(unique="no")


WEAK = SimBackend(skills=(0.2,))
"""A weak simulated team: three different answers after round 0 are common."""


def drive(core: Deliberation, backend: SimBackend) -> None:
    while requests := core.pending_requests():
        core.receive(backend.generate(requests))


def round_zero(task, problem, seed: int) -> Deliberation:
    core = Deliberation(task, DeliberationConfig(max_rounds=1))
    core.start(problem, seed)
    drive(core, WEAK)
    return core


def answers_to_adopt(core: Deliberation, agent: int) -> set[str | None]:
    return {core.agents[j].answer for j in core.concede_options(agent)}


def test_a_concede_can_name_its_peer():
    task = ArithmeticTask(levels=(4, 5))
    found = ((problem, seed, agent) for problem in task.problems("test")[:50] for seed in range(4) for agent in range(3)
             if len(answers_to_adopt(round_zero(task, problem, seed), agent)) == 2)
    problem, seed, agent = next(found)
    core = round_zero(task, problem, seed)
    options = core.concede_options(agent)
    assert options == [j for j in core.peer_indices(agent) if j in options]  # in peer order
    rule_target = core.concede_target(agent)
    answers = {}
    for target in options:
        played = round_zero(task, problem, seed)
        actions = [Action.CONCEDE if i == agent else Action.PERSIST for i in range(3)]
        played.begin_round(actions, [target if i == agent else None for i in range(3)])
        drive(played, WEAK)
        played.finish_round()
        answers[target] = played.agents[agent].answer
        assert answers[target] == core.agents[target].answer
    assert len(set(answers.values())) == 2  # two different peers, two different outcomes
    ruled = round_zero(task, problem, seed)  # no target named: the config's rule picks, as before
    ruled.begin_round([Action.CONCEDE if i == agent else Action.PERSIST for i in range(3)])
    assert ruled.agents[agent].answer == core.agents[rule_target].answer
    with pytest.raises(ValueError, match="cannot concede to agent"):
        round_zero(task, problem, seed).begin_round([Action.CONCEDE] * 3, [agent, agent, agent])


def test_a_set_recorded_with_every_target_serves_every_concede_rule(tmp_path):
    out = tmp_path / "all-targets"
    record(["--out", str(out), "--split", "test", "--problems", "0:6", "--streams", "1", "--rounds", "1",
            "--sources", "critic_text", "--confidence", "critic_text", *SIM_FLAGS])
    dataset = ReplaySet(out)
    assert dataset.card.concede_targets == "all" and dataset.card.request_format == REQUEST_FORMAT
    for rule in ("most_confident", "plurality"):
        replayed = replay_env(dataset, split="test", concede_target=rule, invalid_action="persist")
        live = deliberation_env.parallel_env(task="arithmetic", task_kwargs={"levels": [0, 1]}, backend="sim",
                                             split="test", max_rounds=1, max_tokens=64, streams=1, confidence="critic_text",
                                             concede_target=rule, invalid_action="persist")
        for problem_id, joint in itertools.product(dataset.card.splits["test"], itertools.product(range(3), repeat=3)):
            options = {"problem_id": problem_id}
            same(replayed.reset(seed=0, options=options), live.reset(seed=0, options=options))
            same(replayed.step({f"agent_{i}": a for i, a in enumerate(joint)}),
                 live.step({f"agent_{i}": a for i, a in enumerate(joint)}))
        assert replayed.backends[0].misses == 0


def test_a_set_recorded_with_the_rule_only_refuses_another_rule(tmp_path):
    out = tmp_path / "rule-only"
    record(["--out", str(out), "--split", "test", "--problems", "0:2", "--streams", "1", "--rounds", "1",
            "--sources", "critic_text", "--confidence", "critic_text", "--concede-targets", "rule", *SIM_FLAGS])
    with pytest.raises(deliberation_env.replay.ReplayError, match="concede_target='most_confident'"):
        replay_env(out, split="test", concede_target="plurality")


def opening_agreement(model, task, problems, request_format: int) -> tuple[float, float]:
    """How often two openings of one agent on different problems match, and two of different agents."""
    config = DeliberationConfig(streams=1, request_format=request_format, max_tokens=4)
    requests = []
    for problem in problems:
        core = Deliberation(task, config)
        core.start(problem, 0)
        requests += core.pending_requests()
    texts = [completion.text.strip() for completion in model.generate(requests)]
    openings = [texts[agent::3] for agent in range(3)]
    pairs = list(itertools.combinations(range(len(problems)), 2))
    within = sum(openings[k][i] == openings[k][j] for k in range(3) for i, j in pairs) / (3 * len(pairs))
    across = sum(openings[a][i] == openings[b][j] for a, b in itertools.combinations(range(3), 2)
                 for i, j in itertools.permutations(range(len(problems)), 2)) / (3 * 2 * len(pairs))
    return within, across


@pytest.mark.model
def test_a_homogeneous_team_is_three_samples_of_one_model_not_three_personas(converted):
    """SmolLM2, 20 problems, each agent's first 4 tokens. Format 1 reused agent k's random stream on every problem,
    so each agent kept its own opening (measured: 0.59 of an agent's pairs of problems matched, 0.03 across agents);
    under format 2 the agents are alike (0.37 and 0.35)."""
    from deliberation_env.backends.models import smollm2_gguf_path
    from deliberation_env.backends.transformers import TransformersBackend

    model = TransformersBackend(smollm2_gguf_path(), dtype="float32", batch_size=64, converted_cache_dir=converted)
    task = ArithmeticTask(levels=(0, 1))
    problems = task.problems("test")[:20]
    within, across = opening_agreement(model, task, problems, REQUEST_FORMAT)
    assert abs(within - across) < 0.15, (within, across)
    within, across = opening_agreement(model, task, problems, request_format=1)
    assert within - across > 0.3, (within, across)  # the flaw format 2 removes, measured the same way
