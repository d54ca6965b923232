"""The compiled-tree engine plays the PettingZoo env's game: every joint action of sampled problems of every shipped
set and game, every joint-action sequence of a 2-round set, the cache's staleness checks, and exact evaluation
against sampled play."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from deliberation_env.core.seeds import stream_seed
from deliberation_env.engine import StaleTree, TreeEnv, compile_tree, expected_scores, greedy_probabilities
from deliberation_env.engine import tree as tree_module
from deliberation_env.make import replay_env
from deliberation_env.record import main as record
from deliberation_env.replay import ReplaySet

SIM_FLAGS = ["--backend", "sim", "--task-option", "levels=[0,1]", "--max-tokens", "64", "--agents", "3"]
INFO_KEYS = ("consensus_correct", "correct", "tokens", "tokens_total", "oracle_action")
GAMES = {  # every shipped set and the games the suite plays on it (and other recorded confidence sources and rules)
    "qwen05-arith": [{"features": "v1"}, {"features": "v2"}, {"features": "v2", "confidence": "answer_logprobs"}],
    "qwen05-arith-v2": [{"features": "v1"}, {"features": "v2"}, {"features": "v3", "concede_to_peer": True},
                        {"features": "v2", "confidence": "critic", "concede_target": "plurality"}],
    "qwen05-team-arith": [{"features": "v1"}, {"features": "v2"}, {"features": "v3", "concede_to_peer": True}],
}
CASES = [(name, game) for name, games in GAMES.items() for game in games]


def assert_same_step(env, tree_obs, row, observations, infos, rewards=None, tree_rewards=None, tree_info=None):
    """The env's outputs for every agent equal row ``row`` of the tree env's batch."""
    for k, agent in enumerate(env.possible_agents):
        for key, value in observations[agent].items():
            assert np.array_equal(value, tree_obs[key][row, k]), (agent, key)
        if tree_info is not None:
            for key in INFO_KEYS:
                assert infos[agent][key] == tree_info[key][row if key == "consensus_correct" else (row, k)], (agent, key)
        if rewards is not None:
            assert rewards[agent] == pytest.approx(float(tree_rewards[row, k]), abs=1e-6)
            for name in env.config.reward_weights:
                assert infos[agent][f"reward_{name}"] == pytest.approx(float(tree_info[f"reward_{name}"][row, k]))


def compare_every_sequence(tree, env, problems, seeds, rounds):
    """Every joint-action sequence of ``rounds`` rounds on problem index ``problems`` x episode ``seeds``: the tree env
    (one episode per sequence, in one batch) against the env (one by one). Returns the episodes compared."""
    joints = tree.joint_actions()
    sequences = list(itertools.product(range(len(joints)), repeat=rounds))
    compared = 0
    for problem, seed in itertools.product(problems, seeds):
        batch = TreeEnv(tree, len(sequences), invalid_action="persist")
        tree_obs, tree_info = batch.reset(seeds=[seed] * len(sequences), problems=[problem] * len(sequences))
        steps = [(tree_obs, None, None, tree_info)]
        for depth in range(rounds):
            actions = joints[[sequence[depth] for sequence in sequences]]
            tree_obs, tree_rewards, done, _, tree_info = batch.step(actions)
            steps.append((tree_obs, tree_rewards, done, tree_info))
        for row, sequence in enumerate(sequences):
            observations, infos = env.reset(seed=seed, options={"problem_index": problem})
            assert_same_step(env, steps[0][0], row, observations, infos, tree_info=steps[0][3])
            for depth, j in enumerate(sequence):
                if not env.agents:
                    assert steps[depth][2][row]  # the tree ended the episode too
                    break
                observations, rewards, terminations, _, infos = env.step(dict(zip(env.possible_agents, joints[j].tolist())))
                obs_t, rewards_t, done_t, info_t = steps[depth + 1]
                assert_same_step(env, obs_t, row, observations, infos, rewards, rewards_t, info_t)
                assert all(terminations.values()) == bool(done_t[row])
            compared += 1
    return compared


@pytest.mark.parametrize("name,game", CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in g.items())}" for n, g in CASES])
def test_the_tree_env_plays_every_joint_action_of_every_shipped_set_and_game_as_the_env(name, game):
    tree = compile_tree(name, "test", problems=[0, 37, 211], cache=False, **game)
    env = replay_env(name, "test", invalid_action="persist", **game)
    subset = [env.problems.index(next(p for p in env.problems if p.id == pid)) for pid in tree.problem_ids]
    subset_env = replay_env(name, "test", invalid_action="persist", **game)
    subset_env.problems = [env.problems[i] for i in subset]  # the tree's problem indices are the subset's
    assert tree.num_joint == (27 if not game.get("concede_to_peer") else 125)
    assert compare_every_sequence(tree, subset_env, range(3), [0], rounds=1) == 3 * tree.num_joint


@pytest.fixture(scope="module")
def two_round_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("sets") / "sim-2-rounds"
    record(["--out", str(out), "--split", "test", "--problems", "0:3", "--streams", "2", "--rounds", "2",
            "--concede-targets", "rule", *SIM_FLAGS])
    return ReplaySet(out)


@pytest.mark.parametrize("game", [{"features": "v2"}, {"features": "v1", "early_stop": True}])
def test_every_two_round_sequence_of_a_recorded_sim_set_plays_alike(two_round_set, game):
    tree = compile_tree(two_round_set, "test", cache=False, **game)
    env = replay_env(two_round_set, "test", invalid_action="persist", **game)
    assert tree.max_rounds == 2 and tree.streams == 2
    # seeds 0..3 reach both streams (the stream is the episode seed modulo 2)
    streams = {int(np.random.default_rng(seed).integers(0, 2**62)) % 2 for seed in range(4)}
    assert streams == {0, 1}
    assert compare_every_sequence(tree, env, range(2), range(4), rounds=2) == 2 * 4 * 27 ** 2
    if game.get("early_stop"):  # all PERSIST on a unanimous team ends the episode after round 1
        assert tree.done[:, 0].any() and not tree.done[:, 1:].all()


def test_seeded_resets_draw_the_env_s_problems_and_streams(two_round_set):
    tree = compile_tree(two_round_set, "test", cache=False)
    env = replay_env(two_round_set, "test")
    seeds = list(range(40))
    _, info = TreeEnv(tree, len(seeds)).reset(seeds=seeds)
    drawn = []
    for seed in seeds:
        env.reset(seed=seed)
        drawn.append((env.deliberation.problem.id, env.deliberation.seed))
    assert [tree.problem_ids[p] for p in info["problem"]] == [problem for problem, _ in drawn]
    assert len(set(info["stream"].tolist())) == 2


def env_draws(env, episodes, seed=None, options=None):
    """(problem id, stream) of the env's next ``episodes`` resets: the first with ``seed``, the others unseeded;
    ``options``: each reset's (a list) or every reset's."""
    drawn = []
    for episode in range(episodes):
        env.reset(seed=seed if episode == 0 else None, options=options[episode] if isinstance(options, list) else options)
        problem = env.deliberation.problem.id  # the episode runs on its stream's seed (core.seeds.stream_seed)
        streams = [s for s in range(env.config.streams) if stream_seed(s, problem, env.config.request_format) ==
                   env.deliberation.seed]
        drawn.append((problem, streams[0]))
    return drawn


def tree_draws(tree, info, rows=None):
    """(problem id, stream) of the given rows' episodes (all rows by default)."""
    rows = range(len(info["problem"])) if rows is None else rows
    return [(tree.problem_ids[info["problem"][i]], int(info["stream"][i])) for i in rows]


