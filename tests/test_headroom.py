"""bench/common/trees.py and bench/studies/headroom.py: the played-out tree agrees with the env, the policy search finds the best
policy, and the headroom table's columns keep their order (oracle >= ceiling, policy search >= its own protocols)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from deliberation_env.core.deliberation import Deliberation, DeliberationConfig
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.replay import ReplaySet
from deliberation_env.tasks.arithmetic import ArithmeticTask
from tests.test_replay import SIM_FLAGS


@pytest.fixture(scope="module")
def sim_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("sets") / "every-target"
    record(["--out", str(out), "--split", "test", "--problems", "0:24", "--chunk", "24", *SIM_FLAGS])
    return ReplaySet(out)


@pytest.fixture
def trees():
    from bench.common import trees

    return trees


def test_the_tree_of_chosen_targets_has_every_joint_action_and_agrees_with_the_env(sim_set, trees):
    tree = trees.tree_of(sim_set, "test", concede_to_peer=True)
    assert tree["outcome"].shape == (24, 5 ** 3) and tree["actions"] == 5
    env = replay_env(sim_set, split="test", invalid_action="persist", concede_to_peer=True, max_rounds=1)
    rng = np.random.default_rng(0)
    for p in range(24):  # a random joint action's outcome, played in the env, is the tree's
        env.reset(seed=0, options={"problem_index": p})
        joint = rng.integers(5, size=3)
        infos = env.step({f"agent_{a}": int(x) for a, x in enumerate(joint)})[4]
        column = trees.joint_index(tree, joint[None])[0]
        assert tree["outcome"][p, column] == next(iter(infos.values()))["consensus_correct"]
    rule = trees.tree_of(sim_set, "test")  # the 3-action game is the chosen game's first three indices
    assert rule["outcome"].shape == (24, 27)
    same = [trees.joint_index(tree, np.array(j)) for j in itertools.product(range(3), repeat=3)]
    assert (rule["outcome"] == tree["outcome"][:, same]).all()


def test_peer_values_follow_the_cores_peer_order(trees):
    values = np.arange(4)[None, :] * 1.0  # one problem, agent a's value is a
    core = Deliberation(ArithmeticTask(levels=[0]), DeliberationConfig(num_agents=4))
    for agent in range(4):
        assert list(trees.peer_values(values)[0, agent]) == core.peer_indices(agent)



def test_the_program_rules_concede_to_the_program_aided_agent_by_its_place_in_each_peer_order():
    from bench.studies import headroom
    from deliberation_env.core import features
    joints = np.array(list(itertools.product(range(5), repeat=3)))
    program, printed = 1, np.array([True, True, False, False])
    core = Deliberation(ArithmeticTask(levels=[0]), DeliberationConfig(num_agents=3))
    conceding = tuple(0 if a == program else 3 + core.peer_indices(a).index(program) for a in range(3))
    outcome = np.zeros((4, len(joints)), bool)
    column = {tuple(j): i for i, j in enumerate(joints)}
    outcome[[0, 1], column[conceding]] = True  # printed: right only when the others concede to the program
    outcome[2, column[(0, 0, 0)]] = True  # the vote right, debate wrong
    outcome[3, column[(1, 1, 1)]] = True
    rows = np.zeros((4, 3, features.num_features("v3")), np.float32)
    rows[:, program, features.feature_names("v3").index("tool_ran")] = printed
    rules = headroom.program_rules({"joints": joints, "outcome": outcome, "rows": rows}, program)
    (vote_rule, else_vote), (debate_rule, else_debate) = rules.items()
    assert "else the vote" in vote_rule and "else the debate" in debate_rule
    assert else_vote.tolist() == [True, True, True, False] and else_debate.tolist() == [True, True, False, True]

def test_the_policy_search_finds_a_planted_policy(trees):
    """An outcome table that is right only when every agent plays a planted policy of its state: exhaustive search
    (3 actions) and coordinate ascent (5 actions, 12 states) both find it."""
    rng = np.random.default_rng(1)
    for actions, states in ((3, 6), (5, 12)):
        planted = rng.integers(actions, size=states)
        state = rng.integers(states, size=(400, 3))
        joints = np.array(list(itertools.product(range(actions), repeat=3)))
        tree = {"outcome": np.zeros((400, len(joints)), bool), "actions": actions, "joints": joints}
        tree["outcome"][np.arange(400), trees.joint_index(tree, planted[state])] = True
        found = trees.best_policy(tree, state, states, np.arange(400))
        assert trees.policy_table(tree, state, found[None]).mean() == 1.0
        assert trees.exhaustive(actions, states) == (actions == 3)



def test_one_policy_per_role_is_found_where_roles_play_differently(trees):
    """Roles read off the v3 role columns; a planted policy that differs by role, found by coordinate ascent."""
    from deliberation_env.core import features

    names = features.feature_names("v3")
    rows = np.zeros((300, 3, len(names)), np.float32)
    for agent, role in enumerate((0, 2, 0)):
        rows[:, agent, names.index(f"role_{role}")] = 1
    groups = trees.role_groups({"rows": rows})
    assert groups.tolist() == [0, 1, 0]
    assert trees.role_groups({"rows": np.zeros_like(rows)}).tolist() == [0, 0, 0]
    rng = np.random.default_rng(2)
    joints = np.array(list(itertools.product(range(5), repeat=3)))
    tree = {"agree": rng.integers(3, size=(300, 3)), "rows": rows, "actions": np.int64(5), "joints": joints,
            "outcome": np.zeros((300, len(joints)), bool)}
    tree["rows"][:, :, 0] = rng.random((300, 3))  # a signal, split at its median
    tree["peers"] = np.stack([rows[:, [(a + 1) % 3, (a + 2) % 3]] for a in range(3)], axis=1)
    state, states = trees.state_of(tree, 0, 0.5, peer_bit=True, groups=groups)
    assert states == 3 * 2 * 2 * 2 and state.max() < states
    planted = rng.integers(5, size=states)
    tree["outcome"][np.arange(300), trees.joint_index(tree, planted[state])] = True
    found = trees.best_policy(tree, state, states, np.arange(300))
    assert trees.policy_table(tree, state, found[None]).mean() == 1.0
    # three roles of 12 states: 5 ** 36 policies, which numpy's power once wrapped around to a small number
    assert not trees.exhaustive(np.int64(5), 36) and trees.exhaustive(np.int64(3), 9)

def test_the_headroom_columns_are_ordered(sim_set, trees):
    from bench.studies import headroom
    rows, tree, notes, rules = headroom.rows_of(str(sim_set.path), ["test"], repeats=2)
    assert rules == []  # no program-aided agent in the team
    assert {row["rule"] for row in rows} == {"most_confident", "plurality", "chosen"} and not notes
    for row in rows:
        if row.get("same_as_previous"):
            continue
        assert row["oracle"] >= row["ceiling"] - 1e-9 and row["oracle"] >= row["in_sample"] - 1e-9
        assert 0 <= row["vote"] <= row["oracle"] and 0 <= row["debate"] <= row["oracle"]
        assert row["gain_low"] <= row["policy"] - row["protocol"] <= row["gain_high"]
    assert {name for name, *_ in headroom.verifier_table(tree, resamples=50)} >= {"confidence"}
    # the interval's per-problem outcomes average to the columns it brackets
    room, protocol = trees.headroom(tree, {"none": None}, repeats=3), trees.best_constant(tree, repeats=3)
    assert room["per_problem"].shape == protocol["per_problem"].shape == (len(tree["outcome"]),)
    assert np.isclose(room["per_problem"].mean(), room["cross_validated"])
    assert np.isclose(protocol["per_problem"].mean(), protocol["cross_validated"])



def test_the_shared_protocol_family_holds_only_joint_actions_every_agent_plays(trees):
    joints = np.array(list(itertools.product(range(3), repeat=3)))
    outcome = np.zeros((40, len(joints)), bool)
    outcome[:, 5] = True  # an asymmetric joint action (0, 1, 2) is right everywhere
    outcome[:30, 13] = True  # every agent REFINEs: right on 30 of 40
    tree = {"outcome": outcome, "joints": joints, "actions": 3}
    assert tuple(joints[5]) == (0, 1, 2) and tuple(joints[13]) == (1, 1, 1)
    every, shared = trees.best_constant(tree, repeats=2), trees.best_constant(tree, repeats=2, shared=True)
    assert every["joint"] == (0, 1, 2) and every["cross_validated"] == 1.0
    assert shared["joint"] == (1, 1, 1) and shared["cross_validated"] == 0.75

def test_the_nested_protocol_chooses_its_family_on_training_folds_only(trees):
    joints = np.array(list(itertools.product(range(3), repeat=3)))
    outcome = np.zeros((60, len(joints)), bool)
    tree = {"outcome": outcome, "joints": joints, "actions": 3}
    # where one family is planted better on every problem, every fold's inner split finds it
    outcome[:, 13] = True  # every agent REFINEs: right everywhere
    planted = trees.best_constant(tree, repeats=2, nested=True)
    assert planted["joint"] == (1, 1, 1) and planted["cross_validated"] == 1.0
    outcome[:, 13] = False
    outcome[:, 5] = True  # an asymmetric joint action, only in the family of every joint action
    planted = trees.best_constant(tree, repeats=2, nested=True)
    assert planted["joint"] == (0, 1, 2) and planted["cross_validated"] == 1.0


def test_a_rule_only_set_is_listed_as_not_recorded_for_other_rules(tmp_path):
    out = tmp_path / "rule-only"
    record(["--out", str(out), "--split", "test", "--problems", "0:6", "--concede-targets", "rule", *SIM_FLAGS])
    from bench.studies import headroom
    rows, _, notes, _ = headroom.rows_of(str(out), ["test"], repeats=1)
    assert {row["rule"] for row in rows} == {"most_confident"}
    assert any("plurality: not recorded" in note for note in notes) and any("chosen: not recorded" in n for n in notes)


def test_the_checking_tools_auroc_is_also_given_where_a_program_ran():
    """A perfect check that runs on some answers only: over every answer its verdict mixes 'no program' with 'the
    program disagreed'; among the answers whose program ran it separates right from wrong exactly."""
    from deliberation_env.core import features

    names = features.feature_names("v3")
    rng = np.random.default_rng(2)
    right = rng.random((40, 3)) < 0.5
    rows = np.zeros((40, 3, len(names)))
    ran = rng.random((40, 3)) < 0.4
    rows[:, :, names.index("tool_ran")] = ran
    rows[:, :, names.index("tool_agrees")] = ran & right
    from bench.studies import headroom
    table = {name: (value, n) for name, value, _, _, n in headroom.verifier_table(
        {"rows": rows, "correct0": right, "confidence": rng.random((40, 3))}, resamples=20)}
    assert table["tool_agrees where the tool ran"] == (1.0, int(ran.sum()))
    assert table["tool_agrees"][0] < 0.95 and table["tool_agrees"][1] == 120
