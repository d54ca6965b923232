"""Observation and info formats chosen at construction, for RL libraries that need one shape.

An env formats every observation and info through one ``ObservationFormat``: pass it as
``DeliberationEnv(format=ObservationFormat(...))``, or the same keywords to ``parallel_env(observation=...,
action_mask=..., infos=...)`` (docs/interop.md has a recipe per library):

- ``observation="dict"`` (default): ``{"self", "peers", "agreement", "action_mask"}``.
- ``observation="flat"``: one float32 Box vector ``[self, peers.ravel(), agreement, action_mask]``
  (the mask, when in the observation, is the last 3 entries; 2 + N with ``concede_to_peer``).
- ``observation="masked"``: ``{observation_key: float32 vector, action_mask_key: int8 (A,)}``,
  PettingZoo's classic convention (``observation_key="observations"`` for RLlib's masking module).
- ``action_mask="observation" | "info" | "both"``: where the legal-action mask goes, under
  ``action_mask_key`` (default ``"action_mask"``).
- ``infos="full" | "numeric" | "none"``: ``numeric`` keeps only float values (strings and None
  become indices or -1), with the same keys every step, for libraries that stack infos into arrays.

Every format carries F floats per agent, F the width of the env's feature set (``core.features.num_features``),
and an action mask of A entries (3, or 2 + N with ``concede_to_peer``): the env asks ``format.space(num_agents, F,
A)`` for its observation space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium
import numpy as np

from deliberation_env.core import features
from deliberation_env.core.deliberation import Action

OBSERVATION_MODES = ("dict", "flat", "masked")
ACTION_MASK_PLACES = ("observation", "info", "both")
INFO_MODES = ("full", "numeric", "none")
FEATURE_KEYS = ("self", "peers", "agreement")
"""The observation's feature part, written once here (``feature_spaces``, ``feature_arrays``) for the meta-action
env, its formats and the text env: the agent's own row, its peers' rows in the fixed order i+1, i+2, ... (mod N), and
1 where that peer holds the agent's answer."""
NUM_ACTIONS = len(Action)

# full-info key -> how the numeric form encodes it (strings and None have no fixed numeric type)
_NUMERIC_DROPPED = ("answer", "confidence_source", "consensus", "problem_id")


def feature_spaces(num_agents: int, width: int) -> dict[str, gymnasium.spaces.Space[Any]]:
    """The spaces of ``FEATURE_KEYS`` for one agent of ``num_agents`` with ``width`` features each."""
    peers = num_agents - 1
    return {"self": gymnasium.spaces.Box(0.0, 1.0, (width,), np.float32),
            "peers": gymnasium.spaces.Box(0.0, 1.0, (peers, width), np.float32),
            "agreement": gymnasium.spaces.Box(0.0, 1.0, (peers,), np.float32)}


def feature_arrays(rows: np.ndarray, peers: np.ndarray, answers: Sequence[str | None]) -> dict[str, np.ndarray]:
    """``FEATURE_KEYS`` of every agent at once, agent i's in row i: ``rows`` (N, F) the feature matrix, ``peers``
    (N, N-1) each agent's peer indices (``Deliberation.peer_indices``), ``answers`` the agents' answers."""
    agreement = np.array([[own is not None and answers[j] == own for j in row] for own, row in zip(answers, peers)],
                         dtype=np.float32).reshape(len(answers), -1)
    return {"self": rows, "peers": rows[peers], "agreement": agreement}


def peer_matrix(peers: Sequence[Sequence[int]]) -> np.ndarray:
    """Each agent's peer indices as one (N, N-1) index array, for ``feature_arrays``."""
    return np.array(peers, dtype=np.intp).reshape(len(peers), len(peers) - 1)


