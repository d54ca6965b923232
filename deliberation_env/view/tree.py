"""A replay set's recorded deliberation, problem by problem, read by playing the real env.

For each problem of a split, ``walk_split`` plays every joint action of the first deliberation round on
``replay_env`` (through the library's episode runner) and keeps what a reader wants to see: each agent's round-0
solution (text, extracted answer, the critic's verdict and confidence, the program and its output for agents whose
role has a tool), what each move of each agent leads to (its REFINE text, the peer a CONCEDE adopts), the final
consensus of every joint action, and the joint actions the fixed protocols play. The walk listens to the env's
backend, so every state also keeps the calls that made it (``Call``: the prompt each call was shown, what came back
and its tokens, as recorded): the solve, the program's run, the critic's verdict, a REFINE and its prompt.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deliberation_env.backends.base import Completion, Request
from deliberation_env.chat import Message
from deliberation_env.core.actions import FIRST_PEER_ACTION, action_name
from deliberation_env.core.deliberation import AgentState
from deliberation_env.core.tools import TOOLS, is_tool_kind
from deliberation_env.make import replay_env
from deliberation_env.protocols import make_protocol
from deliberation_env.replay.dataset import ReplaySet
from deliberation_env.vector import Start, Step, run_episodes

PROTOCOLS = ("self_consistency", "debate", "threshold", "oracle")
"""The fixed protocols whose joint action is marked on the grid (deterministic ones; the oracle is privileged)."""


@dataclass
class Call:
    """One request an agent's move made, and its recorded answer."""

    kind: str
    """``solve``, ``refine``, ``critic`` or a tool's kind (``run``)."""
    messages: tuple[Message, ...]
    """The prompt: what the call was shown (a tool's run: the program)."""
    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass
class AgentView:
    """One agent's state after a move: what it wrote and what the env made of it."""

    text: str
    answer: str | None
    correct: bool
    confidence: float
    confidence_source: str
    tool_ran: bool = False
    tool_agrees: bool = False
    program: str | None = None
    """The program its tool ran (the text's last code block), for agents whose role has a tool."""
    output: str | None = None
    """What that program printed (empty: it failed or printed nothing; None: no run recorded)."""
    critic: str | None = None
    """The critic's verdict on the text (None: no critic call made this state)."""
    target: str | None = None
    """For a CONCEDE: the agent whose answer it adopted."""
    calls: list[Call] = field(default_factory=list)
    """The calls that made this state, in order (a PERSIST, or a CONCEDE that keeps its peer's confidence: none)."""


@dataclass
class Cell:
    """One joint action of the first round and where it ends."""

    joint: tuple[int, ...]
    played: tuple[str, ...]
    """The meta-actions the env applied (a masked CONCEDE is played as PERSIST)."""
    answers: tuple[str | None, ...]
    consensus: str | None
    correct: bool
    tokens: int

    @property
    def masked(self) -> bool:
        """Some agent's action was masked (and played as PERSIST)."""
        return any(masked(a, p) for a, p in zip(self.joint, self.played))


@dataclass
class ProblemTree:
    """One problem of a set: its round 0, each agent's moves, and every joint action's outcome."""

    split: str
    index: int
    id: str
    question: str
    gold: str
    level: Any
    agents: list[str]
    roles: list[str | None]
    round0: list[AgentView]
    vote: str | None
    vote_correct: bool
    concede_targets: list[str | None]
    """The peer each agent's CONCEDE (action 2) adopts under the set's rule; None where it is masked."""
    oracle_actions: list[int]
    num_actions: int
    """Action indices per agent: 3, or 2 + N in the game with CONCEDE to a named peer."""
    peers: list[list[str]] = field(default_factory=list)
    """Each agent's peers in observation order: CONCEDE to peer k (action 3 + k) adopts ``peers[agent][k]``."""
    moves: list[dict[int, AgentView]] = field(default_factory=list)
    """Per agent: its state after each action index it can play (the same whatever the others do)."""
    cells: list[Cell] = field(default_factory=list)
    protocols: dict[str, tuple[int, ...]] = field(default_factory=dict)
    tokens0: int = 0

    def cell(self, joint: Sequence[int]) -> Cell:
        """The cell of a joint action (itertools.product order over the action indices)."""
        index = 0
        for action in joint:
            index = index * self.num_actions + int(action)
        return self.cells[index]

    def concede_target(self, agent: int, action: int) -> str | None:
        """The peer whose answer ``agent`` adopts with CONCEDE action ``action`` (the rule's for index 2)."""
        if action < FIRST_PEER_ACTION:
            return self.concede_targets[agent]
        return self.peers[agent][action - FIRST_PEER_ACTION]

    def action_label(self, agent: int, action: int) -> str:
        """``PERSIST``, ``REFINE``, ``CONCEDE`` or ``CONCEDE→agent_k`` (a named peer)."""
        if action < FIRST_PEER_ACTION:
            return action_name(action)
        return f"CONCEDE→{self.concede_target(agent, action)}"

    @property
    def distinct_answers(self) -> int:
        return len({view.answer for view in self.round0})

    @property
    def right_cells(self) -> int:
        return sum(cell.correct for cell in self.cells)


def walk_split(replay: ReplaySet, split: str, indices: Iterable[int] | None = None, *, stream: int = 0,
               chosen_targets: bool = False) -> list[ProblemTree]:
    """Every joint action of round 1 on the problems ``indices`` (default: all) of ``split``, on ``stream``.
    ``chosen_targets``: the game with CONCEDE to a named peer (``concede_to_peer=True``; the set must hold every
    concede target)."""
    env = replay_env(replay, split=split, invalid_action="persist", max_rounds=1, concede_to_peer=chosen_targets)
    try:
        return _Walk(env, split, stream).run(indices)
    finally:
        env.close()


