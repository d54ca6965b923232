"""Episode traces: what the env records, the strict reader, and identical records on every stepping path."""

from __future__ import annotations

import json

import pytest

import deliberation_env
from deliberation_env.analysis.traces import TRACE_VERSION, TraceError, TraceWriter, read_traces
from deliberation_env.vector import BatchedEnvs


def confidence_policy(observations):
    """Deterministic from the observation alone: PERSIST when confident, else CONCEDE if legal, else REFINE."""
    actions = {}
    for agent, obs in observations.items():
        if obs["self"][3] >= 0.7:
            actions[agent] = 0
        elif obs["action_mask"][2]:
            actions[agent] = 2
        else:
            actions[agent] = 1
    return actions


def play(env, seed, policy=confidence_policy):
    observations, infos = env.reset(seed=seed)
    history = [infos]
    while env.agents:
        observations, rewards, _, _, infos = env.step(policy(observations))
        history.append((rewards, infos))
    return history


def test_trace_records_what_the_env_did_and_round_trips(tmp_path):
    path = tmp_path / "t.jsonl"
    env = deliberation_env.parallel_env(trace=str(path), trace_label="mine", task_kwargs={"levels": [2, 3]})
    histories = [play(env, seed) for seed in range(4)]
    env.close()
    episodes = read_traces(path)
    assert len(episodes) == 4
    for episode, history in zip(episodes, histories):
        assert episode.version == TRACE_VERSION and episode.label == "mine" and episode.task == "arithmetic"
        assert episode.task_settings["levels"] == [2, 3] and episode.split == "train"
        assert episode.num_agents == 3 and episode.max_rounds == 3 and len(episode.rounds) == 4
        assert episode.backends == (env.backends[0].identity(),) * 3
        assert episode.problem_id == history[0]["agent_0"]["problem_id"]
        assert episode.rounds[0].rewards is None and all(a.action is None for a in episode.rounds[0].agents)
        for round_record, step in zip(episode.rounds, history):
            rewards, infos = (None, step) if isinstance(step, dict) else step
            for i, agent in enumerate(round_record.agents):
                info = infos[f"agent_{i}"]
                assert (agent.answer, agent.correct, agent.confidence) == (info["answer"], info["correct"], info["confidence"])
                assert agent.action == info["action"] and agent.confidence_source == info["confidence_source"]
                assert sum(r.prompt_tokens + r.completion_tokens for r in agent.requests) == info["tokens"]
                if round_record.index == 0:
                    assert [r.kind for r in agent.requests] == ["solve", "critic"]
                elif agent.action == "REFINE":
                    assert [r.kind for r in agent.requests] == ["refine", "critic"]
                elif agent.action == "PERSIST":
                    assert agent.requests == ()
            assert round_record.consensus == infos["agent_0"]["consensus"]
            assert round_record.consensus_correct == infos["agent_0"]["consensus_correct"]
            if rewards is not None:
                assert round_record.rewards == tuple(rewards[f"agent_{i}"] for i in range(3))
                assert round_record.reward_components[0]["local"] == infos["agent_0"]["reward_local"]
    # Writing the read episodes again gives equal episodes.
    copy = tmp_path / "copy.jsonl"
    with TraceWriter(copy) as writer:
        for episode in episodes:
            writer.write(episode)
    assert read_traces(copy) == episodes


def test_step_and_batched_paths_give_identical_records(tmp_path):
    seeds = [11, 12, 13]
    stepped = [deliberation_env.parallel_env(trace=str(tmp_path / "step.jsonl")) for _ in seeds]
    for env, seed in zip(stepped, seeds):
        play(env, seed)
        env.close()
    with TraceWriter(tmp_path / "batched.jsonl") as writer:
        envs = [deliberation_env.parallel_env(trace=writer) for _ in seeds]
        batch = BatchedEnvs(envs)
        current = [observations for observations, _ in batch.reset(seeds)]
        while any(env.agents for env in envs):
            actions = [confidence_policy(obs) if env.agents else None for obs, env in zip(current, envs)]
            for i, result in enumerate(batch.step(actions)):
                if result is not None:
                    current[i] = result[0]
    one_by_one, batched = read_traces(tmp_path / "step.jsonl"), read_traces(tmp_path / "batched.jsonl")
    assert len(one_by_one) == 3 and sorted(one_by_one, key=repr) == sorted(batched, key=repr)


def test_each_episode_is_flushed_when_it_ends_and_a_cut_episode_is_not_written(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)
    env = deliberation_env.parallel_env(trace=writer, trace_label="a")
    other = deliberation_env.parallel_env(trace=writer, trace_label="b", max_rounds=1)
    play(env, 0)
    assert len(path.read_text().splitlines()) == 1  # on disk before any close: a killed run keeps it
    env.reset(seed=1)
    env.step({agent: 1 for agent in env.agents})  # cut short by the next reset: not written
    play(other, 2)
    play(env, 3)
    labels = [episode.label for episode in read_traces(path)]
    assert labels == ["a", "b", "a"]
    writer.close()


