"""The deliberation with the agents' completions as actions: a text-action PettingZoo ParallelEnv.

The same core state machine as the meta-action env (``deliberation_env.env``), driven by the
agents' own text instead of a backend: each pending ``Request`` of the core becomes its agent's
observation (the chat messages it would be prompted with, the request kind, the structured
features), and the string the agent returns becomes that request's ``Completion``. The
meta-actions (PERSIST / REFINE / CONCEDE) come from ``meta_policy``: a fixed protocol by name
(``deliberation_env.protocols``, e.g. "debate") or a second policy. Rewards, infos, consensus
and termination are the meta-action env's, plus the named turn terms of
``deliberation_env.text_rewards``.

| Import          | ``deliberation_env.text_env(task="arithmetic", meta_policy="debate")``             |
|-----------------|-------------------------------------------------------------------------------------|
| Actions         | ``UnicodeText(max_action_chars)``: the completion, any str of at most that length    |
|                 | (``step`` also takes a ``Completion``: its text, token counts and log-probabilities) |
| Observation     | Dict: ``kind`` Discrete(4), ``messages`` Sequence of {role, content}, ``features``   |
| Step            | one phase of the core: every agent with a request answers it; the others wait      |
| Episode length  | round 0 (solve, critic), then per round a refine and a critic step where any: 2 to 2 + 2 * max_rounds steps |

``kind``: 0 wait (nothing to answer; the action is ignored, send ""), 1 solve, 2 refine,
3 critic. ``messages``: a tuple of ``{"role", "content"}`` dicts, ready for a chat template
(empty while waiting). ``features``: the meta-action observation's ``self``, ``peers`` and
``agreement`` (``deliberation_env.core.features``), as the state is when the request is made.
``env.requests`` maps each agent with a turn to its core ``Request`` (``max_tokens``,
``temperature``, ``seed`` for your sampler).

Critic (confidence) calls: with ``critic="agent"`` (default) they are the agents' own turns
(an agent states its confidence in its own answer; read from the text, as ``critic_text``);
with a backend (a name such as ``"sim"`` or a ``Backend``) that backend answers them and the
agents never see them; ``confidence="answer_logprobs"`` makes none.

An action is a str, or the sampler's ``Completion`` (``deliberation_env.backends.base``). A str carries no
log-probabilities (``answer_logprobs`` confidence stays 0.5; a critic's Yes/No log-probabilities are absent) and its
tokens are counted with ``count_tokens``; a ``Completion`` is handed to the core as the meta-action env hands it a
backend's, with its token counts, ``token_logprobs`` and ``top_logprobs``: confidences, the consensus tie-break and
the token costs are then those of the meta-action env with that backend.

``fork()`` branches an episode: an independent env in the same state (tree rollouts, ``baselines.llm.rollout``).
"""

from __future__ import annotations

import copy
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import gymnasium
import numpy as np
from pettingzoo import ParallelEnv

from deliberation_env import text_rewards
from deliberation_env.backends.base import Backend, estimate_tokens
from deliberation_env.core import features
from deliberation_env.core.confidence import parse_confidence
from deliberation_env.core.tools import is_tool_kind
from deliberation_env.formats import FEATURE_KEYS, feature_arrays, feature_spaces, peer_matrix
from deliberation_env.grouping import answer_pending
from deliberation_env.make import parallel_env
from deliberation_env.protocols import PROTOCOLS, make_protocol
from deliberation_env.requests import Completion, Request, sanitize_completion
from deliberation_env.settings import settings_from
from deliberation_env.tasks.base import Task

KINDS = ("wait", "solve", "refine", "critic")
"""``observation["kind"]`` indexes this tuple."""
DEFAULT_MAX_PROMPT_CHARS = 32_768

MetaPolicy = Callable[[Mapping[str, Any], Mapping[str, Mapping[str, Any]]], Mapping[str, int]]


class UnicodeText(gymnasium.spaces.Text):
    """A ``Text`` space of any str up to ``max_length`` characters (samples use printable ASCII).

    Gymnasium's ``Text`` only contains strings over its charset; model output is arbitrary Unicode.
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | None = None):
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


class ActionKeyError(KeyError):
    """Actions for the wrong set of agents (a KeyError whose message prints as written)."""

    def __str__(self) -> str:
        return str(self.args[0])


class _TextActions:
    """The meta env's backend when completions come from actions: it must never be asked."""

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        raise RuntimeError("the text env's completions are its agents' actions; nothing should call its backend")

    def identity(self) -> str:
        return "text-actions"


