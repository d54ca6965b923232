"""Roles: what makes the agents of a team differ.

A team is homogeneous by default (``roles=None``): every agent solves with the task's prompts at the config's
temperature. ``roles=`` gives one ``Role`` per agent, in agent order: its name, prompt style, temperature and tool
(``Role``'s fields say what each means; docs/reference.md shows them as a table written from these declarations).
A role may also be written as a mapping of these fields, or as its name alone. The critic call is the same
for every role (one judge). Each agent's backend is the env's ``backend=[...]`` list, so a team of two models
is a list of two backends. An agent's role changes its requests, so a replay set records the roles (its card's
``settings``) and serves only the team it recorded.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from deliberation_env.core.tools import TOOLS
from deliberation_env.tasks.base import Task, styled

MAX_ROLES = 4
"""Distinct roles a team may hold (the width of the ``features="v3"`` role one-hot)."""


@dataclass(frozen=True)
class Role:
    """One agent's make-up (see the module docstring)."""

    name: str
    """The role's name: agents with the same name share a role (and so a ``features="v3"`` column); at most
    ``MAX_ROLES`` distinct roles."""
    prompt: str | None = None
    """A prompt style of the task for the agent's solve and refine requests (``task.prompt_styles``; arithmetic:
    ``default``, ``no_code``, ``program``; jigsaw: ``full``, ``view_0``, ``view_1``, ...: which person's count the agent
    sees); None: the task's own prompts."""
    temperature: float | None = None
    """The agent's solve and refine temperature, in [0, 5]; None: the env's ``temperature``."""
    tool: str | None = None
    """A registered tool's name (``core.tools``; the tools' table): ``python`` makes a program-aided agent,
    ``python_check`` an externally checked one; None: no tool."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a role's name must be a non-empty string, got {self.name!r}")
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt):
            raise ValueError(f"role {self.name!r}: prompt must be a prompt style's name or None, got {self.prompt!r}")
        value = self.temperature
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0.0 <= value <= 5.0):
            raise ValueError(f"role {self.name!r}: temperature must be a number in [0, 5] or None, got {value!r}")
        if self.tool is not None and self.tool not in TOOLS:
            raise ValueError(f"role {self.name!r}: tool must be one of {tuple(TOOLS)} or None, got {self.tool!r} "
                             "(core.tools.register_tool adds one)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def roles_literal(text: str) -> list[Any]:
    """``--roles``' value: a JSON (or Python) list literal of roles, one per agent (names or mappings)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, list):
        raise ValueError(f"not a list literal of roles: {text!r}")
    return value


roles_literal.__name__ = "roles"  # argparse names the type in its error: "invalid roles value"


def make_roles(spec: Any, num_agents: int) -> tuple[Role, ...] | None:
    """``roles=`` as a tuple of one ``Role`` per agent (None stays None: the homogeneous team)."""
    if spec is None:
        return None
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        raise ValueError(f"roles must be a list of {num_agents} roles (one per agent), got {spec!r}")
    if len(spec) != num_agents:
        raise ValueError(f"roles has {len(spec)} entries but num_agents is {num_agents}: give one role per agent")
    roles = tuple(_role(item) for item in spec)
    if len({role.name for role in roles}) > MAX_ROLES:
        raise ValueError(f"a team holds at most {MAX_ROLES} distinct roles, got {[role.name for role in roles]}")
    for role in roles:
        same = [other for other in roles if other.name == role.name]
        if any(other != role for other in same):
            raise ValueError(f"role name {role.name!r} is given with different settings: {same}; name each make-up "
                             "once")
    return roles


def _role(item: Any) -> Role:
    if isinstance(item, Role):
        return item
    if isinstance(item, str):
        return Role(item)
    if isinstance(item, Mapping):
        known = {f.name for f in fields(Role)}
        unknown = sorted(set(item) - known)
        if unknown:
            raise ValueError(f"unknown role field(s) {unknown} in {dict(item)!r}; a role has {sorted(known)}")
        if "name" not in item:
            raise ValueError(f"a role needs a name: {dict(item)!r}")
        return Role(**item)
    raise ValueError(f"a role is a Role, a mapping of its fields or its name, got {item!r}")


def role_indices(roles: Sequence[Role] | None, num_agents: int) -> list[int]:
    """Each agent's role as an index: the order in which the role's name first appears (0 for every agent of a
    homogeneous team)."""
    if roles is None:
        return [0] * num_agents
    order: dict[str, int] = {}
    return [order.setdefault(role.name, len(order)) for role in roles]


def roles_setting(roles: Sequence[Role] | None) -> list[dict[str, Any]] | None:
    """The roles as plain data (a replay card's ``settings["roles"]``)."""
    return None if roles is None else [role.to_dict() for role in roles]


def role_task(task: Task, role: Role | None) -> Task:
    """The task as an agent of ``role`` sees it: a view with the role's prompt style, or ``task`` itself (no role, or
    a role without a prompt style)."""
    return task if role is None or role.prompt is None else styled(task, role.prompt)