class _Listener:
    """The env's backend, keeping every request it answers with its completion until the walk takes them."""

    def __init__(self, backend: Any):
        self.backend = backend
        self.answers_tools = getattr(backend, "answers_tools", False)  # a replay backend answers the recorded runs
        self.heard: list[tuple[Request, Completion]] = []

    def identity(self) -> str:
        return str(self.backend.identity())

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        completions = self.backend.generate(requests)
        self.heard.extend(zip(requests, completions))
        return completions

    def take(self, agents: int) -> list[list[Call]]:
        """The calls heard since the last take, per agent (and forget them)."""
        calls: list[list[Call]] = [[] for _ in range(agents)]
        for request, completion in self.heard:
            calls[request.agent].append(Call(request.kind, request.messages, completion.text,
                                             completion.prompt_tokens, completion.completion_tokens))
        self.heard = []
        return calls


class _Walk:
    """One split's walk: the env, the backend it listens to, and the trees built so far."""

    def __init__(self, env: Any, split: str, stream: int):
        if not 0 <= stream < env.config.streams:
            raise ValueError(f"stream {stream}: the set holds streams 0-{env.config.streams - 1}")
        self.env, self.split, self.stream = env, split, stream
        self.agents = list(env.possible_agents)
        self.roles = list(env.config.roles) if env.config.roles is not None else [None] * len(self.agents)
        self.joints = list(itertools.product(range(env.action_space(self.agents[0]).n), repeat=len(self.agents)))
        self.listener = _Listener(env.backends[0])  # replay_env: one backend serves every agent
        self.trees: list[ProblemTree] = []

    def run(self, indices: Iterable[int] | None) -> list[ProblemTree]:
        problems = self.env.problems
        chosen = list(range(len(problems))) if indices is None else list(indices)
        bad = [i for i in chosen if not 0 <= i < len(problems)]
        if bad:
            raise ValueError(f"split {self.split!r} has problems 0-{len(problems) - 1}, not {bad[:5]}")
        self.indices = chosen
        starts = [Start(self.stream, problem=problems[p]) for p in chosen for _ in self.joints]
        count = len(self.joints)
        run_episodes([self.env], starts, lambda steps: [dict(zip(self.agents, self.joints[steps[0].episode % count]))],
                     self.on_step, backend=self.listener)
        return self.trees

    def view(self, state: AgentState, agent: int, calls: list[Call]) -> AgentView:
        role = self.roles[agent]
        tool = None if role is None or role.tool is None else TOOLS[role.tool]
        run = None if tool is None else tool.request(state.text)
        ran = next((call for call in calls if is_tool_kind(call.kind)), None)
        critic = next((call.text for call in calls if call.kind == "critic"), None)
        return AgentView(state.text, state.answer, bool(state.correct), float(state.confidence),
                         state.confidence_source, bool(state.tool_ran), bool(state.tool_agrees),
                         None if run is None else run[-1].content, None if ran is None else ran.text, critic,
                         calls=calls)

    def on_step(self, step: Step) -> None:
        position, j = divmod(step.episode, len(self.joints))
        core = step.env.deliberation
        calls = self.listener.take(len(self.agents))
        if step.actions is None:
            if j == 0:
                self.trees.append(self.first_round(step, self.indices[position], calls))
            return
        tree, joint = self.trees[-1], self.joints[j]
        played = tuple("-" if a is None else a.name for a in step.env.last_actions)
        info = next(iter(step.infos.values()))
        tree.cells.append(Cell(joint, played, tuple(a.answer for a in core.agents), core.consensus(),
                               bool(info["consensus_correct"]),
                               tree.tokens0 + sum(int(i["tokens"]) for i in step.infos.values())))
        for i, (action, name) in enumerate(zip(joint, played)):
            if action not in tree.moves[i] and not masked(action, name):
                after = self.view(core.agents[i], i, calls[i])
                if name == "CONCEDE":
                    after.target = tree.concede_target(i, action)
                tree.moves[i][action] = after

    def first_round(self, step: Step, index: int, calls: list[list[Call]]) -> ProblemTree:
        """A problem's tree after its round 0 (the reset of its first joint action)."""
        core, infos, agents = step.env.deliberation, step.infos, self.agents
        problem = core.problem
        round0 = [self.view(state, i, calls[i]) for i, state in enumerate(core.agents)]
        consensus = core.consensus()
        meta = problem.metadata or {}
        tree = ProblemTree(
            split=self.split, index=index, id=problem.id, question=problem.question, gold=problem.answer,
            level=meta.get("level", meta.get("subject")), agents=agents,
            roles=[None if role is None else role.name for role in self.roles], round0=round0, vote=consensus,
            vote_correct=bool(core.grade(consensus)), concede_targets=[infos[a]["concede_target"] for a in agents],
            oracle_actions=[int(infos[a]["oracle_action"]) for a in agents], num_actions=core.num_actions,
            peers=[[agents[j] for j in core.peer_indices(i)] for i in range(len(agents))], moves=[{} for _ in agents],
            tokens0=sum(int(infos[a]["tokens"]) for a in agents))
        for name in PROTOCOLS:
            actions = make_protocol(name).act(step.observations, infos)
            tree.protocols[name] = tuple(int(actions[a]) for a in agents)
        return tree


def masked(action: int, played: str) -> bool:
    """Whether action index ``action`` was masked, so that the env played ``played`` (PERSIST) instead."""
    return played != ("CONCEDE" if action >= FIRST_PEER_ACTION else action_name(action))
