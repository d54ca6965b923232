"""Batched rollouts and evaluation: many episodes per backend call, the same numbers as one env at a time."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from pettingzoo import ParallelEnv

import deliberation_env
from baselines.evaluation import evaluate
from baselines.evaluation.evaluate import episode_seed, evaluate_entries
from baselines.meta.evaluate import standard_entries
from baselines.meta.policy import Policy, agent_layout, save_checkpoint
from baselines.meta.rollout import EpisodeSpec, collect
from deliberation_env.backends import CachedBackend, SimBackend
from deliberation_env.protocols import PROTOCOLS


class CountingBackend:
    """A SimBackend that records the size of every generate call."""

    def __init__(self):
        self.inner, self.calls = SimBackend(), []

    def identity(self) -> str:
        return self.inner.identity()

    def generate(self, requests):
        self.calls.append(len(requests))
        return self.inner.generate(requests)


class Delegate(ParallelEnv):
    """A foreign PettingZoo env (not a DeliberationEnv) that forwards to one: collect steps it one by one."""

    metadata = {"name": "delegate"}

    def __init__(self, env):
        self.env, self.possible_agents = env, env.possible_agents

    @property
    def agents(self):
        return self.env.agents

    def observation_space(self, agent):
        return self.env.observation_space(agent)

    def action_space(self, agent):
        return self.env.action_space(agent)

    def reset(self, seed=None, options=None):
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        return self.env.step(actions)


def sequential_seed(env, actor, problems: int, seed: int) -> dict[str, float]:
    """The reference: one env, problem after problem, plain reset/step (the evaluation before batching)."""
    correct = score = tokens = 0.0
    actions: Counter = Counter()
    for index in range(problems):
        actor.reset(episode_seed(seed, index))
        obs, infos = env.reset(seed=episode_seed(seed, index), options={"problem_index": index})
        tokens += sum(info["tokens"] for info in infos.values())
        total = 0.0
        while env.agents:
            chosen = actor.act(obs, infos)
            actions.update(chosen.values())
            obs, rewards, _, _, infos = env.step(chosen)
            total += sum(rewards.values())
            tokens += sum(info["tokens"] for info in infos.values())
        correct += next(iter(infos.values()))["consensus_correct"]
        score += total / len(env.possible_agents)
    shares = {f"p_{name}": actions[i] / sum(actions.values()) for i, name in enumerate(evaluate.ACTION_NAMES)}
    return {"accuracy": correct / problems, "score": score / problems, "tokens": tokens / problems, **shares}


@pytest.fixture(scope="module")
def sampled_policy(tmp_path_factory):
    """An untrained policy whose sampled actions (--sample) exercise each episode's own RNG stream."""
    torch.manual_seed(5)
    policy = Policy(agent_layout(deliberation_env.parallel_env()), hidden=16)
    path = tmp_path_factory.mktemp("policy") / "policy.pt"
    save_checkpoint(str(path), policy, "test", {})
    return str(path)


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_batched_evaluation_equals_sequential(sampled_policy, batch_size):
    problems, seeds = 12, [0, 3]
    env_kwargs = {"task": "arithmetic", "backend": "sim", "split": "test", "max_rounds": 2}
    entries = standard_entries({"sampled": sampled_policy}, PROTOCOLS, env_kwargs, deterministic=False)
    rows = evaluate_entries(entries, problems, seeds, batch_size=batch_size)
    for (name, make_actor, make_env), row in zip(entries, rows):
        runs = [sequential_seed(make_env(), make_actor(), problems, s) for s in seeds]
        for key in runs[0]:  # the point metrics; the intervals come from the same per-episode records
            assert row[key] == pytest.approx(sum(r[key] for r in runs) / len(runs), abs=1e-12), (name, key)
        assert row["accuracy_low"] <= row["accuracy"] <= row["accuracy_high"]


