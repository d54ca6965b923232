"""Rollout collection with groups, and credit assignment (returns and their comparison groups).

``collect`` plays a list of episodes, each given by a reset seed (plus optional reset options)
and a group id, on a pool of environments stepped in lockstep: one batched forward pass of the
shared policy per round for every live agent of every environment, played by the library's
episode runner (``deliberation_env.vector.run_episodes``): deliberation envs are reset and stepped
together (one ``generate`` call per distinct backend per phase for the whole pool; envs sharing
one backend object share its calls); other PettingZoo envs are stepped one by one. Episodes of one group use the same
seed, so they start from the same state and differ only in the sampled actions (and in
whatever randomness the environment draws after them). Each episode samples its actions from
its own stream, ``SeedSequence([*key, spec.stream])``, so an episode plays the same whichever
batch, wave or rollout worker (``baselines.meta.distributed``) plays it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pettingzoo import ParallelEnv

from baselines.meta.config import CREDIT_SPANS
from baselines.meta.policy import ObsLayout, Policy, encode, encode_many
from deliberation_env.vector import Start, Step, run_episodes


@dataclass
class EpisodeSpec:
    """One episode to play: ``env.reset(seed=seed, options=options)``; ``group`` ties siblings."""

    seed: int
    group: int
    options: dict[str, Any] | None = None
    stream: int | None = None
    """Index of the episode's action-sampling stream under collect's key (None: its position in the specs)."""


@dataclass
class Rollouts:
    """Flat per-transition arrays (one row per live agent per round) plus per-episode summaries."""

    obs: np.ndarray
    mask: np.ndarray
    actions: np.ndarray
    logp: np.ndarray
    rewards: np.ndarray
    episode: np.ndarray
    group: np.ndarray
    agent: np.ndarray
    step: np.ndarray
    labels: np.ndarray
    """Info labels (e.g. oracle actions) when a label key was given, else -1."""
    state: np.ndarray | None
    """Centralised-critic input per transition (``env.state()`` or all agents' observations)."""
    episodes: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.actions)


def global_state(env: Any, layout: ObsLayout, obs: dict[str, Any]) -> np.ndarray:
    """``env.state()`` when the env overrides PettingZoo's default, else all agents' observations concatenated."""
    if getattr(type(env), "state", ParallelEnv.state) is not ParallelEnv.state:
        return np.asarray(env.state(), dtype=np.float32).reshape(-1)
    rows = [encode(layout, obs[a])[0] if a in obs else np.zeros(layout.obs_dim, np.float32) for a in env.possible_agents]
    return np.concatenate(rows)


def sampling_key(seed: int, stage: str) -> tuple[int, int]:
    """The key of one training stage's action-sampling streams (the run's seed and a stable id of the stage)."""
    return seed % 2**63, zlib.crc32(stage.encode())


def episode_stream(key: Sequence[int], index: int) -> np.random.Generator:
    """The action-sampling stream of episode ``index`` under ``key``."""
    return np.random.default_rng(np.random.SeedSequence([*(int(k) for k in key), int(index)]))


def sample(logp: torch.Tensor, uniforms: np.ndarray) -> torch.Tensor:
    """One action per row of log-probabilities by inverting the CDF at ``uniforms`` in (0, 1] (a zero-probability,
    i.e. masked, action is never picked)."""
    cdf = logp.double().exp().cumsum(-1)
    threshold = torch.from_numpy(uniforms) * cdf[:, -1]
    return (cdf < threshold[:, None]).sum(-1).clamp_(max=logp.shape[1] - 1)


ROW_KEYS = ("obs", "mask", "actions", "logp", "rewards", "episode", "group", "agent", "step", "labels", "state")


