"""A random meta-policy on the deliberation environment: the PettingZoo Parallel API loop.

    python examples/random_policy.py
"""

from __future__ import annotations

import numpy as np

import deliberation_env

env = deliberation_env.parallel_env(task="arithmetic", backend="sim", num_agents=3, max_rounds=3)
rng = np.random.default_rng(0)
correct = tokens = 0
episodes = 20
for episode in range(episodes):
    observations, infos = env.reset(seed=episode)
    tokens += sum(info["tokens"] for info in infos.values())
    while env.agents:
        # a uniformly random *legal* action: CONCEDE is masked when every peer agrees
        actions = {agent: int(rng.choice(np.flatnonzero(obs["action_mask"]))) for agent, obs in observations.items()}
        observations, rewards, terminations, truncations, infos = env.step(actions)
        tokens += sum(info["tokens"] for info in infos.values())
    correct += next(iter(infos.values()))["consensus_correct"]
print(f"random policy: accuracy {correct / episodes:.2f}, {tokens / episodes:.0f} tokens per problem")