def test_batched_evaluation_answers_many_episodes_per_backend_call():
    backend = CountingBackend()
    entries = standard_entries({}, ["debate"], {"backend": backend, "max_rounds": 2})
    evaluate_entries(entries, problems=8, seeds=[0, 1], batch_size=16)
    # 16 episodes x 3 agents: one solve call and one critic call for round 0, one refine + critic per round
    assert backend.calls == [48] * 6


def test_shared_cache_answers_round_zero_once_across_protocols(tmp_path):
    problems, seeds = 10, [0, 1]
    episodes = problems * len(seeds)
    cache = CachedBackend(SimBackend(), tmp_path / "cache.sqlite")
    env_kwargs = {"task": "arithmetic", "backend": cache, "split": "test"}
    rows = evaluate_entries(standard_entries({}, PROTOCOLS, env_kwargs), problems, seeds, batch_size=8, cache=cache)
    by_name = {row["name"]: row for row in rows}
    # round 0 = a solve and a critic call per agent; `single` (one agent) goes first and pays for agent_0's
    assert by_name["single"]["cache_hits"] == 0 and by_name["single"]["cache_misses"] == 2 * episodes
    assert by_name["self_consistency"]["cache_hits"] == 2 * episodes
    assert by_name["self_consistency"]["cache_misses"] == 4 * episodes
    for name in ("debate", "threshold", "random", "oracle"):
        assert by_name[name]["cache_hits"] >= 6 * episodes, name
    uncached = evaluate_entries(standard_entries({}, PROTOCOLS, {"task": "arithmetic", "split": "test"}), problems, seeds)
    for row, plain in zip(rows, uncached):
        assert {k: v for k, v in row.items() if not k.startswith("cache_")} == plain


def test_collect_batches_deliberation_envs_and_keeps_their_results():
    specs = [EpisodeSpec(seed, group) for group, seed in enumerate([11, 12, 13, 14, 15]) for _ in range(2)]
    backend = CountingBackend()
    batched = [deliberation_env.parallel_env(backend=backend, split="train") for _ in range(4)]
    plain = [Delegate(deliberation_env.parallel_env(split="train")) for _ in range(4)]
    layout = agent_layout(batched[0])
    policy = Policy(layout, hidden=16)
    a = collect(batched, layout, policy, specs, (1,))
    b = collect(plain, layout, policy, specs, (1,))
    for name in ("obs", "mask", "actions", "logp", "rewards", "episode", "group", "agent", "step"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.episodes == b.episodes
    assert backend.calls[:2] == [12, 12]  # the first wave's 4 envs x 3 agents: one solve and one critic call



def test_trace_flag_labels_every_episode_with_its_entry(tmp_path, sampled_policy):
    from collections import Counter as Tally

    from baselines.meta import evaluate as evaluate_cli
    from baselines.meta import train
    from deliberation_env import demo
    from deliberation_env.analysis.traces import read_traces

    trace = tmp_path / "traces.jsonl"
    evaluate_cli.main(["--checkpoints", f"mine={sampled_policy}", "--protocols", "single", "debate", "--problems", "3",
                           "--seeds", "0", "1", "--num-envs", "4", "--out", str(tmp_path / "eval"), "--trace", str(trace)])
    assert Tally(e.label for e in read_traces(trace)) == {"mine": 6, "single": 6, "debate": 6}
    demo.main(["--episodes", "2", "--policy", "refine", "--trace", str(trace)])
    train.main(["--algo", "sft", "--episodes", "8", "--epochs", "1", "--num-envs", "4", "--eval-problems", "2",
                "--eval-seeds", "1", "--no-progress", "--no-tensorboard", "--out", str(tmp_path / "run"),
                "--trace", str(trace)])
    labels = Tally(e.label for e in read_traces(trace))
    assert labels["refine"] == 2 and labels["sft"] == 2 and labels["oracle"] == 2
    assert {e.num_agents for e in read_traces(trace) if e.label == "single"} == {1}