def test_a_seeded_batch_plays_the_env_s_episodes_after_that_seed_and_reset_done_continues_them(two_round_set):
    tree = compile_tree(two_round_set, "test", cache=False)
    env = replay_env(two_round_set, "test")
    expected = env_draws(env, 48, seed=7)  # the env's reset(seed=7), then 47 unseeded resets
    batch = TreeEnv(tree, 16)
    _, info = batch.reset(seed=7)
    assert tree_draws(tree, info) == expected[:16]
    assert len(set(expected[:16])) == 6  # every problem and stream of the set is among them
    rng = np.random.default_rng(0)
    while not batch.ended.all():
        batch.step(batch.sample_actions(rng))
    first = np.arange(16) % 3 == 0
    _, info = batch.reset_done(which=first)  # the restarted rows take the stream's next episodes, in row order
    assert tree_draws(tree, info, np.flatnonzero(first)) == expected[16:22]
    assert batch.ended.sum() == 10 and not batch.ended[first].any()
    _, info = batch.reset_done()
    assert tree_draws(tree, info, np.flatnonzero(~first)) == expected[22:32]
    _, info = batch.reset()  # an unseeded reset continues the stream, as the env's does
    assert tree_draws(tree, info)[:16] == expected[32:48]
    _, info = batch.reset(seed=7)  # a seed starts it again
    assert tree_draws(tree, info) == expected[:16]
    fixed = [None, 1, None, 2, None]  # a fixed problem skips the problem's draw, as the env's option does
    _, info = TreeEnv(tree, 5).reset(seed=3, problems=fixed)
    assert tree_draws(tree, info) == env_draws(env, 5, seed=3, options=[
        None if p is None else {"problem_index": p} for p in fixed])


