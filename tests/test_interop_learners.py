"""Real RL libraries train on the env with zero glue: their documented calls and our construction options only.

Each test trains a few thousand steps and checks that the greedy policy beats random legal play on the
same 300 seeded episodes (paired difference, mean - 3 standard errors > 0). Recipes: docs/interop.md.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import supersuit as ss
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.utils import set_random_seed
from tensordict.nn import TensorDictModule
from torch.distributions import Categorical
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs.libs.pettingzoo import PettingZooWrapper
from torchrl.modules import MultiAgentMLP, ProbabilisticActor
from torchrl.objectives import ClipPPOLoss, ValueEstimators

import deliberation_env

EVAL_SEEDS = range(1000, 1300)


def team_returns(policy, seeds) -> np.ndarray:
    """Per-episode sum of all agents' rewards, the same problems for every policy (seeded resets)."""
    env = deliberation_env.parallel_env(observation="flat", split="test")  # trained on "train", the default
    returns = []
    for seed in seeds:
        observations, _ = env.reset(seed=seed)
        rng, total = np.random.default_rng(seed), 0.0
        while env.agents:
            observations, rewards, _, _, _ = env.step({a: policy(observations[a], rng) for a in env.agents})
            total += sum(rewards.values())
        returns.append(total)
    return np.array(returns)


@pytest.fixture
def one_torch_thread():
    """Tiny MLP updates: two intra-op threads on a busy 2-core machine made training 13x slower (34 s vs 2.6 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_beats_random_legal(policy) -> None:
    learned = team_returns(policy, EVAL_SEEDS)
    random_legal = team_returns(lambda obs, rng: int(rng.choice(np.flatnonzero(obs[-3:]))), EVAL_SEEDS)
    difference = learned - random_legal  # paired: same problems and episode seeds
    standard_error = difference.std(ddof=1) / np.sqrt(len(difference))
    assert difference.mean() - 3 * standard_error > 0, (learned.mean(), random_legal.mean(), standard_error)


def test_sb3_ppo_on_flat_observations_beats_random_legal_play(one_torch_thread, tmp_path, monkeypatch):
    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path))  # SB3 otherwise leaves an empty SB3-<time> folder in /tmp per run
    set_random_seed(0)
    # The recipe of docs/interop.md: observation="flat" (a Box; masked actions become PERSIST), SuperSuit, PPO.
    env = deliberation_env.parallel_env(observation="flat")
    # SB3 resets the vector env without a seed (SuperSuit's wrapper has no way to pass one), so each run drew its
    # problems from fresh entropy, and one such run learned a policy worse than random. Seeded here, every later
    # reset continues this stream: the same training run every time.
    env.reset(seed=0)
    vec = ss.pettingzoo_env_to_vec_env_v1(env)
    vec = ss.concat_vec_envs_v1(vec, 4, num_cpus=0, base_class="stable_baselines3")
    model = PPO("MlpPolicy", vec, n_steps=64, batch_size=256, verbose=0)
    model.learn(total_timesteps=3000)
    assert_beats_random_legal(lambda obs, rng: int(model.predict(obs, deterministic=True)[0]))


def test_sb3_trained_on_fit_is_scored_on_its_cell(one_torch_thread, tmp_path, monkeypatch):
    """docs/interop.md's benchmark recipe: SB3 on the cell's game on `fit`, scored as it is by `score`, exactly as it
    plays greedily through the env (no flattening by hand)."""
    from baselines.benchmark import parse_cell, score
    from baselines.evaluation.evaluate import play_episodes

    monkeypatch.setenv("SB3_LOGDIR", str(tmp_path))
    set_random_seed(0)
    env = deliberation_env.replay_env("qwen05-arith-v2", "fit", observation="flat", features="v2")
    env.reset(seed=0)
    vec = ss.concat_vec_envs_v1(ss.pettingzoo_env_to_vec_env_v1(env), 4, num_cpus=0, base_class="stable_baselines3")
    model = PPO("MlpPolicy", vec, n_steps=64, batch_size=256, verbose=0)
    model.learn(total_timesteps=512)
    report = score(model, "qwen05-arith-v2:v2", label="sb3-ppo")
    assert str(report).startswith("sb3-ppo on qwen05-arith-v2:v2 (test, 400 problems, 1 run(s))")

    class Greedy:
        def reset(self, seed=None):
            pass

        def act(self, observations, infos):
            return {a: int(model.predict(o, deterministic=True)[0]) for a, o in observations.items()}

    test = parse_cell("qwen05-arith-v2:v2").env("test", observation="flat")
    played = play_episodes([test], [Greedy()], [(0, p) for p in range(len(test.problems))])
    assert np.array_equal(report.runs[0].accuracy, [float(r["correct"]) for r in played])


def test_torchrl_ppo_shared_policy_beats_random_legal_play(one_torch_thread):
    torch.manual_seed(0)
    agents, frames = 3, 600

    def make_env():  # infos="numeric": TorchRL turns every info into a tensor (strings and None fail)
        env = deliberation_env.parallel_env(observation="flat", infos="numeric", num_agents=agents)
        return PettingZooWrapper(env, categorical_actions=True, return_state=False, seed=0)

    size = make_env().observation_spec["agent", "observation"].shape[-1]
    mlp = functools.partial(MultiAgentMLP, n_agents=agents, centralised=False, share_params=True, depth=2, num_cells=64)
    actor = TensorDictModule(mlp(size, 3), in_keys=[("agent", "observation")], out_keys=[("agent", "logits")])
    policy = ProbabilisticActor(actor, in_keys=[("agent", "logits")], out_keys=[("agent", "action")],
                                distribution_class=Categorical, return_log_prob=True)
    critic = TensorDictModule(mlp(size, 1), in_keys=[("agent", "observation")], out_keys=[("agent", "state_value")])
    loss = ClipPPOLoss(policy, critic, entropy_coeff=0.01, normalize_advantage=False)
    loss.set_keys(reward=("agent", "reward"), action=("agent", "action"), value=("agent", "state_value"),
                  done=("agent", "done"), terminated=("agent", "terminated"), sample_log_prob=("agent", "action_log_prob"))
    loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.95)
    optim = torch.optim.Adam(loss.parameters(), 3e-4)
    buffer = ReplayBuffer(storage=LazyTensorStorage(frames), sampler=SamplerWithoutReplacement(), batch_size=200)
    for data in Collector(make_env, policy, frames_per_batch=frames, total_frames=6 * frames):
        with torch.no_grad():
            loss.value_estimator(data, params=loss.critic_network_params, target_params=loss.target_critic_network_params)
        buffer.extend(data.reshape(-1))
        for _ in range(4 * frames // 200):
            terms = loss(buffer.sample())
            (terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]).backward()
            optim.step()
            optim.zero_grad()

    def greedy(obs, rng):
        with torch.no_grad():  # the shared network, fed one agent's row
            return int(actor.module(torch.as_tensor(obs).expand(agents, -1)[None])[0, 0].argmax())

    assert_beats_random_legal(greedy)
