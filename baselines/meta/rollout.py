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
    rows = new_rows()
    summaries: list[dict[str, Any]] = []
    streams: dict[int, np.random.Generator] = {}
    rounds: dict[int, int] = {}

    def act(live: list[Step]) -> list[dict[str, int]]:
        batch = [(step, a) for step in live for a in step.env.agents]
        x, mask = encode_many(layout, [step.observations[a] for step, a in batch])
        actions, logp = choose(policy, x, mask, [(streams[s.episode], len(s.env.agents)) for s in live])
        states = {s.episode: global_state(s.env, layout, s.observations) for s in live} if want_state else None
        add_transitions(rows, batch, [specs[step.episode].group for step, _ in batch],
                        [rounds[step.episode] for step, _ in batch], label_key, states)
        add_batch(rows, x, mask, actions, logp)
        chosen: dict[int, dict[str, int]] = {step.episode: {} for step in live}
        for row, (step, a) in enumerate(batch):
            chosen[step.episode][a] = int(actions[row])
        return [chosen[step.episode] for step in live]

    def on_step(step: Step) -> None:
        if step.actions is None:
            spec = specs[step.episode]
            streams[step.episode] = episode_stream(key, step.episode if spec.stream is None else spec.stream)
            rounds[step.episode] = 0
            summaries.append(new_summary(spec, step.env.possible_agents, _tokens(step.infos)))
            if step.done:
                _finish(step.infos, summaries[-1])
            return
        add_step(rows, summaries[step.episode], step, step.actions, reward_scale)
        rounds[step.episode] += 1
        if step.done:
            _finish(step.infos, summaries[step.episode])
            if on_episodes is not None:
                on_episodes(1)

    run_episodes(envs, [Start(spec.seed, spec.options) for spec in specs], act, on_step)
    return to_rollouts(rows, summaries, layout, want_state)


def add_transitions(rows: dict[str, list[Any]], batch: Sequence[tuple[Step, str]], groups: Sequence[int],
                    rounds: Sequence[int], label_key: str | None, states: dict[int, Any] | None) -> None:
    """The per-transition columns of a batch of (step, agent) beside its observations: label (``label_key`` in the
    agent's info; -1 without one), episode, group, agent index, round and, when ``states`` is given, global state."""
    for (step, a), group, round_ in zip(batch, groups, rounds):
        label = step.infos.get(a, {}).get(label_key, -1) if label_key else -1
        rows["labels"].append(-1 if label is None else int(label))
        rows["episode"].append(step.episode)
        rows["group"].append(group)
        rows["agent"].append(step.env.possible_agents.index(a))
        rows["step"].append(round_)
        if states is not None:
            rows["state"].append(states[step.episode])


def add_step(rows: dict[str, list[Any]], summary: dict[str, Any], step: Step, actions: Mapping[str, Any],
             reward_scale: float) -> None:
    """A played step (its ``actions``) into the reward column, scaled, and its episode's summary (returns, actions,
    length, tokens)."""
    for a, action in actions.items():
        reward = float(step.rewards.get(a, 0.0)) * reward_scale
        rows["rewards"].append(reward)
        summary["returns"][a] += reward
        summary["team_return"] += reward
        summary["actions"].append(action)
    summary["length"] += 1
    summary["tokens"] += _tokens(step.infos)


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


def new_summary(spec: EpisodeSpec, agents: Sequence[str], tokens: float) -> dict[str, Any]:
    """An episode's summary after its reset (``Rollouts.episodes``)."""
    return {"group": spec.group, "seed": spec.seed, "length": 0, "team_return": 0.0,
            "returns": dict.fromkeys(agents, 0.0), "tokens": tokens, "success": None, "actions": []}


ROW_KEYS = ("obs", "mask", "actions", "logp", "rewards", "episode", "group", "agent", "step", "labels", "state")


def new_rows() -> dict[str, list[Any]]:
    """Empty per-transition columns (``ROW_KEYS``), filled by a collector and turned into ``Rollouts`` by
    ``to_rollouts``."""
    return {key: [] for key in ROW_KEYS}


def add_batch(rows: dict[str, list[Any]], x: torch.Tensor, mask: torch.Tensor, actions: torch.Tensor,
               logp: torch.Tensor) -> None:
    rows["obs"].append(x.numpy())
    rows["mask"].append(mask.numpy())
    rows["actions"].append(actions.numpy())
    rows["logp"].append(logp.numpy())


def to_rollouts(rows: dict[str, list[Any]], summaries: list[dict[str, Any]], layout: ObsLayout,
                want_state: bool) -> Rollouts:
    """The collected rows as ``Rollouts`` arrays."""
    return Rollouts(
        obs=np.concatenate(rows["obs"]) if rows["obs"] else np.zeros((0, layout.obs_dim), np.float32),
        mask=np.concatenate(rows["mask"]) if rows["mask"] else np.zeros((0, layout.num_actions), bool),
        actions=np.concatenate(rows["actions"]).astype(np.int64) if rows["actions"] else np.zeros(0, np.int64),
        logp=np.concatenate(rows["logp"]) if rows["logp"] else np.zeros(0, np.float32),
        rewards=_flat(rows["rewards"], np.float64), episode=_flat(rows["episode"]), group=_flat(rows["group"]),
        agent=_flat(rows["agent"]), step=_flat(rows["step"]), labels=_flat(rows["labels"]),
        state=np.concatenate([np.atleast_2d(np.asarray(v, np.float32)) for v in rows["state"]])
        if want_state and rows["state"] else None,
        episodes=summaries,
    )


def _flat(parts: list[Any], dtype: Any = np.int64) -> np.ndarray:
    """Rows appended one by one (numbers, by ``collect``) or as arrays (``collect_tree``), as one array."""
    if not parts or np.isscalar(parts[0]):
        return np.asarray(parts, dtype)
    return np.concatenate([np.asarray(v, dtype).reshape(-1) for v in parts])


def _tokens(infos: dict[str, dict[str, Any]]) -> float:
    return float(sum(info.get("tokens", 0) or 0 for info in infos.values()))


def _finish(infos: dict[str, dict[str, Any]], summary: dict[str, Any]) -> None:
    flags = [info["consensus_correct"] for info in infos.values() if "consensus_correct" in info]
    summary["success"] = bool(flags[0]) if flags else None


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