@dataclass
class Collection:
    """One collection's settings and what it has gathered: one row per live agent per round (``act``), one summary
    per episode (``start``, ``record``, ``finish``). ``collect`` fills it from envs and ``tree_rollout.collect_tree``
    from a compiled tree, alike; ``rollouts()`` gives it as ``Rollouts``."""

    layout: ObsLayout
    policy: Policy | None
    key: Sequence[int]
    reward_scale: float = 1.0
    label_key: str | None = None
    want_state: bool = False
    columns: dict[str, list[np.ndarray]] = field(default_factory=lambda: {name: [] for name in ROW_KEYS})
    episodes: list[dict[str, Any]] = field(default_factory=list)

    def stream(self, index: int, spec: EpisodeSpec) -> np.random.Generator:
        """Episode ``index``'s action-sampling stream (``spec.stream`` when given)."""
        return episode_stream(self.key, index if spec.stream is None else spec.stream)

    def start(self, spec: EpisodeSpec, agents: Sequence[str], tokens: float) -> None:
        """A new episode's summary, after its reset (``Rollouts.episodes``; episodes start in index order)."""
        self.episodes.append({"group": spec.group, "seed": spec.seed, "length": 0, "team_return": 0.0,
                              "returns": dict.fromkeys(agents, 0.0), "tokens": tokens, "success": None,
                              "actions": []})

    def act(self, x: torch.Tensor, mask: torch.Tensor, streams: Sequence[tuple[np.random.Generator, int]], *,
            episode: Any, group: Any, agent: Any, step: Any, labels: Any, state: Any = None) -> torch.Tensor:
        """Sample the actions of a batch of rows (``choose``) and keep the rows: each keyword a column of the batch's
        length (``state``: (rows, S) with ``want_state``). Returns the actions."""
        actions, logp = choose(self.policy, x, mask, streams)
        for name, values in (("episode", episode), ("group", group), ("agent", agent), ("step", step),
                             ("labels", labels)):
            self.columns[name].append(np.asarray(values, np.int64).reshape(-1))
        if self.want_state:
            self.columns["state"].append(np.asarray(state, np.float32).reshape(len(actions), -1))
        for name, value in (("obs", x), ("mask", mask), ("actions", actions), ("logp", logp)):
            self.columns[name].append(value.numpy())
        return actions

    def record(self, index: int, rewards: Mapping[str, float], actions: Sequence[int], tokens: float) -> None:
        """A played round of episode ``index``: each acting agent's reward (scaled into the reward column, in the
        order of its rows), the actions and the tokens into its summary."""
        summary = self.episodes[index]
        scaled = [float(reward) * self.reward_scale for reward in rewards.values()]
        self.columns["rewards"].append(np.asarray(scaled, np.float64))
        for agent, reward in zip(rewards, scaled):
            summary["returns"][agent] += reward
            summary["team_return"] += reward
        summary["actions"].extend(actions)
        summary["length"] += 1
        summary["tokens"] += tokens

    def finish(self, index: int, success: bool | None) -> None:
        """Episode ``index`` has ended: whether its final consensus is right (None: unknown)."""
        self.episodes[index]["success"] = success

    def rollouts(self) -> Rollouts:
        """What was gathered, as ``Rollouts`` arrays."""
        columns, layout = self.columns, self.layout

        def joined(name: str, empty: np.ndarray) -> np.ndarray:
            return np.concatenate(columns[name]) if columns[name] else empty

        return Rollouts(
            obs=joined("obs", np.zeros((0, layout.obs_dim), np.float32)),
            mask=joined("mask", np.zeros((0, layout.num_actions), bool)),
            actions=joined("actions", np.zeros(0, np.int64)).astype(np.int64),
            logp=joined("logp", np.zeros(0, np.float32)), rewards=joined("rewards", np.zeros(0)),
            episode=joined("episode", np.zeros(0, np.int64)), group=joined("group", np.zeros(0, np.int64)),
            agent=joined("agent", np.zeros(0, np.int64)), step=joined("step", np.zeros(0, np.int64)),
            labels=joined("labels", np.zeros(0, np.int64)),
            state=np.concatenate(columns["state"]) if self.want_state and columns["state"] else None,
            episodes=self.episodes,
        )




def collect(
    envs: Sequence[Any],
    layout: ObsLayout,
    policy: Policy | None,
    specs: Sequence[EpisodeSpec],
    key: Sequence[int],
    reward_scale: float = 1.0,
    label_key: str | None = None,
    want_state: bool = False,
    on_episodes: Callable[[int], None] | None = None,
) -> Rollouts:
    """Play ``specs`` on ``envs`` (waves of ``len(envs)`` episodes, ``deliberation_env.vector.run_episodes``). ``policy=None``
    plays uniformly random legal actions; episode i samples them from ``episode_stream(key, specs[i].stream)``
    (``sampling_key`` makes a key); ``on_episodes(n)`` is called when n episodes end (e.g. a progress bar's update)."""
    run = Collection(layout, policy, key, reward_scale, label_key, want_state)
    streams: dict[int, np.random.Generator] = {}
    rounds: dict[int, int] = {}

    def act(live: list[Step]) -> list[dict[str, int]]:
        batch = [(step, a) for step in live for a in step.env.agents]
        x, mask = encode_many(layout, [step.observations[a] for step, a in batch])
        states = {s.episode: global_state(s.env, layout, s.observations) for s in live} if want_state else None
        actions = run.act(x, mask, [(streams[s.episode], len(s.env.agents)) for s in live],
                          episode=[step.episode for step, _ in batch],
                          group=[specs[step.episode].group for step, _ in batch],
                          agent=[step.env.possible_agents.index(a) for step, a in batch],
                          step=[rounds[step.episode] for step, _ in batch],
                          labels=[_label(step, a, label_key) for step, a in batch],
                          state=[states[step.episode] for step, _ in batch] if states is not None else None)
        chosen: dict[int, dict[str, int]] = {step.episode: {} for step in live}
        for row, (step, a) in enumerate(batch):
            chosen[step.episode][a] = int(actions[row])
        return [chosen[step.episode] for step in live]

    def on_step(step: Step) -> None:
        if step.actions is None:
            spec = specs[step.episode]
            streams[step.episode] = run.stream(step.episode, spec)
            rounds[step.episode] = 0
            run.start(spec, step.env.possible_agents, _tokens(step.infos))
            if step.done:
                run.finish(step.episode, _success(step.infos))
            return
        run.record(step.episode, {a: step.rewards.get(a, 0.0) for a in step.actions}, list(step.actions.values()),
                   _tokens(step.infos))
        rounds[step.episode] += 1
        if step.done:
            run.finish(step.episode, _success(step.infos))
            if on_episodes is not None:
                on_episodes(1)

    run_episodes(envs, [Start(spec.seed, spec.options) for spec in specs], act, on_step)
    return run.rollouts()