UNSEEDED = """
import sys
from deliberation_env.engine import CompiledTree, TreeEnv
tree = CompiledTree.load(sys.argv[1])
for env in (TreeEnv(tree, 24), TreeEnv(tree, 24)):
    _, info = env.reset()
    print(info["problem"].tolist(), info["stream"].tolist())
"""


def test_an_unseeded_tree_env_draws_a_stream_of_its_own_the_same_on_every_run(two_round_set, tmp_path):
    tree = compile_tree(two_round_set, "test", cache=False)
    tree.save(tmp_path / "tree.npz")
    runs = [subprocess.run([sys.executable, "-c", UNSEEDED, str(tmp_path / "tree.npz")], capture_output=True,
                           text=True, check=True).stdout.splitlines() for _ in range(2)]
    assert runs[0] == runs[1]  # never OS entropy: the same episodes on every run of a program
    assert runs[0][0] != runs[0][1]  # two envs of a process draw streams of their own


def test_a_masked_action_is_played_as_persist_or_raises_when_asked():
    tree = compile_tree("qwen05-arith-v2", "test", problems=[0, 1, 2, 3, 4, 5], cache=False)
    masked = np.argwhere(tree.mask[tree.roots[:, 0]] == 0)
    assert len(masked), "no masked CONCEDE among these roots"
    problem, agent, action = masked[0]
    env = TreeEnv(tree, 1, invalid_action="raise")
    env.reset(seeds=[0], problems=[int(problem)])
    actions = np.zeros((1, 3), np.int64)
    actions[0, agent] = action
    with pytest.raises(ValueError, match="masked"):
        env.step(actions)
    lenient = TreeEnv(tree, 1, invalid_action="persist")
    lenient.reset(seeds=[0], problems=[int(problem)])
    _, rewards, _, _, info = lenient.step(actions)
    lenient.reset(seeds=[0], problems=[int(problem)])
    _, rewards_persist, _, _, info_persist = lenient.step(np.zeros((1, 3), np.int64))
    assert np.array_equal(rewards, rewards_persist) and info["node"] == info_persist["node"]


def test_a_cached_tree_is_reused_and_a_stale_one_is_compiled_again(two_round_set, tmp_path, monkeypatch):
    monkeypatch.setenv("DELIBERATION_ENV_CACHE", str(tmp_path))
    first = compile_tree(two_round_set, "test", features="v2")
    files = list((tmp_path / "trees").glob("*.npz"))
    assert len(files) == 1
    again = compile_tree(two_round_set, "test", features="v2")
    assert again.key == first.key and np.array_equal(again.rows, first.rows)
    # another game, another key and file
    compile_tree(two_round_set, "test", features="v1")
    assert len(list((tmp_path / "trees").glob("*.npz"))) == 2
    # a cached tree whose arrays no longer match what the env plays is not used
    tampered = tree_module.CompiledTree.load(files[0])
    tampered.rows[:] = 0.0
    tampered.save(files[0])
    with pytest.raises(StaleTree, match="stale"):
        tree_module.verify(tampered, tree_module.reference_env(two_round_set, "test", {"features": "v2"}), 4)
    fixed = compile_tree(two_round_set, "test", features="v2")
    assert np.array_equal(fixed.rows, first.rows)
    assert np.array_equal(tree_module.CompiledTree.load(files[0]).rows, first.rows)  # rewritten
    # a change to the code that decides outcomes changes the key, so the cache is not consulted
    monkeypatch.setattr(tree_module, "code_fingerprint", lambda: "another-version")
    assert compile_tree(two_round_set, "test", features="v2").key != first.key


