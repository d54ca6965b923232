"""Multi-agent LLM deliberation as a PettingZoo ParallelEnv (a Dec-POMDP).

N LLM agents solve one problem (round 0, inside ``reset``), then deliberate for up to
``max_rounds`` rounds; each ``step`` is one round in which every agent picks a meta-action.

| Import             | ``deliberation_env.parallel_env(task="arithmetic", backend="sim")``        |
|--------------------|-----------------------------------------------------------------------------|
| Actions            | Discrete(3): PERSIST = 0, REFINE = 1, CONCEDE = 2; with ``concede_to_peer``, |
|                    | Discrete(2 + N): also 3 + k = CONCEDE to peer k (``core.actions``)          |
| Parallel API       | yes (AEC form: ``deliberation_env.env(...)``)                               |
| Agents             | ``agent_0`` ... ``agent_{N-1}`` (N = ``num_agents``), or ``agent_names``    |
| Action shape       | scalar int                                                                  |
| Observation        | Dict, identical space for every agent (below); ``observation="flat"`` or    |
|                    | ``"masked"`` for a Box or ``{"observation", "action_mask"}`` (``formats``)   |
| Episode length     | ``max_rounds`` steps (default 3); optionally earlier, see ``early_stop``    |

Observation of agent i (F floats in [0, 1] per agent; ``deliberation_env.core.features`` has every column).
The ``features`` option picks the feature set (default ``"v1"``; ``v2`` and ``v3`` add columns), a registered
``core.features.FeatureSet`` (``core.features.feature_set_table()`` lists the registered ones, their widths and needs).
A set that needs logprobs asks the backend for token log-probabilities (the same requests otherwise: replay sets
serve it); a backend that gives none leaves those columns at documented neutral values.

| key            | space                         | content                                                 |
|----------------|-------------------------------|---------------------------------------------------------|
| ``self``       | Box(0, 1, (F,), float32)      | the agent's own state: answer schema, confidence, profile, last action, round |
| ``peers``      | Box(0, 1, (N-1, F), float32)  | the peers' rows, in the fixed order i+1, i+2, ... (mod N)  |
| ``agreement``  | Box(0, 1, (N-1,), float32)    | 1 where that peer holds the same answer as agent i       |
| ``action_mask``| Box(0, 1, (A,), int8)         | legal actions (A = 3, or 2 + N): CONCEDE needs a peer with a different answer |

(``formats.FEATURE_KEYS``: ``formats.feature_spaces`` and ``formats.feature_arrays`` build the first three.)

The ground truth never enters an observation. A masked action is played as PERSIST (``invalid_action="raise"``
rejects it). Episodes draw their problems from ``split`` (default ``"train"``; ``split="test"`` to evaluate).

Rewards, per agent and round (``deliberation_env.core.rewards``): ``w_local * r_local +
w_global * r_global + w_team * r_team + w_tokens * r_tokens`` with r_local (own correctness
change) and r_global (consensus correct minus leave-one-out consensus correct) as in
docs/method.md, section 3; weights from ``reward_weights=`` (default local 1, global 1, team 0, tokens 0).

``infos[agent]`` each step (fresh dicts): ``answer``, ``confidence``, ``confidence_source``,
``tokens`` (this step), ``tokens_total``, ``consensus``, ``round``, ``problem_id``,
``action`` (the action applied), ``reward_<component>`` for every component, and the
privileged ``correct``, ``consensus_correct``, ``concede_target`` (agent name or None),
``concede_target_correct`` and ``oracle_action`` (for logging and training labels only).
``infos="numeric"`` keeps floats only (same keys every step), ``infos="none"`` empty dicts;
``action_mask="info"`` or ``"both"`` also puts the mask in each info (see ``deliberation_env.formats``
and docs/interop.md for each RL library's recipe).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import gymnasium
import numpy as np
from gymnasium.utils import seeding
from pettingzoo import ParallelEnv

from deliberation_env.backends.base import Backend
from deliberation_env.core import features
from deliberation_env.core.actions import action_name
from deliberation_env.core.deliberation import Action, Deliberation, DeliberationConfig, RoundOutcome
from deliberation_env.formats import FEATURE_KEYS, ObservationFormat, feature_arrays, peer_matrix
from deliberation_env.grouping import answer_pending
from deliberation_env.options import CONFIG_KEYWORDS, FLAT_KEYWORDS, WRAPPER_KEYWORDS, env_parts
from deliberation_env.replay.backend import bind_replay
from deliberation_env.requests import Completion, Request
from deliberation_env.tasks.base import Problem, Task


class DeliberationEnv(ParallelEnv):
    """The ParallelEnv adapter around ``core.Deliberation`` (see the module docstring).

    ``task``: a Task or a registered name (default: a replay backend's recorded task, else ``"arithmetic"``);
    ``backend``: a Backend, a list of one per agent, or a registered name; ``config``: the ``DeliberationConfig``
    (agents, rounds, rewards, sampling; default: its own defaults, or a replay backend's recorded game);
    ``split``: the task's split the episodes draw from (default ``"train"``: evaluate on ``split="test"``);
    ``format``: the ``ObservationFormat``.
    The flat keywords of ``parallel_env`` (``num_agents=``, ``observation=``, ``cache=``, ...; ``options.py``) are
    accepted here too and mapped onto these parts by ``options.env_parts``."""

    metadata: dict[str, Any] = {"name": "deliberation_v0", "render_modes": ["ansi", "human"], "is_parallelizable": True}
    phased = True
    """Runners may drive it in phases (``deliberation_env.vector``): begin_*, pending_requests/receive, end_*."""

    def __init__(
        self,
        task: str | Task | None = None,
        backend: str | Backend | Sequence[Backend] = "sim",
        config: DeliberationConfig | None = None,
        split: str = "train",
        render_mode: str | None = None,
        *,
        format: ObservationFormat | None = None,
        agent_names: Sequence[str] | None = None,
        invalid_action: str | None = None,
        **options: Any,
    ):
        unknown = sorted(set(options) - {*FLAT_KEYWORDS, *CONFIG_KEYWORDS, *WRAPPER_KEYWORDS})
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; accepted: {', '.join(accepted_options())}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be None or one of {self.metadata['render_modes']}, got {render_mode!r}")
        parts = env_parts(task, backend, config, format, invalid_action, options)
        self.task, self.backends, self.config = parts.task, parts.backends, parts.config
        self.format, self.invalid_action = parts.format, parts.invalid_action
        self.split, self.render_mode = split, render_mode
        # before the task's problems: a replay set names a task or split it lacks, instead of the task failing
        binding = bind_replay(self.backends, self.task, self.config, split)
        if binding is not None:  # a replay set: its recorded problems and its sample streams
            self.config = replace(self.config, streams=binding.streams, request_format=binding.request_format)
        self.problems: Sequence[Problem] = self.task.problems(split) if binding is None else binding.problems
        if len(self.problems) == 0:
            raise ValueError(f"task {self.task.name!r} has no problems in split {split!r}")

        num_agents, width = self.config.num_agents, features.num_features(self.config.features)
        self.possible_agents = _agent_names(agent_names, num_agents)
        self.agents: list[str] = []
        self._index = {name: i for i, name in enumerate(self.possible_agents)}
        self.deliberation = Deliberation(self.task, self.config)
        space = self.format.space(num_agents, width, self.deliberation.num_actions)
        self.observation_spaces = {agent: space for agent in self.possible_agents}
        self.state_space = gymnasium.spaces.Box(0.0, 1.0, (num_agents * width,), np.float32)
        self.action_spaces = {agent: gymnasium.spaces.Discrete(self.deliberation.num_actions)
                              for agent in self.possible_agents}
        self._peer_matrix = peer_matrix([self.deliberation.peer_indices(i) for i in range(num_agents)])
        self._generator: np.random.Generator | None = None  # made at the first draw (``np_random``)
        self._stream, self._copies = (next(_UNSEEDED),), 0
        self.np_random_seed: int | None = None
        self.last_outcome: RoundOutcome | None = None
        """The outcome of the last step (rewards and their components per agent); None before an episode's first."""
        self._last_actions: list[Action | None] = [None] * num_agents

    # ------------------------------------------------------------------ seeding
    @property
    def np_random(self) -> np.random.Generator:
        """The generator of the episodes' problems and episode seeds: ``reset(seed=s)`` seeds it, and unseeded resets
        continue it. An env that draws before any seed draws from a stream of its own (``unseeded_seed``), the same
        on every run of a program, never from OS entropy."""
        if self._generator is None:
            self.np_random_seed = unseeded_seed(self._stream)
            self._generator = seeding.np_random(self.np_random_seed)[0]
        return self._generator

    @np_random.setter
    def np_random(self, generator: np.random.Generator) -> None:
        self._generator = generator

    def __getstate__(self) -> dict[str, Any]:
        """A copy of an env that has not drawn yet (SuperSuit's vector envs copy one env by pickling, in one process or
        in worker processes) gets a stream of its own, the k-th copy stream k under this env's; one that has drawn or
        been seeded copies its generator's state, as any copy does."""
        state = dict(self.__dict__)
        if self._generator is None:
            state["_stream"], state["_copies"] = (*self._stream, self._copies), 0
            self._copies += 1
        return state

    # ------------------------------------------------------------------ PettingZoo API
    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Discrete:
        return self.action_spaces[agent]

    @property
    def last_actions(self) -> tuple[Action | None, ...]:
        """The meta-action applied to each agent (by index) in the last step; None before the episode's first step.

        A masked CONCEDE shows as the PERSIST it became under ``invalid_action="persist"``."""
        return tuple(self._last_actions)

    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        self.begin_episode(seed, options)
        answer_pending([self])
        return self.end_reset()

    def step(self, actions: Mapping[str, Any]):
        self.begin_step(actions)
        answer_pending([self])
        return self.end_step()

    # The phased form of reset/step: a batching runner gathers pending_requests() of many envs,
    # answers them in one backend call, hands each env its completions, then ends the step.
    def begin_episode(self, seed: int | None = None, options: Mapping[str, Any] | None = None) -> Problem:
        """``reset``'s draws (seed the generator, pick the problem, draw the episode seed), then
        ``begin_reset``: every runner that resets in phases makes the same draws as ``reset``."""
        if seed is not None:
            self._generator, self.np_random_seed = seeding.np_random(seed)
        problem = self._pick_problem(dict(options or {}))
        self.begin_reset(problem, int(self.np_random.integers(0, 2**62)))
        return problem

    def begin_reset(self, problem: Problem, episode_seed: int) -> None:
        self.agents = []  # until end_reset: a reset that fails leaves no live agents of the old episode
        self.deliberation.start(problem, episode_seed)
        self.last_outcome, self._last_actions = None, [None] * self.config.num_agents

    def end_reset(self):
        self.agents = list(self.possible_agents)
        observations = self._observations()
        return observations, self._infos(None)

    def begin_step(self, actions: Mapping[str, Any]) -> None:
        self.deliberation.begin_round(*self._validate(actions))

    def end_step(self):
        outcome = self.deliberation.finish_round()
        self.last_outcome = outcome
        observations = self._observations()
        rewards = {agent: outcome.rewards[i] for i, agent in enumerate(self.agents)}
        terminations = {agent: outcome.done for agent in self.agents}
        truncations = {agent: False for agent in self.agents}
        infos = self._infos(outcome)
        if self.render_mode == "human":
            self.render()
        if outcome.done:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def pending_requests(self) -> list[Request]:
        return self.deliberation.pending_requests()

    def receive(self, completions: Sequence[Completion]) -> None:
        self.deliberation.receive(completions)

    def render(self, mode: str | None = None) -> str | None:
        """Render in ``render_mode`` (or ``mode``: RLlib's wrapper passes it positionally)."""
        mode = mode or self.render_mode
        if mode is None:
            gymnasium.logger.warn("render() called without a render_mode; pass render_mode='ansi' or 'human'")
            return None
        if mode not in self.metadata["render_modes"]:
            raise ValueError(f"render mode must be one of {self.metadata['render_modes']}, got {mode!r}")
        text = self._render_text()
        if mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        for backend in {id(b): b for b in self.backends}.values():
            close = getattr(backend, "close", None)
            if callable(close):
                close()

    def state(self) -> np.ndarray:
        """The global state (all agents' feature rows, flattened): for centralised critics."""
        return self.deliberation.feature_matrix().reshape(-1)

    # ------------------------------------------------------------------ helpers
    def _pick_problem(self, options: dict[str, Any]) -> Problem:
        unknown = sorted(set(options) - {"problem_index", "problem_id"})
        if unknown:  # options is free-form in PettingZoo; say what we ignore
            gymnasium.logger.warn(f"reset() ignores unknown option(s) {unknown}; accepted: problem_index, problem_id")
        if "problem_index" in options:
            index = options["problem_index"]
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(self.problems):
                raise ValueError(f"problem_index must be an integer in [0, {len(self.problems)}), got {index!r}")
            return self.problems[int(index)]
        if "problem_id" in options:
            for problem in self.problems:
                if problem.id == options["problem_id"]:
                    return problem
            raise ValueError(f"no problem with id {options['problem_id']!r} in split {self.split!r}")
        return self.problems[int(self.np_random.integers(len(self.problems)))]

    def _validate(self, actions: Mapping[str, Any]) -> tuple[list[Action], list[int | None]]:
        """Each live agent's meta-action and named concede target (None: the rule's), masked ones as PERSIST
        under ``invalid_action="persist"``."""
        if self.deliberation.pending_requests():
            raise RuntimeError(
                "the last reset() or step() was interrupted (e.g. by a BackendError) before its completions arrived; "
                "call env.reset() to start a new episode")
        if not self.agents:
            if self.deliberation.problem is None:
                raise RuntimeError("step() called before reset(); call env.reset(seed=...) first")
            raise RuntimeError("step() called after the episode ended; call env.reset() to start a new one")
        if not isinstance(actions, Mapping):
            raise TypeError(f"actions must be a dict {{agent: action}}, got {type(actions).__name__}")
        missing = [a for a in self.agents if a not in actions]
        extra = [a for a in actions if a not in self._index]
        if missing or extra:
            raise KeyError(f"actions must have exactly one entry per live agent {self.agents}; missing {missing}, unknown {extra}")
        core, count = self.deliberation, self.deliberation.num_actions
        masks = core.action_masks()
        chosen, targets = [], []
        for agent in self.agents:
            value = actions[agent]
            if isinstance(value, np.ndarray) and value.shape == ():
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < count:
                raise ValueError(f"action {value!r} for {agent} is not one of "
                                 f"{[f'{i}={action_name(i)}' for i in range(count)]}")
            index = self._index[agent]
            action, target = core.decode_action(index, int(value))
            if not masks[index, int(value)]:
                if self.invalid_action == "raise":
                    raise ValueError(
                        f"{action_name(int(value))} is masked for {agent}: no such peer holds a different answer (see "
                        "obs['action_mask']); this env has invalid_action='raise', the default 'persist' plays a "
                        "masked action as PERSIST"
                    )
                action, target = Action.PERSIST, None
            chosen.append(action)
            targets.append(target)
        self._last_actions = list(chosen)
        return chosen, targets

    def _observations(self) -> dict[str, Any]:
        # Every array is built once per call for all agents (fresh each step); agents get views of their rows.
        core = self.deliberation
        parts = feature_arrays(core.feature_matrix(), self._peer_matrix, [a.answer for a in core.agents])
        masks = core.action_masks()
        observation = self.format.observation
        observations = {}
        for agent in self.agents:
            i = self._index[agent]
            raw = {key: parts[key][i] for key in FEATURE_KEYS}
            raw["action_mask"] = masks[i]
            observations[agent] = observation(raw)
        return observations

    def _infos(self, outcome: RoundOutcome | None) -> dict[str, dict[str, Any]]:
        if self.format.infos == "none" and not self.format.mask_in_info:
            return {agent: {} for agent in self.agents}
        core = self.deliberation
        consensus = core.consensus()
        consensus_correct = bool(core.grade(consensus))
        problem_id = core.problem.id if core.problem else None
        masks = core.action_masks()  # the infos' own arrays, apart from the observations'
        zeros = dict.fromkeys(core.config.reward_weights, 0.0)
        infos = {}
        for agent in self.agents:
            i = self._index[agent]
            state = core.agents[i]
            target = core.concede_target(i)
            components = outcome.components[i] if outcome else zeros
            action = self._last_actions[i]
            full = {
                "answer": state.answer,
                "confidence": float(state.confidence),
                "confidence_source": state.confidence_source,
                "tokens": int(state.step_tokens),
                "tokens_total": int(state.total_tokens),
                "consensus": consensus,
                "round": core.round,
                "problem_id": problem_id,
                "action": None if action is None else action.name,
            }
            for name, value in components.items():
                full[f"reward_{name}"] = float(value)
            full["correct"] = bool(state.correct)
            full["consensus_correct"] = consensus_correct
            full["concede_target"] = None if target is None else self.possible_agents[target]
            full["concede_target_correct"] = target is not None and bool(core.agents[target].correct)
            full["oracle_action"] = int(core.oracle_action(i))
            infos[agent] = self.format.info(full, masks[i], self._index)
        return infos

    def _render_text(self) -> str:
        core = self.deliberation
        if core.problem is None:
            return "(not reset)"
        lines = [f"[{self.task.name}] problem {core.problem.id} - round {core.round}/{self.config.max_rounds}"]
        for i, state in enumerate(core.agents):
            action = "-" if state.last_action is None else state.last_action.name
            mark = "right" if state.correct else "wrong"
            lines.append(
                f"  {self.possible_agents[i]}: answer={state.answer!s:>12}  conf={state.confidence:.2f}  action={action:<8} "
                f"tokens={state.total_tokens:>5}  ({mark})"
            )
        consensus = core.consensus()
        lines.append(f"  consensus: {consensus} ({'right' if core.grade(consensus) else 'wrong'}; gold {core.problem.answer})")
        return "\n".join(lines)


_UNSEEDED = itertools.count()
"""Numbers the envs of this process in the order they are made: the stream of one that draws unseeded."""
UNSEEDED_ENTROPY = 0x5EED_DE11
"""The root of the unseeded streams, apart from every small seed a user passes."""


def unseeded_seed(stream: tuple[int, ...]) -> int:
    """The seed of an unseeded env's stream (its number, then one number per copy down to it): distinct per env and
    copy, the same on every run of a program."""
    return int(np.random.SeedSequence((UNSEEDED_ENTROPY, *stream)).generate_state(1, np.uint32)[0])


def _agent_names(names: Sequence[str] | None, count: int) -> list[str]:
    """``agent_0`` ... by default; custom names e.g. for libraries that share one network per name prefix."""
    if names is None:
        return [f"agent_{i}" for i in range(count)]
    names = list(names) if not isinstance(names, str) else [names]
    if len(names) != count or len(set(names)) != count or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"agent_names must be {count} distinct non-empty strings (one per agent), got {names!r}")
    return names


def accepted_options() -> list[str]:
    """Every keyword ``parallel_env`` accepts: ``DeliberationEnv``'s parameters, then the flat keywords mapped onto
    them (``options``), then ``DeliberationConfig``'s fields (for error messages and docs)."""
    import inspect

    named = [name for name, p in inspect.signature(DeliberationEnv.__init__).parameters.items()
             if name != "self" and p.kind is not p.VAR_KEYWORD]
    flat = [name for name in (*FLAT_KEYWORDS, *WRAPPER_KEYWORDS) if name not in named]
    return named + flat + sorted(set(CONFIG_KEYWORDS) - {*named, *flat})