def test_no_trace_no_wrapper_and_the_core_keeps_one_round_of_requests():
    env = deliberation_env.parallel_env()
    assert type(env) is deliberation_env.DeliberationEnv  # nothing records without trace=
    play(env, 0)
    last = env.deliberation.round_requests  # the last round's only: it does not grow with the episode
    assert 0 < len(last) <= 2 * env.config.num_agents
    assert sum(p + c for _, _, p, c in last) == sum(agent.step_tokens for agent in env.deliberation.agents)


def test_the_trace_wrapper_wraps_any_env_and_deliberation_env_points_to_it(tmp_path):
    from deliberation_env.analysis.traces import TraceWrapper

    path = tmp_path / "t.jsonl"
    env = TraceWrapper(deliberation_env.DeliberationEnv(max_rounds=1), str(path), "direct")
    play(env, 0)
    env.close()
    assert [episode.label for episode in read_traces(path)] == ["direct"]
    with pytest.raises(TypeError, match="TraceWrapper"):
        deliberation_env.DeliberationEnv(trace=str(path))


def test_bad_trace_option_is_a_clear_error(tmp_path):
    with pytest.raises(TypeError, match="trace must be a path or a TraceWriter"):
        deliberation_env.parallel_env(trace=3)
    with pytest.raises(OSError, match="cannot open trace file"):
        deliberation_env.parallel_env(trace=str(tmp_path / "missing-folder" / "t.jsonl"))


def good_line(tmp_path) -> dict:
    path = tmp_path / "good.jsonl"
    env = deliberation_env.parallel_env(trace=str(path), max_rounds=1)
    play(env, 0, policy=lambda obs: {agent: 1 for agent in obs})
    env.close()
    return json.loads(path.read_text().splitlines()[0])


def _mutations():
    def drop(key):
        return lambda record: record.pop(key)

    def set_(path, value):
        def apply(record):
            target = record
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = value
        return apply

    return [
        (drop("seed"), "missing field seed"),
        (set_(("version",), 99), "version 99 is not supported"),
        (set_(("num_agents",), "3"), "num_agents must be int"),
        (set_(("rounds",), []), "rounds is empty"),
        (set_(("rounds", 1, "index"), 5), r"rounds\[1\].index is 5"),
        (set_(("rounds", 0, "agents", 1, "correct"), "yes"), r"rounds\[0\].agents\[1\].correct must be bool"),
        (set_(("rounds", 1, "agents", 0, "action"), "JUMP"), r"rounds\[1\].agents\[0\].action must be one of"),
        (set_(("rounds", 0, "agents", 0, "requests", 0, "kind"), "chat"), r"requests\[0\].kind must be one of"),
        (set_(("rounds", 0, "agents", 0, "confidence"), 1.5), r"confidence must be in \[0, 1\]"),
        (set_(("rounds", 1, "rewards"), [1.0]), r"rounds\[1\].rewards must have one entry per agent"),
        (set_(("backends",), ["sim"]), "backends must list one identity string per agent"),
    ]


@pytest.mark.parametrize("mutation,message", _mutations())
def test_malformed_lines_name_file_line_and_problem(tmp_path, mutation, message):
    record = good_line(tmp_path)
    bad = json.loads(json.dumps(record))
    mutation(bad)
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(TraceError, match=rf"bad\.jsonl:3: .*{message}"):
        read_traces(path)


def test_not_json_and_missing_file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"version": 1,\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl:1: not a JSON line"):
        read_traces(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(TraceError, match=r"bad\.jsonl:1: the line must be a JSON object"):
        read_traces(path)
    with pytest.raises(TraceError, match="no such trace file"):
        read_traces(tmp_path / "nope.jsonl")


def test_texts_with_odd_characters_round_trip(tmp_path):
    record = good_line(tmp_path)
    record["rounds"][0]["agents"][0]["text"] = "lone \udc80 surrogate, emoji \U0001f600, nul \x00"
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(record) + "\n")
    episode = read_traces(path)[0]
    copy = tmp_path / "copy.jsonl"
    with TraceWriter(copy) as writer:
        writer.write(episode)
    assert read_traces(copy) == [episode]


def test_a_learned_policy_s_probabilities_are_traced(tmp_path):
    from baselines.meta.evaluate import PolicyActor
    from baselines.meta.policy import Policy, agent_layout

    path = tmp_path / "trace.jsonl"
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", max_rounds=2, trace=str(path),
                                        trace_label="learned")
    actor = PolicyActor(Policy(agent_layout(env)))
    observations, infos = env.reset(seed=3)
    while env.agents:
        actions = actor.act(observations, infos)
        for agent, row in actions.probabilities.items():  # a distribution, none on a masked action
            assert sum(row) == pytest.approx(1.0, abs=1e-6)
            assert all(p < 1e-6 for p, legal in zip(row, observations[agent]["action_mask"]) if not legal)
        observations, _, _, _, infos = env.step(actions)
    env.close()
    (episode,) = read_traces(path)
    assert all(agent.probabilities is not None and len(agent.probabilities) == 3
               for played in episode.rounds[1:] for agent in played.agents)
