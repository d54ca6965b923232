"""Chosen concede targets (``concede_to_peer=True``): CONCEDE names its peer; the rule's CONCEDE stays action 2."""

from __future__ import annotations

import itertools

import pytest

import deliberation_env
from deliberation_env.core.actions import FIRST_PEER_ACTION, Action, action_name, decode, num_actions
from deliberation_env.make import replay_env
from deliberation_env.protocols import PROTOCOLS, make_protocol
from deliberation_env.record import main as record
from deliberation_env.replay import ReplayError

SIM = {"task": "arithmetic", "task_kwargs": {"levels": [0, 1]}, "backend": "sim", "max_tokens": 64}


def sim_env(**options):
    return deliberation_env.parallel_env(**{**SIM, "max_rounds": 1, **options})


def test_the_action_space_adds_one_concede_per_peer_in_observation_order():
    assert num_actions(3, False) == 3 and num_actions(3, True) == 5 and num_actions(4, True) == 6
    assert decode(FIRST_PEER_ACTION + 1, [2, 0]) == (Action.CONCEDE, 0)
    assert decode(int(Action.CONCEDE), [2, 0]) == (Action.CONCEDE, None)
    assert [action_name(i) for i in range(5)] == ["PERSIST", "REFINE", "CONCEDE", "CONCEDE_PEER_0", "CONCEDE_PEER_1"]
    env = sim_env(concede_to_peer=True)
    assert env.action_space("agent_0").n == 5
    observations, _ = env.reset(seed=0)
    assert observations["agent_0"]["action_mask"].shape == (5,)
    assert env.observation_space("agent_0")["action_mask"].shape == (5,)
    flat = sim_env(concede_to_peer=True, observation="flat")
    assert flat.observation_space("agent_0").shape[0] == sim_env(observation="flat").observation_space("agent_0").shape[0] + 2
    assert sim_env().action_space("agent_0").n == 3  # the default game is unchanged


def test_masks_follow_the_peers_holding_another_answer_and_a_named_concede_adopts_that_peer():
    env = sim_env(concede_to_peer=True)
    adopted = 0
    for seed in range(40):
        observations, _ = env.reset(seed=seed)
        core = env.deliberation
        for i, agent in enumerate(env.agents):
            peers = core.peer_indices(i)
            mask = observations[agent]["action_mask"]
            expected = [peer in core.concede_options(i) for peer in peers]
            assert mask[FIRST_PEER_ACTION:].tolist() == expected
            assert mask[Action.CONCEDE] == any(expected)
        options = [(i, slot, peer) for i in range(3) for slot, peer in enumerate(core.peer_indices(i))
                   if peer in core.concede_options(i)]
        if not options:
            continue
        i, slot, peer = options[0]
        answer = core.agents[peer].answer
        actions = {agent: int(Action.PERSIST) for agent in env.agents}
        actions[f"agent_{i}"] = FIRST_PEER_ACTION + slot
        _, _, _, _, infos = env.step(actions)
        assert infos[f"agent_{i}"]["answer"] == answer and infos[f"agent_{i}"]["action"] == "CONCEDE"
        adopted += 1
    assert adopted >= 10


def test_a_flag_that_is_not_a_bool_is_a_clear_error():
    with pytest.raises(ValueError, match="concede_to_peer must be True or False, got 'maybe'"):
        sim_env(concede_to_peer="maybe")


def test_a_masked_named_concede_raises_or_persists():
    for seed in range(40):
        env = sim_env(concede_to_peer=True, invalid_action="raise")
        observations, _ = env.reset(seed=seed)
        masked = [(agent, index) for agent in env.agents for index in range(FIRST_PEER_ACTION, 5)
                  if not observations[agent]["action_mask"][index]]
        if masked:
            break
    agent, index = masked[0]
    actions = {a: int(Action.PERSIST) for a in env.agents}
    actions[agent] = index
    with pytest.raises(ValueError, match=f"{action_name(index)} is masked"):
        env.step(actions)
    env = sim_env(concede_to_peer=True)  # the default: invalid_action="persist"
    env.reset(seed=seed)
    env.step(actions)
    assert env.last_actions[int(agent.split("_")[1])] is Action.PERSIST
    env = sim_env(concede_to_peer=True)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="5=CONCEDE_PEER_2|not one of"):
        env.step({a: 5 for a in env.agents})


