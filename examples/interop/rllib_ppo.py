"""RLlib (ray 2.60, new API stack) PPO with one shared policy, no glue (docs/interop.md, RLlib section).

RLlib is not a dev dependency (ray[rllib] pins gymnasium 1.2.2). Usage:
python examples/interop/rllib_ppo.py [ITERATIONS] [flat|masked]   (prints the learned and random team returns)
"""

from __future__ import annotations

import sys

import numpy as np
import ray
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv
from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule
from ray.tune.registry import register_env

import deliberation_env


def team_return(options: dict, act, seeds=range(1000, 1300)) -> float:
    env = deliberation_env.parallel_env(**options, split="test")  # trained on the default split, "train"
    returns = []
    for seed in seeds:
        observations, _ = env.reset(seed=seed)
        rng, total = np.random.default_rng(seed), 0.0
        while env.agents:
            observations, rewards, _, _, _ = env.step({a: act(observations[a], rng) for a in env.agents})
            total += sum(rewards.values())
        returns.append(total)
    return float(np.mean(returns))


def main() -> None:
    iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    masked = len(sys.argv) > 2 and sys.argv[2] == "masked"
    # RLlib's masking module reads obs["observations"] and obs["action_mask"]
    options = {"observation": "masked", "observation_key": "observations"} if masked else {"observation": "flat"}
    register_env("deliberation", lambda config: ParallelPettingZooEnv(deliberation_env.parallel_env(**config)))
    ray.init(num_cpus=2, include_dashboard=False)
    config = (
        PPOConfig()
        .environment("deliberation", env_config=options)
        .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, episode, **kwargs: "shared")
        .env_runners(num_env_runners=0, episodes_to_numpy=False)
        .training(train_batch_size_per_learner=600, minibatch_size=200, num_epochs=4, lr=3e-4)
        .debugging(seed=0)
    )
    if masked:
        spec = RLModuleSpec(module_class=ActionMaskingTorchRLModule)
        config = config.rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={"shared": spec}))
    algo = config.build_algo()
    for _ in range(iterations):
        algo.train()
    module = algo.get_module("shared")

    def greedy(obs, rng) -> int:
        batch = {k: torch.as_tensor(v)[None] for k, v in obs.items()} if masked else torch.as_tensor(obs)[None]
        with torch.no_grad():
            return int(module.forward_inference({"obs": batch})["action_dist_inputs"][0].argmax())

    def random_legal(obs, rng) -> int:
        return int(rng.choice(np.flatnonzero(obs["action_mask"] if masked else obs[-3:])))

    print(f"team return: learned {team_return(options, greedy):.3f}, random legal {team_return(options, random_legal):.3f}")
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
