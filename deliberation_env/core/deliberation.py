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
on the order of the agents (a mutual CONCEDE swaps the two answers). A round past
``config.refine_rounds`` offers no REFINE and asks for nothing: a CONCEDE there keeps the
confidence its target holds, the critic's verdict on the very text it adopts.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import cast

import numpy as np

from deliberation_env.core import features
from deliberation_env.core.actions import FIRST_PEER_ACTION, Action, decode, num_actions
from deliberation_env.core.confidence import answer_confidence, parse_confidence
from deliberation_env.core.config import DeliberationConfig
from deliberation_env.core.consensus import plurality
from deliberation_env.core.rewards import RoundFacts, reward_components, total_reward
from deliberation_env.core.roles import role_indices, role_task
from deliberation_env.core.seeds import request_seed, stream_seed
from deliberation_env.core.sim_context import SimContext, register_source
from deliberation_env.core.state import AgentState, Phase, RoundOutcome
from deliberation_env.core.tools import TOOLS, Tool, is_tool_kind
from deliberation_env.requests import Completion, Request, RequestKind, sanitize_completion
from deliberation_env.tasks.base import PeerView, Problem, Task, short_rationale

log = logging.getLogger(__name__)
__all__ = ["Action", "AgentState", "Deliberation", "DeliberationConfig", "Phase", "RoundOutcome"]