def uniform(observations, nodes):
    mask = observations["action_mask"].astype(np.float64)
    return mask / mask.sum(-1, keepdims=True)


def test_exact_evaluation_agrees_with_sampled_play(two_round_set):
    tree = compile_tree(two_round_set, "test", cache=False)
    exact = expected_scores(tree, uniform)
    env = TreeEnv(tree, 200_000)
    rng = np.random.default_rng(0)
    observations, info = env.reset(seed=1)
    problems, tokens = info["problem"], info["tokens"].sum(-1).astype(np.float64)
    while not env.ended.all():
        probabilities = uniform(observations, None)
        actions = (probabilities.cumsum(-1) < rng.random(probabilities.shape[:-1])[..., None]).sum(-1)
        observations, _, _, _, info = env.step(actions)
        tokens += np.where(info["live"], info["tokens"].sum(-1), 0)
    right = info["consensus_correct"]
    weights = np.full(len(tree.problem_ids), 1 / len(tree.problem_ids))
    for p in range(len(tree.problem_ids)):
        mine = problems == p
        se = right[mine].std() / np.sqrt(mine.sum())
        assert abs(right[mine].mean() - exact["accuracy"][p]) < 4 * se + 1e-9
        assert abs(tokens[mine].mean() - exact["tokens"][p]) < 4 * tokens[mine].std() / np.sqrt(mine.sum()) + 1e-6
    assert weights @ exact["accuracy"] == pytest.approx(right.mean(), abs=0.01)


def test_a_greedy_policy_s_exact_score_is_what_the_env_plays():
    tree = compile_tree("qwen05-arith-v2", "test", problems=range(40), cache=False)

    def confident_persist(observations, nodes):  # PERSIST when confident, else CONCEDE if allowed, else REFINE
        confidence = observations["self"][..., 3]
        prefer = np.where(confidence >= 0.6, 0, np.where(observations["action_mask"][..., 2] > 0, 2, 1))
        return np.eye(3)[prefer]

    exact = expected_scores(tree, lambda o, n: greedy_probabilities(confident_persist(o, n)))
    env = replay_env("qwen05-arith-v2", "test")
    played = []
    for problem_id in tree.problem_ids:
        observations, _ = env.reset(seed=0, options={"problem_id": problem_id})
        batch = {key: np.stack([observations[a][key] for a in env.possible_agents])[None] for key in observations["agent_0"]}
        actions = confident_persist(batch, None)[0].argmax(-1)
        _, _, _, _, infos = env.step(dict(zip(env.possible_agents, actions.tolist())))
        played.append(infos["agent_0"]["consensus_correct"])
    assert np.array_equal(exact["accuracy"], np.array(played, float))