def choose(policy: Policy | None, x: torch.Tensor, mask: torch.Tensor,
           streams: Sequence[tuple[np.random.Generator, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled actions and their log-probabilities for the rows of ``x`` (uniform over legal actions without a
    policy); each (stream, count) of ``streams`` gives the uniforms of its next ``count`` rows."""
    if policy is None:
        logits = torch.zeros(mask.shape).masked_fill(~mask, -1e9)
    else:
        with torch.no_grad():
            logits = policy(x, mask)
    logp_all = torch.log_softmax(logits, -1)
    actions = sample(logp_all, np.concatenate([1.0 - stream.random(count) for stream, count in streams]))
    return actions, logp_all.gather(1, actions[:, None]).squeeze(1)


def _label(step: Step, agent: str, label_key: str | None) -> int:
    """The agent's ``label_key`` info as an int; -1 without a key or a label."""
    label = step.infos.get(agent, {}).get(label_key, -1) if label_key else -1
    return -1 if label is None else int(label)


def _tokens(infos: dict[str, dict[str, Any]]) -> float:
    return float(sum(info.get("tokens", 0) or 0 for info in infos.values()))


def _success(infos: dict[str, dict[str, Any]]) -> bool | None:
    flags = [info["consensus_correct"] for info in infos.values() if "consensus_correct" in info]
    return bool(flags[0]) if flags else None


# ----------------------------------------------------------------------------- credit assignment
def agent_returns(ro: Rollouts, credit_span: str, gamma: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Per-transition returns and comparison keys for one agent's own rewards.

    ``episode``: the agent's undiscounted episode return, compared within (group, agent).
    ``round``: the agent's discounted reward-to-go from this round (``gamma=0``: the round's
    reward alone), compared within (group, agent, round).
    """
    if credit_span not in CREDIT_SPANS:
        raise ValueError(f"credit_span must be one of {CREDIT_SPANS}, got {credit_span!r}")
    returns = np.zeros(len(ro))
    for rows in trajectories(ro):
        rewards = ro.rewards[rows]
        if credit_span == "episode":
            returns[rows] = rewards.sum()
        else:
            running = 0.0
            for i in range(len(rows) - 1, -1, -1):
                running = rewards[i] + gamma * running
                returns[rows[i]] = running
    columns = [ro.group, ro.agent] if credit_span == "episode" else [ro.group, ro.agent, ro.step]
    return returns, _keys(np.stack(columns, 1))


def team_returns(ro: Rollouts) -> tuple[np.ndarray, np.ndarray]:
    """The episode's shared team return (sum over agents and rounds) for each transition, keyed by group."""
    totals = np.array([s["team_return"] for s in ro.episodes])
    return totals[ro.episode], _keys(ro.group[:, None])


def trajectories(ro: Rollouts) -> list[np.ndarray]:
    """Row indices of each (episode, agent) trajectory, in round order."""
    order = np.lexsort((ro.step, ro.agent, ro.episode))
    pairs = np.stack([ro.episode[order], ro.agent[order]], 1)
    cuts = np.flatnonzero(np.any(pairs[1:] != pairs[:-1], axis=1)) + 1
    return np.split(order, cuts) if len(order) else []


def _keys(columns: np.ndarray) -> np.ndarray:
    return np.unique(columns, axis=0, return_inverse=True)[1].reshape(-1)


def rollout_metrics(ro: Rollouts, reward_scale: float = 1.0) -> dict[str, float]:
    """Means over the collected episodes: per-agent return (unscaled), success rate, tokens, action shares."""
    episodes = ro.episodes
    if not episodes:
        return {}
    per_agent = [s["team_return"] / max(1, len(s["returns"])) / reward_scale for s in episodes]
    metrics = {"episode_return": float(np.mean(per_agent)),
               "episode_length": float(np.mean([s["length"] for s in episodes])),
               "tokens": float(np.mean([s["tokens"] for s in episodes]))}
    flags = [s["success"] for s in episodes if s["success"] is not None]
    if flags:
        metrics["accuracy"] = float(np.mean(flags))
    if len(ro):
        counts = np.bincount(ro.actions, minlength=int(ro.mask.shape[1]))
        metrics.update({f"action_{i}": float(c) / len(ro) for i, c in enumerate(counts)})
    return metrics
