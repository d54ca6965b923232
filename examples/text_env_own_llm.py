"""Drive the text-action env with your own LLM: the agents' completions are the actions.

Replace ``my_llm`` with a call to your model (a transformers pipeline, an OpenAI client, vLLM).
The toy below guesses: it copies a number from the prompt, so its format is right and its
answers are not; the per-term means printed at the end show exactly that.

    python examples/text_env_own_llm.py
"""

from __future__ import annotations

import random
import re
from collections import defaultdict

import deliberation_env
from deliberation_env.text import KINDS

rng = random.Random(0)


def my_llm(kind: str, messages: list[dict[str, str]], max_tokens: int, temperature: float) -> str:
    """A stand-in for a chat model: it answers with a number seen in the prompt."""
    if kind == "critic":  # the agent rates its own answer
        return f"Yes\nConfidence: {rng.uniform(0.3, 0.9):.2f}"
    numbers = re.findall(r"-?\d+", messages[-1]["content"])
    return f"I add things up.\nThe answer is {rng.choice(numbers) if numbers else 0}."


env = deliberation_env.text_env(task="arithmetic", num_agents=3, max_rounds=2, meta_policy="debate",
                                reward_weights={"correct": 1.0, "format": 0.2, "length": 0.001})
totals: dict[str, list[float]] = defaultdict(list)
for episode in range(5):
    observations, infos = env.reset(seed=episode)
    while env.agents:
        requests = env.requests  # the agents with a turn; the others wait and send ""
        actions = {agent: my_llm(KINDS[observations[agent]["kind"]], list(observations[agent]["messages"]),
                                 requests[agent].max_tokens, requests[agent].temperature)
                   if agent in requests else "" for agent in env.agents}
        observations, rewards, terminations, truncations, infos = env.step(actions)
        for agent, info in infos.items():
            if info["kind"] in ("solve", "refine"):
                for name in ("correct", "format", "length"):
                    totals[name].append(info[f"reward_{name}"])
            totals["reward"].append(rewards[agent])
    totals["consensus_correct"].append(float(infos["agent_0"]["consensus_correct"]))
print(", ".join(f"{name} {sum(values) / len(values):.3f}" for name, values in totals.items()))