def flatten(observation: dict[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    """Concatenate the given keys of a dict observation into one float32 vector."""
    return np.concatenate([np.asarray(observation[key], dtype=np.float32).ravel() for key in keys])


def _check(name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")


class ObservationFormat:
    """How observations and infos look (independent of the env's size); converts the env's dict observations and
    infos to it and gives the observation space of an env of ``num_agents`` agents and F features."""

    def __init__(self, observation: str = "dict", action_mask: str = "observation", action_mask_key: str = "action_mask",
                 observation_key: str = "observation", infos: str = "full"):
        _check("observation", observation, OBSERVATION_MODES)
        _check("action_mask", action_mask, ACTION_MASK_PLACES)
        _check("infos", infos, INFO_MODES)
        for name, key in (("action_mask_key", action_mask_key), ("observation_key", observation_key)):
            if not isinstance(key, str) or not key:
                raise ValueError(f"{name} must be a non-empty string, got {key!r}")
        if observation == "masked" and action_mask == "info":
            raise ValueError("observation='masked' puts the mask in the observation; use action_mask='observation' "
                             "or 'both', or observation='flat' for a mask in infos only")
        if observation == "masked" and action_mask_key == observation_key:
            raise ValueError(f"observation_key and action_mask_key must differ, both are {observation_key!r}")
        if observation == "dict" and action_mask_key in FEATURE_KEYS:
            raise ValueError(f"action_mask_key {action_mask_key!r} clashes with an observation key {FEATURE_KEYS}")
        self.mode, self.infos = observation, infos
        self.mask_key, self.observation_key = action_mask_key, observation_key
        self.mask_in_observation = action_mask in ("observation", "both")
        self.mask_in_info = action_mask in ("info", "both")
        self._flat_keys = (*FEATURE_KEYS, "action_mask") if self.mask_in_observation else FEATURE_KEYS

    def __repr__(self) -> str:
        place = {(True, False): "observation", (False, True): "info", (True, True): "both"}
        return (f"ObservationFormat({self.mode!r}, action_mask={place[self.mask_in_observation, self.mask_in_info]!r}, "
                f"infos={self.infos!r})")

    def space(self, num_agents: int, width: int = features.NUM_FEATURES,
              num_actions: int = NUM_ACTIONS) -> gymnasium.spaces.Space:
        """The observation space of one agent of an env with ``num_agents`` agents, ``width`` features each and
        ``num_actions`` action indices (the mask's width)."""
        peers = num_agents - 1
        mask = gymnasium.spaces.Box(0, 1, (num_actions,), np.int8)
        if self.mode == "dict":
            parts = feature_spaces(num_agents, width)
            if self.mask_in_observation:
                parts[self.mask_key] = mask
            return gymnasium.spaces.Dict(parts)
        size = width * num_agents + peers + (num_actions if self.mode == "flat" and self.mask_in_observation else 0)
        vector = gymnasium.spaces.Box(0.0, 1.0, (size,), np.float32)
        if self.mode == "flat":
            return vector
        return gymnasium.spaces.Dict({self.observation_key: vector, self.mask_key: mask})

    def observation(self, raw: dict[str, np.ndarray]) -> Any:
        """Convert the env's ``{"self", "peers", "agreement", "action_mask"}`` to this format."""
        if self.mode == "flat":
            return flatten(raw, self._flat_keys)
        if self.mode == "masked":
            return {self.observation_key: flatten(raw, FEATURE_KEYS), self.mask_key: raw["action_mask"]}
        if self.mask_in_observation and self.mask_key == "action_mask":
            return raw
        converted = {key: raw[key] for key in FEATURE_KEYS}
        if self.mask_in_observation:
            converted[self.mask_key] = raw["action_mask"]
        return converted

    def observation_batch(self, raw: dict[str, np.ndarray]) -> Any:
        """``observation`` of a batch: every array of ``raw`` has the same leading dimensions (e.g. (B, N) episodes
        and agents) before the per-agent shape, and so does the result (a flat vector's entries in the same order)."""
        lead = raw["self"].shape[:-1]

        def flat(keys: Sequence[str]) -> np.ndarray:
            return np.concatenate([raw[key].reshape(*lead, -1).astype(np.float32, copy=False) for key in keys], axis=-1)

        if self.mode == "flat":
            return flat(self._flat_keys)
        if self.mode == "masked":
            return {self.observation_key: flat(FEATURE_KEYS), self.mask_key: raw["action_mask"]}
        converted = {key: raw[key] for key in FEATURE_KEYS}
        if self.mask_in_observation:
            converted[self.mask_key] = raw["action_mask"]
        return converted

    def info(self, full: dict[str, Any], mask: np.ndarray, agent_index: dict[str, int]) -> dict[str, Any]:
        """Convert one agent's full info dict to this format (adding the mask when it goes in infos)."""
        if self.infos == "full":
            info = full
        elif self.infos == "none":
            info = {}
        else:
            info = numeric_info(full, agent_index)
        if self.mask_in_info:
            info[self.mask_key] = mask
        return info


def numeric_info(full: dict[str, Any], agent_index: dict[str, int]) -> dict[str, float]:
    """Only floats, same keys every step: actions and concede targets as indices, -1 for none."""
    numeric: dict[str, float] = {}
    for key, value in full.items():
        if key in _NUMERIC_DROPPED:
            continue
        if key == "action":
            numeric[key] = float(-1 if value is None else Action[value])
        elif key == "concede_target":
            numeric[key] = float(-1 if value is None else agent_index[value])
        else:
            numeric[key] = float(value)
    numeric["has_answer"] = float(full["answer"] is not None)
    return numeric