def test_the_gymnasium_vector_form_restarts_episodes_on_the_next_step(two_round_set):
    from deliberation_env.engine.gym import TreeVectorEnv

    tree = compile_tree(two_round_set, "test", cache=False)
    envs = TreeVectorEnv(tree, num_episodes=64)
    assert envs.num_envs == 64 * 3 and envs.single_action_space.n == 3
    observations, info = envs.reset(seed=3)
    assert observations.shape == (envs.num_envs, *envs.single_observation_space.shape)
    assert np.array_equal(info["action_mask"], observations[:, -3:])  # the flat form ends with the mask
    rng = np.random.default_rng(0)
    round_column = tree.num_features - 1  # the "round" feature: rounds played / max_rounds
    for step in range(6):
        mask = info["action_mask"].astype(float)
        actions = ((mask / mask.sum(1, keepdims=True)).cumsum(1) < rng.random((envs.num_envs, 1))).sum(1)
        nodes = envs.engine.node.copy()
        observations, rewards, terminations, truncations, info = envs.step(actions)
        if step % 3 == 2:  # the step after an ending: every episode restarts, no reward, round 0
            assert not terminations.any() and not rewards.any()
            assert (observations[:, round_column] == 0).all()
            continue
        joint = tree.joint_index(actions.reshape(64, 3))
        edges = tree.expand[nodes]
        assert np.allclose(rewards.reshape(64, 3), tree.rewards[edges, joint])  # the tree's rewards for these actions
        assert terminations.all() == (step % 3 == 1) and not truncations.any()  # 2 rounds, no early stop


def test_sampled_actions_are_legal_and_uniform_over_the_legal_ones():
    tree = compile_tree("qwen05-arith-v2", "test", problems=range(8), cache=False)
    env = TreeEnv(tree, 40_000)
    env.reset(seed=0)
    legal = tree.mask[env.node].astype(bool)  # (B, N, A)
    assert (legal.sum(-1) == 2).any() and (legal.sum(-1) == 3).any()  # CONCEDE masked for some agents, not all
    actions = env.sample_actions(np.random.default_rng(1))
    assert np.take_along_axis(legal, actions[..., None], -1).all()
    for count in (2, 3):  # each legal action about 1/count of the picks, within 5 standard errors
        mine = legal.sum(-1) == count
        picks = legal[mine].cumsum(-1)[np.arange(mine.sum()), actions[mine]] - 1  # which of the legal ones
        shares = np.bincount(picks, minlength=count) / mine.sum()
        assert np.abs(shares - 1 / count).max() < 5 * np.sqrt((1 / count) * (1 - 1 / count) / mine.sum())


def test_a_step_without_observations_leaves_them_to_reset_done(two_round_set):
    tree = compile_tree(two_round_set, "test", cache=False)
    env = TreeEnv(tree, 32)
    env.reset(seed=5)
    rng = np.random.default_rng(0)
    observed, _, _, _, info = env.step(env.sample_actions(rng), observe=False)
    assert observed is None and info["tokens_total"].shape == (32, 3)
    nodes = env.node.copy()
    observations, _ = env.reset_done()  # nobody ended after round 1 of 2: the same nodes, observed now
    assert np.array_equal(env.node, nodes)
    again = env.observe(nodes)
    for key, value in observations.items():
        assert np.array_equal(value, again[key]), key
    assert np.array_equal(observations["peers"][:, 0, 0], observations["self"][:, 1])  # agent 0's first peer: agent 1
    with pytest.raises(ValueError, match="read-only"):  # "self" and "peers" are views of one buffer
        observations["self"][0, 0, 0] = 1.0


def test_the_engine_benchmark_needs_only_the_train_extra_and_names_the_one_it_lacks(tmp_path):
    script = Path(__file__).resolve().parents[1] / "bench" / "benchmark" / "engine_throughput.py"
    results = script.parents[1] / "results" / "engine_throughput.md"
    before = results.stat().st_mtime_ns if results.exists() else None
    (tmp_path / "pygame.py").write_text('raise ImportError("No module named pygame")\n')  # as if pygame were absent
    path = os.pathsep.join([str(tmp_path), str(script.parents[2]), os.environ.get("PYTHONPATH", "")])
    environment = {**os.environ, "PYTHONPATH": path, "PYTHONDONTWRITEBYTECODE": "1"}
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=tmp_path,
                           env=environment)
    assert shown.returncode == 0 and "--baseline" in shown.stdout, shown.stderr
    run = subprocess.run([sys.executable, str(script), "--trainers"], capture_output=True, text=True, cwd=tmp_path,
                         env=environment)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and ".[bench]" in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pygame.py"]  # nothing written where it ran
    assert (results.stat().st_mtime_ns if results.exists() else None) == before