_EPISODE_IDS = itertools.count(1)  # Request.episode: distinct per episode in this process
_SOURCE_IDS = itertools.count(1)  # Request.source: distinct per deliberation (and fork) in this process
_PARSED: dict[tuple[int, str], tuple[str | None, tuple[float, ...]]] = {}
"""(id(task), text) -> (extracted answer, text profile), shared by every deliberation in the process: texts repeat
within and across episodes and envs (a sim renders a few texts per problem), and parsing them is the cost."""
_PARSED_TASKS: dict[int, Task] = {}
"""The tasks whose ids key ``_PARSED``, kept alive while their entries exist (so that no id is reused)."""
_PARSED_LIMIT = 32_768


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
        self._generating = True
        self._starting = False
        self._round_start: list[AgentState] = []
        self._derived: dict[str, object] = {}
        self._solutions: dict[int, Completion] = {}
        """The solutions whose programs are running (a TOOL phase), by agent."""
        self.round_requests: list[tuple[int, str, int, int]] = []
        """(agent, kind, prompt_tokens, completion_tokens) of every request answered in the current round (since
        ``start`` or ``begin_round``), in order: what the agents' ``step_tokens`` are made of (traces read it)."""
        count = config.num_agents
        self._peers = [[(agent + offset) % count for offset in range(1, count)] for agent in range(count)]
        blocks = features.lineage(config.features)
        self._signals = any(block.logprobs for block in blocks)
        self.role_of = role_indices(config.roles, count) if any(block.roles for block in blocks) else None
        """Each agent's role index, for a feature set that needs roles (``core.features.TeamView``); else None."""
        starts = list(itertools.accumulate((len(block.columns) for block in blocks), initial=0))
        self._fills = [(start, stop, block.fill) for start, stop, block in zip(starts, starts[1:], blocks)]
        roles = config.roles or [None] * count
        self._tasks = [role_task(task, role) for role in roles]
        """Each agent's view of the task: its role's prompt style (the critic uses ``task``'s own prompts)."""
        self._tools: list[Tool | None] = [None if role is None or role.tool is None else TOOLS[role.tool]
                                          for role in roles]
        self._temperatures = [config.temperature if role is None or role.temperature is None else role.temperature
                              for role in roles]
        self.num_actions = num_actions(count, config.concede_to_peer)
        """The width of an action mask: 3, plus one CONCEDE per peer with ``config.concede_to_peer``."""
        self._width = starts[-1]

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
        self._derived, self._solutions = {}, {}
        self.round_requests = []
        self._request_generation([(i, self._tasks[i].solve_messages(problem), "solve")
                                  for i in range(self.config.num_agents)])

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
        if Action.REFINE in actions and not self.refine_open:
            raise ValueError(f"round {self.round + 1} offers no REFINE (refine_rounds={self.config.refine_rounds}): "
                             "its agents may PERSIST or CONCEDE (see action_mask)")
        assert self.problem is not None
        self._generating = self.refine_open  # a round without REFINE asks for nothing, critics included
        self._correct_before = tuple(agent.correct for agent in self.agents)
        snapshot = [agent.copy() for agent in self.agents]
        targets = [self._chosen_target(i, targets[i] if targets is not None else None) for i in range(len(self.agents))]
        jobs = []
        self._changed = []
        self._derived = {}
        self.round_requests = []
        for i, (agent, action) in enumerate(zip(self.agents, actions)):
            agent.last_action, agent.step_tokens = Action(action), 0
            if action == Action.REFINE:
                peers = [PeerView(snapshot[j].answer, short_rationale(snapshot[j].text)) for j in self.peer_indices(i)]
                jobs.append((i, self._tasks[i].refine_messages(self.problem, agent.text, peers), "refine"))
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
        self.round_requests.extend((r.agent, r.kind, c.prompt_tokens, c.completion_tokens)
                                   for r, c in zip(requests, completions))
        self._derived = {}
        if self.phase is Phase.GENERATE:
            runs = []
            for request, completion in zip(requests, completions):
                self._absorb_solution(request.agent, completion)
                tool = self._tools[request.agent]
                if tool is not None and (messages := tool.request(completion.text)) is not None:
                    runs.append(self._request(request.agent, messages, tool.kind))
                    self._solutions[request.agent] = completion  # read once the tool's output is in
                else:
                    self._read_answer(request.agent, completion)
            if runs:
                self._pending, self.phase = runs, Phase.TOOL
            else:
                self._request_critics()
        elif self.phase is Phase.TOOL:
            for request, completion in zip(requests, completions):
                self._absorb_output(request.agent, completion.text)
                self._read_answer(request.agent, self._solutions.pop(request.agent))
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
    def refine_open(self) -> bool:
        """Whether the next round offers REFINE (``config.refine_rounds``)."""
        return self.config.refine_rounds is None or self.round < self.config.refine_rounds

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

    def decode_action(self, agent: int, index: int) -> tuple[Action, int | None]:
        """The meta-action and named concede target (None: the rule's) of ``agent``'s action ``index``."""
        return decode(index, self._peers[agent])

    def action_mask(self, agent: int) -> np.ndarray:
        """int8 over the action indices: CONCEDE where a concede target exists; CONCEDE to peer k where peer k
        holds another answer (``concede_to_peer``)."""
        mask = np.ones(self.num_actions, dtype=np.int8)
        mask[Action.REFINE] = self.refine_open
        mask[Action.CONCEDE] = self.concede_target(agent) is not None
        if self.config.concede_to_peer:
            options = self.concede_options(agent)
            mask[FIRST_PEER_ACTION:] = [peer in options for peer in self._peers[agent]]
        return mask

    def action_masks(self) -> np.ndarray:
        """Every agent's ``action_mask`` as the rows of one fresh (N, num_actions) int8 array."""
        if not self.config.concede_to_peer:
            refine = self.refine_open
            return np.array([[1, refine, self.concede_target(i) is not None] for i in range(len(self.agents))],
                            dtype=np.int8)
        return np.stack([self.action_mask(i) for i in range(len(self.agents))])

    def oracle_action(self, agent: int) -> int:
        """The oracle label (docs/method.md, section 4): PERSIST if right, CONCEDE if its target is, else (with
        ``concede_to_peer``) CONCEDE to the first right peer it can adopt, else REFINE (PERSIST in a round that
        offers no REFINE)."""
        if self.agents[agent].correct:
            return Action.PERSIST
        target = self.concede_target(agent)
        if target is not None and self.agents[target].correct:
            return Action.CONCEDE
        if self.config.concede_to_peer:
            options = self.concede_options(agent)
            for slot, peer in enumerate(self._peers[agent]):
                if peer in options and self.agents[peer].correct:
                    return FIRST_PEER_ACTION + slot
        return Action.REFINE if self.refine_open else Action.PERSIST

    def feature_matrix(self) -> np.ndarray:
        """One row of the config's feature set per agent (float32, shape (N, F)): each declaration of the set's
        lineage fills its own columns (``core.features``)."""
        rows = np.zeros((len(self.agents), self._width), dtype=np.float32)
        for start, stop, fill in self._fills:
            fill(self, rows[:, start:stop])
        return rows

    @property
    def max_rounds(self) -> int:
        return self.config.max_rounds

    def peer_indices(self, agent: int) -> list[int]:
        """Peers in a fixed order relative to ``agent``: agent+1, agent+2, ... (cyclic)."""
        return list(self._peers[agent])

    # ------------------------------------------------------------ internals
    def sim_context(self, request: Request) -> SimContext:
        """The simulated backend's view of one of this deliberation's pending requests (``core.sim_context``):
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

    def sampling(self, agent: int, kind: RequestKind) -> tuple[int, float]:
        """The ``max_tokens`` and temperature of ``agent``'s requests of ``kind`` under this config (a replay backend
        answers only the sampling settings of the envs it checked)."""
        if kind == "critic":
            return self.config.critic_max_tokens, self.config.critic_temperature
        return self.config.max_tokens, 0.0 if is_tool_kind(kind) else self._temperatures[agent]

    def _request(self, agent: int, messages, kind: RequestKind) -> Request:
        critic, generation = kind == "critic", kind in ("solve", "refine")
        config = self.config
        max_tokens, temperature = self.sampling(agent, kind)
        return Request(
            messages=messages,
            kind=kind,
            agent=agent,
            seed=request_seed(self._seed, self.request_round, agent, kind),
            max_tokens=max_tokens,
            temperature=temperature,
            logprobs=critic and config.confidence == "critic",
            token_logprobs=generation and (config.confidence == "answer_logprobs" or self._signals),
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
        length = min(completion.completion_tokens / self.config.max_tokens, 1.0)
        agent.profile = (
            text_features[0],
            length,
            *text_features[1:],
            agent.refinements / self.config.max_rounds,
            1.0 if changed and not self._starting else 0.0,
        )
        self._spend(agent, completion)

    def _read_answer(self, index: int, completion: Completion) -> None:
        """What the completion says of the answer the agent gives (its program's where its tool answers): the v2
        signals and the ``answer_logprobs`` confidence."""
        agent = self.agents[index]
        if self._signals:
            agent.signals = features.completion_signals(completion, agent.answer)
        if self.config.confidence == "answer_logprobs":
            agent.confidence, agent.confidence_source = answer_confidence(completion, agent.answer)

    def _absorb_output(self, index: int, output: str) -> None:
        agent = self.agents[index]
        try:
            answer = self.task.extract_answer(output) if output.strip() else None
        except Exception:  # an extractor bug must not crash the env on odd program output
            answer = None
        agent.tool_ran, agent.tool_agrees = answer is not None, answer is not None and answer == agent.answer
        tool = self._tools[index]
        if answer is not None and tool is not None and tool.answers:
            agent.answer, agent.correct = answer, self.grade(answer)

    def _concede(self, index: int, source: AgentState) -> None:
        agent = self.agents[index]
        changed = source.answer != agent.answer
        agent.text, agent.answer, agent.correct = source.text, source.answer, source.correct
        agent.tool_ran, agent.tool_agrees = source.tool_ran, source.tool_agrees
        agent.signals = source.signals
        agent.profile = (*source.profile[:-2], agent.refinements / self.config.max_rounds, float(changed))
        if self.config.reintrospect_concede and self.config.confidence != "answer_logprobs" and self._generating:
            self._changed.append(index)
        else:
            agent.confidence, agent.confidence_source = source.confidence, source.confidence_source

    @staticmethod
    def _spend(agent: AgentState, completion: Completion) -> None:
        agent.step_tokens += completion.tokens
        agent.total_tokens += completion.tokens
