"""The meta-policy every trainer trains: observation layout, networks, masking, checkpoints.

Works with any PettingZoo ``ParallelEnv`` whose action spaces are ``Discrete`` and whose
observations are a ``Box`` or a ``Dict`` (optionally with an ``"action_mask"`` entry).

* Structured observations (a ``Dict`` with ``"self"`` and ``"peers"``): the MPDF policy, a
  cross-attention network in which the agent's own embedding attends over its peers'
  embeddings. Other ``Dict`` entries whose first dimension equals the number of peers (e.g.
  ``"agreement"``) become extra per-peer columns; the rest are appended to the own state.
* Anything else: an MLP over the flattened observation.

One network is shared by all agents; logits of masked actions are set to ``-1e9``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium
import numpy as np
import torch
from torch import nn

from deliberation_env.analysis.traces import PolicyActions
from deliberation_env.core.features import FEATURE_FORMAT

MASKED_LOGIT = -1e9
CHECKPOINT_FORMAT = 1


# ----------------------------------------------------------------------------- observation layout
@dataclass
class ObsLayout:
    """How one agent's observation maps to a flat float vector (own part, then peer rows)."""

    kind: str
    """"structured" (MPDF cross-attention) or "flat" (MLP)."""
    self_keys: list[list[Any]] = field(default_factory=list)
    """[key, shape] entries flattened into the own-state vector ("" is a bare Box)."""
    peer_keys: list[list[Any]] = field(default_factory=list)
    """[key, shape] entries with one row (or value) per peer."""
    num_peers: int = 0
    mask_key: str | None = None
    num_actions: int = 0

    @property
    def self_dim(self) -> int:
        return sum(int(np.prod(shape)) for _, shape in self.self_keys)

    @property
    def peer_dim(self) -> int:
        return sum(int(np.prod(shape[1:])) for _, shape in self.peer_keys)

    @property
    def obs_dim(self) -> int:
        return self.self_dim + self.num_peers * self.peer_dim


def make_layout(obs_space: gymnasium.Space, act_space: gymnasium.Space, mask_key: str = "action_mask") -> ObsLayout:
    """The layout of one agent's spaces; raises ValueError on unsupported spaces."""
    if not isinstance(act_space, gymnasium.spaces.Discrete):
        raise ValueError(f"the baselines need Discrete action spaces, got {act_space!r}")
    actions = int(act_space.n)
    if isinstance(obs_space, gymnasium.spaces.Box):
        return ObsLayout("flat", [["", list(obs_space.shape)]], num_actions=actions)
    if not isinstance(obs_space, gymnasium.spaces.Dict):
        raise ValueError(f"observations must be a Box or a Dict of Boxes, got {obs_space!r}")
    spaces = dict(obs_space.spaces)
    mask = mask_key if mask_key in spaces else None
    if mask is not None and tuple(_shape(mask, spaces[mask])) != (actions,):
        raise ValueError(f"observation[{mask!r}] has shape {spaces[mask].shape}, expected ({actions},)")
    rest = {key: list(_shape(key, space)) for key, space in spaces.items() if key != mask}
    if "self" in rest and "peers" in rest and len(rest["peers"]) == 2:
        peers = rest["peers"][0]
        peer_keys = [["peers", rest.pop("peers")]]
        for key in list(rest):
            if key != "self" and rest[key][:1] == [peers] and len(rest[key]) <= 2:
                peer_keys.append([key, rest.pop(key)])
        self_keys = [["self", rest.pop("self")]] + [[k, s] for k, s in rest.items()]
        return ObsLayout("structured", self_keys, peer_keys, peers, mask, actions)
    return ObsLayout("flat", [[k, s] for k, s in rest.items()], mask_key=mask, num_actions=actions)


def _shape(key: str, space: gymnasium.Space) -> tuple[int, ...]:
    """The shape of ``observation[key]``'s space; ValueError for a space without one (e.g. Text)."""
    if space.shape is None:
        raise ValueError(f"observation[{key!r}] is {space!r}, which has no shape; the baselines need Boxes")
    return space.shape


def encode(layout: ObsLayout, obs: Any) -> tuple[np.ndarray, np.ndarray]:
    """One observation -> (flat float32 vector of ``layout.obs_dim``, bool legal-action mask)."""
    parts = [np.asarray(obs if key == "" else obs[key], dtype=np.float32).reshape(-1) for key, _ in layout.self_keys]
    if layout.peer_keys:
        columns = [np.asarray(obs[key], dtype=np.float32).reshape(layout.num_peers, -1) for key, _ in layout.peer_keys]
        parts.append(np.concatenate(columns, axis=1).reshape(-1))
    mask = np.asarray(obs[layout.mask_key], dtype=bool) if layout.mask_key else np.ones(layout.num_actions, bool)
    return np.concatenate(parts), mask