def test_the_oracle_names_a_right_peer_when_the_rule_picks_a_wrong_one():
    """The lever: the rule follows the critic, so a right peer it passes over is reachable only by name."""
    env = sim_env(concede_to_peer=True)
    found = 0
    for seed in range(1500):
        env.reset(seed=seed)
        core = env.deliberation
        for i in range(3):
            target = core.concede_target(i)
            if core.agents[i].correct or target is None or core.agents[target].correct:
                continue
            right = [slot for slot, peer in enumerate(core.peer_indices(i))
                     if peer in core.concede_options(i) and core.agents[peer].correct]
            if not right:
                continue
            label = core.oracle_action(i)
            assert label == FIRST_PEER_ACTION + right[0]
            actions = {agent: int(Action.PERSIST) for agent in env.agents}
            actions[f"agent_{i}"] = label
            _, _, _, _, infos = env.step(actions)
            assert infos[f"agent_{i}"]["correct"]
            found += 1
            break
    assert found >= 3


@pytest.mark.parametrize("name", [p for p in PROTOCOLS if p != "single"])
def test_every_fixed_protocol_plays_legal_actions(name):
    env = sim_env(concede_to_peer=True, max_rounds=2)
    protocol = make_protocol(name)
    for seed in range(5):
        protocol.reset(seed)
        observations, infos = env.reset(seed=seed)
        while env.agents:
            actions = protocol.act(observations, infos)
            for agent, action in actions.items():
                assert observations[agent]["action_mask"][action], (name, agent, action)
            observations, _, _, _, infos = env.step(actions)


@pytest.fixture(scope="module")
def all_targets_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("sets") / "sim-all"
    record(["--out", str(out), "--split", "test", "--problems", "0:3", "--streams", "1", "--rounds", "1",
            "--backend", "sim", "--task-option", "levels=[0,1]", "--max-tokens", "64", "--agents", "3",
            "--concede-targets", "all"])
    return out


def test_a_set_with_every_concede_target_replays_every_named_concede_equal_to_live(all_targets_set):
    replayed = replay_env(str(all_targets_set), split="test", concede_to_peer=True, invalid_action="persist")
    live = deliberation_env.parallel_env(**{**SIM, "max_rounds": 1}, split="test", streams=1,
                                         confidence=replayed.config.confidence,
                                         concede_to_peer=True, invalid_action="persist")
    played = 0
    for problem in replayed.problems:
        for joint in itertools.product(range(5), repeat=3):
            options = {"problem_id": problem.id}
            a, b = replayed.reset(seed=0, options=options), live.reset(seed=0, options=options)
            assert [o["action_mask"].tolist() for o in a[0].values()] == [o["action_mask"].tolist() for o in b[0].values()]
            actions = {f"agent_{i}": action for i, action in enumerate(joint)}
            stepped, expected = replayed.step(actions), live.step(actions)
            assert stepped[4] == expected[4] and stepped[1] == expected[1]
            played += 1
    assert played == 3 * 125 and replayed.backends[0].misses == 0


def test_a_set_recorded_for_the_rule_only_refuses_named_concedes(tmp_path):
    out = tmp_path / "sim-rule"
    record(["--out", str(out), "--split", "test", "--problems", "0:2", "--streams", "1", "--rounds", "1",
            "--backend", "sim", "--task-option", "levels=[0,1]", "--max-tokens", "64", "--agents", "3",
            "--concede-targets", "rule"])
    replay_env(str(out), split="test")  # the rule's game is served
    with pytest.raises(ReplayError, match="cannot serve concede_to_peer=True"):
        replay_env(str(out), split="test", concede_to_peer=True)


@pytest.mark.parametrize("algo", ["softrankpo", "sft"])
def test_meta_trainers_take_the_wider_action_space(tmp_path, algo):
    import torch

    from baselines.meta.train import main as train

    extra = ["--group-size", "4", "--groups-per-batch", "4", "--sft-episodes", "0"] if algo == "softrankpo" else []
    policy = train(["--algo", algo, "--episodes", "32", "--num-envs", "8", "--out", str(tmp_path), "--env-option",
                    "concede_to_peer=True", "--env-option", "max_rounds=1", "--no-progress", "--no-tensorboard",
                    "--no-evaluate", *extra])
    assert policy.layout.num_actions == 5
    env = sim_env(concede_to_peer=True)
    for seed in range(10):
        observations, _ = env.reset(seed=seed)
        for agent, action in policy.act(observations).items():
            assert observations[agent]["action_mask"][action]
    if algo == "sft":  # the oracle's labels name peers where the rule's target is wrong and another peer right
        shares = torch.load(tmp_path / "policy.pt", weights_only=False)["label_shares"]
        assert len(shares) == 5 and sum(shares[FIRST_PEER_ACTION:]) > 0