@dataclass
class TextEnvSettings:
    """The text env's own settings, besides ``parallel_env``'s: every field is a keyword of ``text_env``."""

    meta_policy: str | MetaPolicy | Any = "debate"
    """The meta-actions: a fixed protocol's name (``deliberation_env.protocols``), a callable (observations, infos) ->
    {agent: action}, or an object with ``act(observations, infos)``."""
    critic: str | Backend = "agent"
    """Who answers the critic (confidence) calls: ``"agent"``, the agents themselves as turns of their own, or a
    backend (a registered name or a ``Backend``) that answers them unseen by the agents."""
    reward_weights: Mapping[str, float] | None = None
    """Weights of the round terms and of the turn terms (``deliberation_env.text_rewards``); None: the defaults."""
    max_action_chars: int | None = None
    """The longest completion an action may be (None: 8 x the config's ``max_tokens``)."""
    max_prompt_chars: int = DEFAULT_MAX_PROMPT_CHARS
    """The longest message an observation may hold."""
    count_tokens: Callable[[str], int] = estimate_tokens
    """Counts a str action's tokens, e.g. ``lambda s: len(tokenizer.encode(s))`` (a ``Completion`` brings its own)."""

    def __post_init__(self) -> None:
        for name in ("max_action_chars", "max_prompt_chars"):
            value = getattr(self, name)
            if (value is not None or name == "max_prompt_chars") and (
                    isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not callable(self.count_tokens):
            raise TypeError("count_tokens must be a callable str -> int (e.g. len(tokenizer.encode(s))), got "
                            f"{self.count_tokens!r}")


TEXT_SETTINGS = tuple(f.name for f in fields(TextEnvSettings))
"""The keywords of ``text_env`` that are the text env's own settings (``TextEnvSettings``)."""


class TextDeliberationEnv(ParallelEnv):
    """The text-action env (see the module docstring): ``parallel_env``'s parameters and options, and ``settings=`` (a
    ``TextEnvSettings``) or its fields as keywords (``meta_policy=``, ``critic=``, ...)."""

    metadata = {"name": "deliberation_text_v0", "render_modes": ["ansi", "human"], "is_parallelizable": True}

    def __init__(self, task: str | Task | None = None, num_agents: int | None = None, max_rounds: int | None = None,
                 data_dir: str | None = None, split: str = "train", render_mode: str | None = None, *,
                 settings: TextEnvSettings | None = None, **options: Any):
        if "backend" in options:
            raise TypeError("the text env takes no backend: the agents' actions are the completions; "
                            "pass critic=BACKEND to have a backend answer the confidence (critic) calls")
        own = {name: options.pop(name) for name in TEXT_SETTINGS if name in options}
        self.settings = settings = settings_from(TextEnvSettings, settings, own, "TextDeliberationEnv")
        round_weights, self.turn_weights = text_rewards.split_weights(settings.reward_weights)
        critic = settings.critic
        backend = _TextActions() if isinstance(critic, str) and critic == "agent" else critic
        # the meta-action env (in a TraceWrapper with trace=): the text env drives its phases
        self.meta = parallel_env(task, backend, num_agents, max_rounds, data_dir, split, render_mode,
                                 reward_weights=round_weights, **options)
        self.critic_by_backend = not isinstance(backend, _TextActions)
        self.meta_policy = _resolve_meta_policy(settings.meta_policy)
        config = self.meta.config
        self.max_action_chars = settings.max_action_chars or 8 * config.max_tokens
        self.max_prompt_chars, self.count_tokens = int(settings.max_prompt_chars), settings.count_tokens
        self.task, self.config, self.render_mode = self.meta.task, config, render_mode
        self.possible_agents = list(self.meta.possible_agents)
        self.agents: list[str] = []

        message = gymnasium.spaces.Dict({"role": gymnasium.spaces.Text(9, min_length=4, charset=string.ascii_lowercase),
                                         "content": UnicodeText(self.max_prompt_chars)})
        space = gymnasium.spaces.Dict({
            "kind": gymnasium.spaces.Discrete(len(KINDS)),
            "messages": gymnasium.spaces.Sequence(message),
            "features": gymnasium.spaces.Dict(feature_spaces(config.num_agents, features.num_features(config.features))),
        })
        self.observation_spaces = {agent: space for agent in self.possible_agents}
        self.action_spaces = {agent: UnicodeText(self.max_action_chars) for agent in self.possible_agents}
        self._pending: list[Request] = []
        self._answers: list[Completion | None] = []
        self._turns: dict[int, int] = {}

    # ------------------------------------------------------------------ PettingZoo API
    def observation_space(self, agent: str) -> gymnasium.spaces.Dict:
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> UnicodeText:
        return self.action_spaces[agent]

    @property
    def deliberation(self):
        """The core state machine (shared with ``self.meta``)."""
        return self.meta.deliberation

    @property
    def requests(self) -> dict[str, Request]:
        """The core request each agent answers this step (agents that wait are absent)."""
        return {self.possible_agents[i]: self._pending[p] for i, p in sorted(self._turns.items())}

    def reset(self, seed: int | None = None, options: Mapping[str, Any] | None = None):
        problem = self.meta.begin_episode(seed, options)
        reset = getattr(self.meta_policy, "reset", None)
        if callable(reset):
            reset(seed)
        self.agents = list(self.possible_agents)
        self._advance()
        infos = {agent: {"round": 0, "problem_id": problem.id} for agent in self.agents}
        return self._observations(), infos

    def step(self, actions: Mapping[str, Any]):
        answers = self._validate(actions)
        turns: dict[int, text_rewards.TurnFacts] = {}
        for i, position in self._turns.items():
            turns[i] = self._answer(position, answers[i])
        if all(answer is not None for answer in self._answers):
            self.deliberation.receive(self._answers)
            closed = self._advance()
        else:  # an agent has several requests in this phase: it answers the next one in the next step
            self._assign_turns()
            closed = []
        return self._finish_step(turns, closed)

    def fork(self) -> TextDeliberationEnv:
        """An independent env in this env's state: stepping the fork leaves this env as it was, and the reverse.

        A deep copy that shares what an episode never changes (the task and its problems, the backends, the spaces,
        ``count_tokens``); the meta-policy is copied with the env (a protocol's state, e.g. ``random``'s generator,
        branches too: give a policy holding large weights a ``__deepcopy__`` that shares them)."""
        meta = self.meta
        shared = [self.task, meta.problems, self.deliberation.problem, self.count_tokens, self.config, meta.config,
                  self.observation_spaces, self.action_spaces, meta.observation_spaces, meta.action_spaces, meta.format,
                  meta.state_space, *meta.backends]
        return copy.deepcopy(self, {id(item): item for item in shared})

    def score(self, agent: str, texts: Sequence[str | Completion]) -> list[dict[str, float]]:
        """The turn terms (and their weighted ``reward``) of candidate completions for ``agent``'s request.

        Nothing advances: a trainer samples G completions, scores them here for group-relative
        advantages, then acts with one of them. Round terms need the whole round, so they are absent.
        """
        index = self.possible_agents.index(agent) if agent in self.possible_agents else None
        if index is None or index not in self._turns:
            raise ValueError(f"{agent!r} has no request to answer now; agents with one: {sorted(self.requests)}")
        scores = []
        request = self._pending[self._turns[index]]
        for text in texts:
            self._check_text(agent, text)
            terms = text_rewards.turn_terms(self._facts(request, self._completion(request, text)))
            scores.append({**terms, "reward": text_rewards.weighted(terms, self.turn_weights)})
        return scores

    def render(self) -> str | None:
        return self.meta.render()

    def state(self) -> np.ndarray:
        return self.meta.state()

    def close(self) -> None:
        self.meta.close()

    # ------------------------------------------------------------------ the phases
    def _advance(self) -> list[tuple[dict[str, dict[str, Any]], dict[str, float]]]:
        """Run the core until agents must write: close finished rounds, apply the meta-policy.

        Returns the (infos, rewards) of every round closed on the way, as the meta env gave them.
        """
        meta, core = self.meta, self.deliberation
        closed: list[tuple[dict[str, dict[str, Any]], dict[str, float]]] = []
        self._pending, self._answers, self._turns = [], [], {}  # until it returns: nothing to answer
        while True:
            # the sandbox answers a program-aided role's runs, the backend (if given) the critic phases: the agents
            # never see them
            answer_pending([meta], when=self._not_the_agents)
            requests = core.pending_requests()
            if requests:
                self._pending, self._answers = requests, [None] * len(requests)
                self._assign_turns()
                return closed
            if core.ready_to_finish:
                observations, rewards, _, _, infos = meta.end_step()
            else:  # round 0 is complete
                observations, infos = meta.end_reset()
                rewards = dict.fromkeys(infos, 0.0)
            closed.append((infos, rewards))
            if core.done:
                return closed
            meta.begin_step(self._meta_actions(observations, infos))

    def _not_the_agents(self, requests: Sequence[Request]) -> bool:
        """Whether a phase's requests are answered without the agents: tool runs, or critics with a critic backend."""
        return all(is_tool_kind(r.kind) for r in requests) or (
            self.critic_by_backend and all(r.kind == "critic" for r in requests))

    def _meta_actions(self, observations, infos) -> Mapping[str, Any]:
        policy = self.meta_policy
        actions = policy.act(observations, infos) if hasattr(policy, "act") else policy(observations, infos)
        if not isinstance(actions, Mapping):
            raise TypeError(f"meta_policy must return a dict {{agent: action}}, got {type(actions).__name__}")
        return actions

    def _assign_turns(self) -> None:
        """Each agent answers the first of its unanswered requests."""
        self._turns = {}
        for position, (request, answer) in enumerate(zip(self._pending, self._answers)):
            if answer is None:
                self._turns.setdefault(request.agent, position)

    def _answer(self, position: int, action: str | Completion) -> text_rewards.TurnFacts:
        request = self._pending[position]
        completion = self._completion(request, action)
        self._answers[position] = completion
        return self._facts(request, completion)

    def _completion(self, request: Request, action: str | Completion) -> Completion:
        """The core's completion of an action: a str counted with ``count_tokens``, a ``Completion`` as it is."""
        if isinstance(action, Completion):
            return sanitize_completion(action)  # as the core will see it (unusable token counts become 0)
        return Completion(action, sum(self.count_tokens(m.content) for m in request.messages), self.count_tokens(action))

    def _facts(self, request: Request, completion: Completion) -> text_rewards.TurnFacts:
        core = self.deliberation
        tokens = completion.completion_tokens
        if request.kind == "critic":
            confidence, source = parse_confidence(completion)
            return text_rewards.TurnFacts("critic", source != "default", core.agents[request.agent].correct,
                                          confidence, tokens)
        try:
            answer = self.task.extract_answer(completion.text)
        except Exception:  # as the core does: an extractor bug on odd output is no answer
            answer = None
        return text_rewards.TurnFacts(request.kind, answer is not None, core.grade(answer), None, tokens)

    def _finish_step(self, turns: Mapping[int, text_rewards.TurnFacts], closed):
        core = self.deliberation
        done = core.done
        team_correct = core.grade(core.consensus())  # the answers held now (graded once per answer)
        consensus_correct = team_correct if done else False
        observations = self._observations()
        rewards, infos = {}, {}
        for i, agent in enumerate(self.possible_agents):
            if agent not in self.agents:
                continue
            turn = turns.get(i, text_rewards.TurnFacts(None))
            turn = text_rewards.TurnFacts(turn.kind, turn.readable, turn.correct, turn.confidence,
                                          turn.completion_tokens, done, consensus_correct, team_correct)
            terms = text_rewards.turn_terms(turn)
            rounds = [{**round_infos[agent], "reward": round_rewards[agent]} for round_infos, round_rewards in closed]
            round_terms = {f"reward_{name}": sum((r.get(f"reward_{name}", 0.0) for r in rounds), 0.0)
                           for name in text_rewards.ROUND_REWARDS}
            rewards[agent] = sum(r["reward"] for r in rounds) + text_rewards.weighted(terms, self.turn_weights)
            infos[agent] = {
                **(rounds[-1] if rounds else {"round": core.round}),
                **round_terms,
                **{f"reward_{name}": value for name, value in terms.items()},
                "reward": rewards[agent],
                "kind": turn.kind,
                "rounds_closed": len(rounds),
                "rounds": rounds,
            }
        terminations = {agent: done for agent in self.agents}
        truncations = {agent: False for agent in self.agents}
        if done:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    # ------------------------------------------------------------------ helpers
    def _validate(self, actions: Mapping[str, Any]) -> dict[int, str | Completion]:
        if not self.agents:
            if self.deliberation.problem is None:
                raise RuntimeError("step() called before reset(); call env.reset(seed=...) first")
            raise RuntimeError("step() called after the episode ended; call env.reset() to start a new one")
        if not self._pending:
            raise RuntimeError("the last reset() or step() was interrupted (e.g. the meta_policy or a critic backend "
                               "raised) before the next requests were made; call env.reset() to start a new episode")
        if not isinstance(actions, Mapping):
            raise TypeError(f"actions must be a dict {{agent: completion text}}, got {type(actions).__name__}")
        missing = [a for a in self.agents if a not in actions]
        extra = [a for a in actions if a not in self.agents]
        if missing or extra:
            raise ActionKeyError(f"actions must have exactly one entry per live agent {self.agents} (\"\" for an agent "
                           f"that waits); missing {missing}, unknown {extra}")
        for agent in self.agents:
            self._check_text(agent, actions[agent])
        return {i: actions[agent] if isinstance(actions[agent], Completion) else str(actions[agent])
                for i, agent in enumerate(self.possible_agents) if agent in actions}

    def _check_text(self, agent: str, action: Any) -> None:
        text = action.text if isinstance(action, Completion) else action
        if not isinstance(text, str):
            raise TypeError(f"the action of {agent} must be a str (its completion text) or a Completion, got "
                            f"{type(action).__name__}: {action!r:.80}")
        if len(text) > self.max_action_chars:
            raise ValueError(f"the action of {agent} has {len(text)} characters, more than the action space's "
                             f"max_length {self.max_action_chars}: cap the completion (the request's max_tokens) "
                             "or pass a larger max_action_chars=")

    def _observations(self) -> dict[str, dict[str, Any]]:
        core = self.deliberation
        peers = peer_matrix([core.peer_indices(i) for i in range(len(core.agents))])
        parts = feature_arrays(core.feature_matrix(), peers, [a.answer for a in core.agents])
        observations = {}
        for agent in self.agents:
            i = self.possible_agents.index(agent)
            request = self._pending[self._turns[i]] if i in self._turns else None
            kind = "wait" if request is None else request.kind
            messages = () if request is None else tuple(m.as_dict() for m in request.messages)
            for message in messages:
                if len(message["content"]) > self.max_prompt_chars:
                    raise ValueError(f"a {kind} prompt of {agent} has {len(message['content'])} characters, "
                                     f"more than max_prompt_chars={self.max_prompt_chars}; pass a larger one")
            observations[agent] = {"kind": KINDS.index(kind), "messages": messages,
                                   "features": {key: parts[key][i] for key in FEATURE_KEYS}}
        return observations


def _resolve_meta_policy(policy: Any) -> Any:
    if isinstance(policy, str):
        if policy not in PROTOCOLS:
            raise ValueError(f"unknown meta_policy {policy!r}; named schedules (deliberation_env.protocols): "
                             f"{list(PROTOCOLS)}, or pass a callable (observations, infos) -> {{agent: action}}")
        return make_protocol(policy)
    if not (callable(policy) or callable(getattr(policy, "act", None))):
        raise TypeError(f"meta_policy must be a protocol name {list(PROTOCOLS)}, a callable (observations, infos) "
                        f"-> {{agent: action}} or an object with act(observations, infos); got {policy!r}")
    return policy


def text_env(task: str | Task | None = None, num_agents: int | None = None, max_rounds: int | None = None,
             **kwargs: Any) -> TextDeliberationEnv:
    """The deliberation with completions as actions (see the ``deliberation_env.text`` module docstring); what is not
    given comes from ``config=``, else ``DeliberationConfig``'s defaults, as in ``parallel_env``."""
    return TextDeliberationEnv(task=task, num_agents=num_agents, max_rounds=max_rounds, **kwargs)