def encode_many(layout: ObsLayout, observations: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``stack([encode(layout, o) for o in observations])`` with one numpy call per key instead of several per
    observation (the same values: the same float32 conversion, the same column order)."""
    keys = [key for key, _ in (*layout.self_keys, *layout.peer_keys)] + ([layout.mask_key] if layout.mask_key else [])
    if keys == [""]:
        return encode_batch(layout, np.stack([np.asarray(o, dtype=np.float32) for o in observations]))
    return encode_batch(layout, {key: np.stack([np.asarray(o[key]) for o in observations]) for key in keys},
                        len(observations))


def encode_batch(layout: ObsLayout, batch: Any, count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode_many`` of observations already stacked: a dict of arrays (or one array for a bare Box) whose first
    dimension runs over the ``count`` observations (a batched env's, e.g. ``deliberation_env.engine.TreeEnv``'s
    reshaped to one row per agent)."""
    if count is None:
        count = len(batch) if not isinstance(batch, Mapping) else len(next(iter(batch.values())))

    def column(key: str) -> np.ndarray:
        return np.asarray(batch if key == "" else batch[key], dtype=np.float32)

    parts = [column(key).reshape(count, -1) for key, _ in layout.self_keys]
    if layout.peer_keys:
        columns = [column(key).reshape(count, layout.num_peers, -1) for key, _ in layout.peer_keys]
        parts.append(np.concatenate(columns, axis=2).reshape(count, -1))
    if layout.mask_key:
        mask = np.asarray(batch[layout.mask_key], dtype=bool).reshape(count, -1)
    else:
        mask = np.ones((count, layout.num_actions), bool)
    return torch.from_numpy(np.concatenate(parts, axis=1)), torch.from_numpy(mask)


def agent_layout(env: Any, mask_key: str = "action_mask") -> ObsLayout:
    """The shared layout of all agents of ``env`` (parameter sharing needs identical spaces)."""
    agents = list(env.possible_agents)
    layouts = [make_layout(env.observation_space(a), env.action_space(a), mask_key) for a in agents]
    if any(asdict(layout) != asdict(layouts[0]) for layout in layouts[1:]):
        raise ValueError("parameter sharing needs identical observation and action spaces for every agent")
    return layouts[0]


# ----------------------------------------------------------------------------- networks
def mlp(inputs: int, hidden: int, outputs: int, layers: int = 2) -> nn.Sequential:
    modules: list[nn.Module] = []
    for i in range(layers):
        modules += [nn.Linear(inputs if i == 0 else hidden, hidden), nn.Tanh()]
    modules.append(nn.Linear(hidden if layers else inputs, outputs))
    return nn.Sequential(*modules)


class CrossAttentionNet(nn.Module):
    """MPDF: embed own state and peer rows, own embedding attends over the peers, then a head."""

    def __init__(self, layout: ObsLayout, outputs: int, hidden: int = 64, heads: int = 4):
        super().__init__()
        self.layout = layout
        self.own = mlp(layout.self_dim, hidden, hidden, layers=1)
        self.peer = mlp(layout.peer_dim, hidden, hidden, layers=1)
        self.attention = nn.MultiheadAttention(hidden, heads if hidden % heads == 0 else 1, batch_first=True)
        self.head = mlp(2 * hidden, hidden, outputs, layers=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(next(self.parameters()).dtype)  # observations arrive as float32; a float64 net computes in float64
        own = self.own(x[:, : self.layout.self_dim])
        if self.layout.num_peers == 0:
            context = torch.zeros_like(own)
        else:
            rows = x[:, self.layout.self_dim :].reshape(x.shape[0], self.layout.num_peers, self.layout.peer_dim)
            peers = self.peer(rows)
            context = self.attention(own.unsqueeze(1), peers, peers, need_weights=False)[0].squeeze(1)
        return self.head(torch.cat([own, context], dim=-1))


class FlatNet(nn.Module):
    """An MLP over the flattened observation."""

    def __init__(self, layout: ObsLayout, outputs: int, hidden: int = 64):
        super().__init__()
        self.body = mlp(layout.obs_dim, hidden, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x.to(next(self.parameters()).dtype))


def build_network(layout: ObsLayout, outputs: int, hidden: int = 64) -> nn.Module:
    return CrossAttentionNet(layout, outputs, hidden) if layout.kind == "structured" else FlatNet(layout, outputs, hidden)


def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~mask, MASKED_LOGIT)


class Policy(nn.Module):
    """The shared meta-policy: observation vector + legal mask -> masked logits."""

    def __init__(self, layout: ObsLayout, hidden: int = 64):
        super().__init__()
        self.layout, self.hidden = layout, hidden
        self.net = build_network(layout, layout.num_actions, hidden)
        self.trained_on: dict[str, Any] | None = None
        """The game it trained on (``trained_game``), set by the trainer's CLI and ``load_policy``."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return masked_logits(self.net(x), mask)

    def log_probs(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self(x, mask), dim=-1)

    @torch.no_grad()
    def act(self, observations: Mapping[str, Any], deterministic: bool = True,
            generator: torch.Generator | None = None) -> PolicyActions:
        """One action per agent of a PettingZoo observation dict (greedy unless ``deterministic=False``), with each
        agent's probability of every action (a trace records them: ``analysis.traces.PolicyActions``)."""
        agents = list(observations)
        if not agents:
            return PolicyActions({}, {})
        x, mask = stack([encode(self.layout, observations[a]) for a in agents])
        logits = self(x, mask)
        probabilities = torch.softmax(logits, -1)
        if deterministic:
            chosen = logits.argmax(-1)
        else:
            chosen = torch.multinomial(probabilities, 1, generator=generator).squeeze(-1)
        rows = probabilities.detach().tolist()
        return PolicyActions({a: int(c) for a, c in zip(agents, chosen.tolist())}, dict(zip(agents, rows)))


def stack(encoded: list[tuple[np.ndarray, np.ndarray]]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(np.stack([e[0] for e in encoded]))
    mask = torch.from_numpy(np.stack([e[1] for e in encoded]))
    return x, mask


def adam(parameters: Any, lr: float) -> torch.optim.Adam:
    """The trainers' optimizer: Adam in its multi-tensor form (``foreach=True``), one call per update for all the
    parameters instead of a Python loop over them; on the CPU it runs the same per-tensor arithmetic, so the trained
    weights are the same to the bit (checked against the loop form on every trainer)."""
    return torch.optim.Adam(parameters, lr=lr, foreach=True)


def kl_and_entropy(log_p: torch.Tensor, log_q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row KL(p || q) and entropy H(p) of masked categorical log-probabilities."""
    p = log_p.exp()
    kl = (p * (log_p - log_q)).sum(-1)
    entropy = -(p * log_p).sum(-1)
    return kl, entropy


# ----------------------------------------------------------------------------- checkpoints
def trained_game(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a run on a replay set trained on, as its checkpoint records it: the set's name and digest, the split and
    the env options (``baselines.benchmark.score`` names where they depart from the cell it scores on); None off
    replay."""
    if not config.get("replay"):
        return None
    from deliberation_env.replay import load_card, set_digest

    options = {key: value for key, value in dict(config.get("env_options") or {}).items()
               if isinstance(value, (int, float, str, bool, type(None), list, dict))}
    return {"set": load_card(config["replay"]).name, "digest": set_digest(config["replay"]),
            "split": config.get("train_split", "train"), "env_options": options}


def save_checkpoint(path: str, policy: Policy, algo: str, config: Mapping[str, Any], **extra: Any) -> str:
    """Weights + config + observation layout and feature format, and the game it trained on (``trained_game``),
    loadable with ``load_policy(path)``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save({
        "format": CHECKPOINT_FORMAT, "feature_format": FEATURE_FORMAT, "algo": algo, "hidden": policy.hidden,
        "layout": asdict(policy.layout), "trained_on": trained_game(config),
        "config": {k: v for k, v in dict(config).items() if isinstance(v, (int, float, str, bool, type(None)))},
        "state_dict": policy.state_dict(), **extra,
    }, path)
    return path


def load_checkpoint(path: str) -> dict[str, Any]:
    """The raw dict written by ``save_checkpoint``; a clear error for a missing or foreign file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"checkpoint {path!r} does not exist; train one first, e.g. "
            f"`python -m baselines.meta.train --algo softrankpo --out {os.path.dirname(path) or '.'}` (it writes policy.pt there)")
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a baselines checkpoint (format {CHECKPOINT_FORMAT})")
    trained = data.get("feature_format", 1)  # checkpoints from before the field: format 1
    if trained != FEATURE_FORMAT:
        warnings.warn(f"{path} was trained on observations of feature format {trained}; this version computes "
                      f"format {FEATURE_FORMAT} (deliberation_env.core.features.FEATURE_FORMAT says which columns "
                      "changed): retrain it before comparing it with policies trained now", stacklevel=2)
    return data


def load_policy(path: str) -> Policy:
    """The policy stored by ``save_checkpoint`` (eval mode), with what it trained on as ``trained_on`` (None for
    checkpoints from before it was recorded). ``policy.act(observations)`` plays it."""
    data = load_checkpoint(path)
    policy = Policy(ObsLayout(**data["layout"]), data["hidden"])
    policy.load_state_dict(data["state_dict"])
    policy.trained_on = data.get("trained_on")
    return policy.eval()
