"""The deliberation itself: a plain state machine, with no PettingZoo and no I/O.

An episode is a pure function of (seed, actions, backend completions). The caller drives
it in phases, which keeps "which generations do you need?" apart from "here they are", so
that many deliberations can batch their requests into one backend call::

    deliberation.start(problem, seed)            # or: deliberation.begin_round(actions)
    while requests := deliberation.pending_requests():
        deliberation.receive(backend.generate(requests))
    outcome = deliberation.finish_round()        # after begin_round; start() needs no finish

Round 0 (``start``): every agent solves the problem, then a critic call gives each agent
its introspective confidence. Each later round: PERSIST keeps the state; CONCEDE adopts the
answer, text, profile and correctness that the concede target held at the start of the round;
REFINE generates a revised solution that sees the peers' answers and short rationales as they
were at the start of the round; every agent whose answer or text changed is re-introspected.
All of a round's meta-actions act on that round-start snapshot, so the outcome does not depend
on the order of the agents (a mutual CONCEDE swaps the two answers).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum, IntEnum
from typing import cast

import numpy as np

from deliberation_env.backends.base import Completion, Request, RequestKind, sanitize_completion
from deliberation_env.backends.sim_context import SimContext, register_source
from deliberation_env.core import features
from deliberation_env.core.confidence import answer_confidence, parse_confidence
from deliberation_env.core.consensus import plurality, support
from deliberation_env.core.rewards import RoundFacts, check_weights, reward_components, total_reward
from deliberation_env.core.seeds import REQUEST_FORMAT, REQUEST_FORMATS, request_seed, stream_seed
from deliberation_env.tasks.base import PeerView, Problem, Task, short_rationale

log = logging.getLogger(__name__)


class Action(IntEnum):
    """The meta-actions."""

    PERSIST = 0
    REFINE = 1
    CONCEDE = 2


CONCEDE_TARGETS = ("most_confident", "plurality")
CONFIDENCE_SOURCES = ("critic", "critic_text", "answer_logprobs")
_EPISODE_IDS = itertools.count(1)  # Request.episode: distinct per episode in this process
_SOURCE_IDS = itertools.count(1)  # Request.source: distinct per deliberation (and fork) in this process
_PARSED: dict[tuple[int, str], tuple[str | None, tuple[float, ...]]] = {}
"""(id(task), text) -> (extracted answer, text profile), shared by every deliberation in the process: texts repeat
within and across episodes and envs (a sim renders a few texts per problem), and parsing them is the cost."""
_PARSED_TASKS: dict[int, Task] = {}
"""The tasks whose ids key ``_PARSED``, kept alive while their entries exist (so that no id is reused)."""
_PARSED_LIMIT = 32_768


@dataclass(frozen=True)
class DeliberationConfig:
    """Settings of the deliberation (validated on construction)."""

    num_agents: int = 3
    max_rounds: int = 3
    concede_target: str = "most_confident"
    """Whom CONCEDE adopts: the most confident disagreeing peer, or the peers' plurality answer."""
    early_stop: bool = False
    """End the episode early when every agent PERSISTs on a unanimous answer."""
    reintrospect_concede: bool = True
    """Re-run the critic after a CONCEDE (else the agent copies the target's confidence)."""
    reward_weights: Mapping[str, float] = field(default_factory=dict)
    confidence: str = "critic"
    """Where an agent's confidence comes from: ``critic`` (a second call; its first-token Yes/No
    log-probabilities, else the number or verdict it writes), ``critic_text`` (the same call without
    asking for log-probabilities, for servers that cannot return them), or ``answer_logprobs`` (the
    probability of the answer's own tokens in the solution: no critic call at all)."""
    max_tokens: int = 512
    critic_max_tokens: int = 48
    temperature: float = 0.7
    critic_temperature: float = 0.0
    streams: int | None = None
    """When set, every episode draws its generations from one of this many sample streams per problem: the
    episode seed picks stream ``seed % streams``, whose seed is ``stream_seed(stream, problem id)``. Replay sets
    record S streams per problem and set this to S; None (the default) uses the episode seed itself."""
    request_format: int = REQUEST_FORMAT
    """How stream seeds are derived (``REQUEST_FORMAT``); only replay sets recorded under an older format set it."""
    features: str = "v1"
    """The observation's feature set (``core.features.FEATURE_SETS``): ``v1``, or ``v2``, which adds signals read
    off each agent's latest completion and asks the backend for token log-probabilities (the requests' replay keys
    stay the same: a replay set serves both)."""

    def __post_init__(self) -> None:
        _check_int("num_agents", self.num_agents, 1)
        _check_int("max_rounds", self.max_rounds, 1)
        _check_int("max_tokens", self.max_tokens, 1)
        _check_int("critic_max_tokens", self.critic_max_tokens, 1)
        if self.streams is not None:
            _check_int("streams", self.streams, 1)
        if self.request_format not in REQUEST_FORMATS:
            raise ValueError(f"request_format must be one of {REQUEST_FORMATS}, got {self.request_format!r}")
        if self.confidence not in CONFIDENCE_SOURCES:
            raise ValueError(f"confidence must be one of {CONFIDENCE_SOURCES}, got {self.confidence!r}")
        features.feature_names(self.features)  # ValueError naming the feature sets
        if self.concede_target not in CONCEDE_TARGETS:
            raise ValueError(f"concede_target must be one of {CONCEDE_TARGETS}, got {self.concede_target!r}")
        for name in ("temperature", "critic_temperature"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 5.0:
                raise ValueError(f"{name} must be a number in [0, 5], got {value!r}")
        object.__setattr__(self, "reward_weights", check_weights(self.reward_weights))


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class AgentState:
    """One agent's local state z_i = (answer, profile, confidence), plus bookkeeping."""

    text: str = ""
    answer: str | None = None
    correct: bool = False
    """Privileged: whether ``answer`` is right. Never part of an observation."""
    confidence: float = 0.5
    confidence_source: str = "none"
    profile: tuple[float, ...] = (0.0,) * len(features.PROFILE_FEATURES)
    signals: features.CompletionSignals = features.NO_SIGNALS
    """The raw signals of its latest completion (kept with ``features="v2"``; a CONCEDE takes its target's)."""
    last_action: Action | None = None
    refinements: int = 0
    step_tokens: int = 0
    total_tokens: int = 0

    def copy(self) -> AgentState:
        """A shallow copy (the round-start snapshot); several times faster than ``dataclasses.replace``."""
        clone = object.__new__(AgentState)
        clone.__dict__.update(self.__dict__)
        return clone


@dataclass(frozen=True)
class RoundOutcome:
    """Everything a round produced, per agent where it is a tuple."""

    round: int
    consensus: str | None
    consensus_correct: bool
    leave_one_out: tuple[str | None, ...]
    components: tuple[dict[str, float], ...]
    rewards: tuple[float, ...]
    done: bool


class Phase(Enum):
    IDLE = "idle"
    GENERATE = "generate"
    CRITIC = "critic"
    READY = "ready"


class Deliberation:
    """N agents deliberating on one problem (see the module docstring for the protocol)."""

    def __init__(self, task: Task, config: DeliberationConfig):
        self.task = task
        self.config = config
        self.agents: list[AgentState] = []
        self.problem: Problem | None = None
        self.round = 0
        self.done = False
        self.phase = Phase.IDLE
        self._seed = 0
        self._episode = 0
        self._source = next(_SOURCE_IDS)
        register_source(self._source, self)
        self._pending: list[Request] = []
        self._changed: list[int] = []
        self._correct_before: tuple[bool, ...] = ()
        self._grades: dict[str | None, bool] = {}
        self._all_persist = False
        self._starting = False
        self._round_start: list[AgentState] = []
        self._derived: dict[str, object] = {}
        self.request_log: list[tuple[int, str, int, int]] | None = None
        """When a list (episode traces), receive() appends (agent, kind, prompt_tokens, completion_tokens)."""
        count = config.num_agents
        self._peers = [[(agent + offset) % count for offset in range(1, count)] for agent in range(count)]
        self._signals = config.features != "v1"
        self._width = features.num_features(config.features)

    # ----------------------------------------------------------------- phases
    def start(self, problem: Problem, seed: int) -> None:
        """Begin an episode: every agent solves the problem (round 0). With ``config.streams`` the seed picks a
        stream (``seed % streams``) and the episode runs on that stream's seed."""
        seed = int(seed)
        if self.config.streams is not None:
            seed = stream_seed(seed % self.config.streams, problem.id, self.config.request_format)
        self.problem, self._seed = problem, seed
        self._episode = next(_EPISODE_IDS)  # a routing hint for backends; no part of the episode's outcome
        self.agents = [AgentState() for _ in range(self.config.num_agents)]
        self.round, self.done, self._grades = 0, False, {}
        self._changed, self._starting = [], True
        self._derived = {}
        if self.request_log is not None:
            self.request_log.clear()
        messages = self.task.solve_messages(problem)
        self._request_generation([(i, messages, "solve") for i in range(self.config.num_agents)])

    def begin_round(self, actions: Sequence[Action], targets: Sequence[int | None] | None = None) -> None:
        """Apply one meta-action per agent (already validated and legal), all on the round-start state.

        ``targets[i]``, where given and not None, is the peer whose answer agent i's CONCEDE adopts (one of
        ``concede_options(i)``); elsewhere the config's ``concede_target`` rule picks it."""
        if self.phase is not Phase.IDLE:
            raise RuntimeError(
                f"a round is still in progress (phase {self.phase.value}): the previous reset() or step() was "
                "interrupted before its completions arrived; call reset() to start a new episode")
        if self.done:
            raise RuntimeError("begin_round() after the episode ended; call reset() to start a new one")
        assert self.problem is not None
        self._correct_before = tuple(agent.correct for agent in self.agents)
        snapshot = [agent.copy() for agent in self.agents]
        targets = [self._chosen_target(i, targets[i] if targets is not None else None) for i in range(len(self.agents))]
        jobs = []
        self._changed = []
        self._derived = {}
        for i, (agent, action) in enumerate(zip(self.agents, actions)):
            agent.last_action, agent.step_tokens = Action(action), 0
            if action == Action.REFINE:
                peers = [PeerView(snapshot[j].answer, short_rationale(snapshot[j].text)) for j in self.peer_indices(i)]
                jobs.append((i, self.task.refine_messages(self.problem, agent.text, peers), "refine"))
                agent.refinements += 1
            elif action == Action.CONCEDE and (target := targets[i]) is not None:  # masked CONCEDE: adapter decides
                self._concede(i, snapshot[target])
        self._round_start = snapshot
        self._all_persist = all(action == Action.PERSIST for action in actions)
        if jobs:
            self._request_generation(jobs)
        else:
            self._request_critics()

    def pending_requests(self) -> list[Request]:
        """The generations this deliberation waits for (empty when it can go on)."""
        return list(self._pending)

    def receive(self, completions: Sequence[Completion]) -> None:
        """Hand over the completions of ``pending_requests()``, in the same order."""
        if len(completions) != len(self._pending):
            raise ValueError(f"expected {len(self._pending)} completions, got {len(completions)}")
        requests, self._pending = self._pending, []
        completions = [sanitize_completion(completion) for completion in completions]
        if self.request_log is not None:
            self.request_log.extend((r.agent, r.kind, c.prompt_tokens, c.completion_tokens)
                                    for r, c in zip(requests, completions))
        self._derived = {}
        if self.phase is Phase.GENERATE:
            for request, completion in zip(requests, completions):
                self._absorb_solution(request.agent, completion)
                if self.config.confidence == "answer_logprobs":
                    agent = self.agents[request.agent]
                    agent.confidence, agent.confidence_source = answer_confidence(completion, agent.answer)
            self._request_critics()
        elif self.phase is Phase.CRITIC:
            for request, completion in zip(requests, completions):
                agent = self.agents[request.agent]
                agent.confidence, agent.confidence_source = parse_confidence(completion)
                self._spend(agent, completion)
            self.phase = Phase.READY
        else:
            raise RuntimeError(f"receive() called with nothing pending (phase {self.phase.value})")
        if self.phase is Phase.READY and self._starting:
            self._starting = False
            self.phase = Phase.IDLE  # round 0 needs no finish_round()

    def finish_round(self) -> RoundOutcome:
        """Close the round: consensus, leave-one-out, rewards, termination."""
        if self.phase is not Phase.READY:
            raise RuntimeError(f"finish_round() before all completions arrived (phase {self.phase.value})")
        self.phase = Phase.IDLE
        self.round += 1
        unanimous = self.agents[0].answer is not None and len({a.answer for a in self.agents}) == 1
        self.done = self.round >= self.config.max_rounds or (
            self.config.early_stop and self._all_persist and unanimous
        )
        consensus = self.consensus()
        answers = [a.answer for a in self.agents]
        confidences = [a.confidence for a in self.agents]
        loo = tuple(plurality(answers, confidences, exclude=i) for i in range(len(answers)))
        facts = RoundFacts(
            correct_before=self._correct_before,
            correct_after=tuple(a.correct for a in self.agents),
            consensus_correct=self.grade(consensus),
            leave_one_out_correct=tuple(self.grade(answer) for answer in loo),
            tokens=tuple(a.step_tokens for a in self.agents),
            final=self.done,
        )
        components = tuple(reward_components(facts, i) for i in range(len(self.agents)))
        weights = self.config.reward_weights
        rewards = tuple(total_reward(c, weights) for c in components)
        return RoundOutcome(self.round, consensus, facts.consensus_correct, loo, components, rewards, self.done)

    # ------------------------------------------------------------- queries
    @property
    def ready_to_finish(self) -> bool:
        """Whether a round begun with ``begin_round`` has all its completions, so ``finish_round()`` is due.

        False while requests are pending, between rounds, and after ``start`` (round 0 needs no finish)."""
        return self.phase is Phase.READY

    @property
    def seed(self) -> int:
        """The seed the episode's requests are derived from (the stream's seed when ``config.streams`` is set)."""
        return self._seed

    def consensus(self) -> str | None:
        if "consensus" not in self._derived:
            self._derived["consensus"] = plurality([a.answer for a in self.agents], [a.confidence for a in self.agents])
        return cast("str | None", self._derived["consensus"])  # _derived: each key holds what its method stored

    def grade(self, answer: str | None) -> bool:
        """Grade an answer once per episode (graders may run code)."""
        if answer not in self._grades:
            assert self.problem is not None
            try:
                self._grades[answer] = answer is not None and bool(self.task.grade(self.problem, answer))
            except Exception as error:  # a grader must not crash the env on odd model output: a wrong answer
                log.warning("grader of task %r raised %r on answer %r; graded as wrong", self.task.name, error, answer)
                self._grades[answer] = False
        return self._grades[answer]

    def concede_target(self, agent: int) -> int | None:
        """The peer ``agent`` would adopt with CONCEDE, or None when no peer disagrees with an answer."""
        targets = self._derived.get("targets")
        if targets is None:
            targets = self._derived["targets"] = [self._find_target(i) for i in range(len(self.agents))]
        return cast("list[int | None]", targets)[agent]  # stored just above (or by an earlier call)

    def concede_options(self, agent: int) -> list[int]:
        """The peers ``agent`` can CONCEDE to, in ``peer_indices`` order: those holding an answer other than its own."""
        own = self.agents[agent].answer
        return [j for j in self._peers[agent] if self.agents[j].answer not in (None, own)]

    def _chosen_target(self, agent: int, chosen: int | None) -> int | None:
        if chosen is None:
            return self.concede_target(agent)
        if chosen not in self.concede_options(agent):
            raise ValueError(f"agent {agent} cannot concede to agent {chosen}: the peers it can adopt now are "
                             f"{self.concede_options(agent)} (those holding another answer)")
        return chosen

    def _find_target(self, agent: int) -> int | None:
        own = self.agents[agent].answer
        others = [j for j in range(len(self.agents)) if j != agent and self.agents[j].answer not in (None, own)]
        if not others:
            return None
        if self.config.concede_target == "plurality":
            answers = [a.answer if j in others else None for j, a in enumerate(self.agents)]
            chosen = plurality(answers, [a.confidence for a in self.agents])
            others = [j for j in others if self.agents[j].answer == chosen]
        return max(others, key=lambda j: (self.agents[j].confidence, -j))

    def action_mask(self, agent: int) -> np.ndarray:
        """int8 [PERSIST, REFINE, CONCEDE]: CONCEDE only when a concede target exists."""
        return np.array([1, 1, 0 if self.concede_target(agent) is None else 1], dtype=np.int8)

    def action_masks(self) -> np.ndarray:
        """Every agent's ``action_mask`` as the rows of one fresh (N, 3) int8 array."""
        return np.array([[1, 1, self.concede_target(i) is not None] for i in range(len(self.agents))], dtype=np.int8)

    def oracle_action(self, agent: int) -> Action:
        """The oracle label (docs/method.md, section 4): PERSIST if right, CONCEDE if its target is, else REFINE."""
        if self.agents[agent].correct:
            return Action.PERSIST
        target = self.concede_target(agent)
        if target is not None and self.agents[target].correct:
            return Action.CONCEDE
        return Action.REFINE

    def feature_matrix(self) -> np.ndarray:
        """One row of the config's feature set per agent (float32, shape (N, F); ``core.features``)."""
        answers = [a.answer for a in self.agents]
        consensus = self.consensus()
        supports = support(answers)
        rows = np.zeros((len(self.agents), self._width), dtype=np.float32)
        for i, agent in enumerate(self.agents):
            row = rows[i]
            row[0] = agent.answer is not None
            row[1] = supports[i]
            row[2] = agent.answer is not None and agent.answer == consensus
            row[3] = agent.confidence
            row[features.PROFILE_OFFSET : features.ACTION_OFFSET] = agent.profile
            row[features.ACTION_OFFSET + (0 if agent.last_action is None else 1 + agent.last_action)] = 1.0
            if self._signals:
                target = self.concede_target(i)
                row[features.SIGNAL_OFFSET : -1] = agent.signals.row()
                row[-1] = target is not None and self.agents[target].answer == consensus
        rows[:, features.NUM_FEATURES - 1] = self.round / self.config.max_rounds
        return rows

    def peer_indices(self, agent: int) -> list[int]:
        """Peers in a fixed order relative to ``agent``: agent+1, agent+2, ... (cyclic)."""
        return list(self._peers[agent])

    # ------------------------------------------------------------ internals
    def sim_context(self, request: Request) -> SimContext:
        """The simulated backend's view of one of this deliberation's pending requests (``backends.sim_context``):
        the agent's state now, its peers as the request's prompt shows them (a refine: at the start of the round)."""
        if request.source != self._source or request.episode != self._episode:
            raise RuntimeError("sim_context() of a request of another deliberation or episode")
        assert self.problem is not None
        peer_states = self._round_start if request.kind == "refine" else self.agents
        peers = [peer_states[j] for j in self._peers[request.agent]]
        own = self.agents[request.agent]
        return SimContext(self.task, self.problem, own.answer, own.correct, tuple([p.answer for p in peers]),
                          tuple([p.correct for p in peers]))

    def __setstate__(self, state: dict[str, object]) -> None:
        """A copy (``TextDeliberationEnv.fork``'s deep copy, or one unpickled) is a source of its own: the simulated
        backend answers its pending requests from its state (``sim_context``)."""
        self.__dict__.update(state)
        self._source = next(_SOURCE_IDS)
        self._pending = [replace(request, source=self._source) for request in self._pending]
        register_source(self._source, self)

    @property
    def request_round(self) -> int:
        """The round the pending requests belong to: 0 while starting, else the round being played."""
        return self.round if self._starting else self.round + 1

    def _request(self, agent: int, messages, kind: RequestKind) -> Request:
        critic = kind == "critic"
        config = self.config
        return Request(
            messages=messages,
            kind=kind,
            agent=agent,
            seed=request_seed(self._seed, self.request_round, agent, kind),
            max_tokens=config.critic_max_tokens if critic else config.max_tokens,
            temperature=config.critic_temperature if critic else config.temperature,
            logprobs=critic and config.confidence == "critic",
            token_logprobs=not critic and (config.confidence == "answer_logprobs" or self._signals),
            episode=self._episode,
            source=self._source,
            problem=self.problem.id if self.problem is not None else None,
        )

    def _request_generation(self, jobs) -> None:
        self._pending = [self._request(agent, messages, kind) for agent, messages, kind in jobs]
        self._changed = sorted(set(self._changed) | {agent for agent, _, _ in jobs})
        self.phase = Phase.GENERATE

    def _request_critics(self) -> None:
        assert self.problem is not None
        if self.config.confidence == "answer_logprobs":  # the confidence came with the solution
            self._changed = []
        self._pending = [
            self._request(i, self.task.critic_messages(self.problem, self.agents[i].text), "critic")
            for i in self._changed
        ]
        self.phase = Phase.CRITIC if self._pending else Phase.READY

    def _absorb_solution(self, index: int, completion: Completion) -> None:
        agent, text = self.agents[index], completion.text
        parsed = _PARSED.get((id(self.task), text))
        if parsed is None:
            if len(_PARSED) > _PARSED_LIMIT:
                _PARSED.clear()
                _PARSED_TASKS.clear()
            try:
                answer = self.task.extract_answer(text)
            except Exception:  # an extractor bug must not crash the env on odd model output
                answer = None
            _PARSED_TASKS[id(self.task)] = self.task
            parsed = _PARSED[id(self.task), text] = (answer, features.text_profile(text))
        answer, text_features = parsed
        changed = answer != agent.answer
        agent.text, agent.answer = text, answer
        agent.correct = self.grade(answer)
        if self._signals:
            agent.signals = features.completion_signals(completion, answer)
        length = min(completion.completion_tokens / self.config.max_tokens, 1.0)
        agent.profile = (
            text_features[0],
            length,
            *text_features[1:],
            agent.refinements / self.config.max_rounds,
            1.0 if changed and not self._starting else 0.0,
        )
        self._spend(agent, completion)

    def _concede(self, index: int, source: AgentState) -> None:
        agent = self.agents[index]
        changed = source.answer != agent.answer
        agent.text, agent.answer, agent.correct = source.text, source.answer, source.correct
        agent.signals = source.signals
        agent.profile = (*source.profile[:-2], agent.refinements / self.config.max_rounds, float(changed))
        if self.config.reintrospect_concede and self.config.confidence != "answer_logprobs":
            self._changed.append(index)
        else:
            agent.confidence, agent.confidence_source = source.confidence, source.confidence_source

    @staticmethod
    def _spend(agent: AgentState, completion: Completion) -> None:
        agent.step_tokens += completion.tokens
        agent.total_tokens += completion.tokens
