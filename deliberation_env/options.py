"""The flat env keywords, mapped in one place onto the parts a ``DeliberationEnv`` is made of.

``DeliberationEnv(task, backend, config, split, render_mode, format=..., agent_names=..., invalid_action=...)``
takes a handful of parts; ``parallel_env(...)`` and ``DeliberationEnv(...)`` also take the flat keyword set, which
``env_parts`` turns into those parts:

| keywords                                                   | become                                                |
|------------------------------------------------------------|-------------------------------------------------------|
| ``task``, ``task_kwargs``, ``data_dir``                    | the ``Task`` (``TASKS.make`` for a name)              |
| ``backend``, ``backend_kwargs``, ``cache``                 | one backend per agent (``BACKENDS.make`` for a name;  |
|                                                            | ``cache`` wraps each distinct backend in a cache)     |
| ``num_agents``, ``max_rounds`` (``max_cycles``), and every | the ``DeliberationConfig`` (overriding ``config=``'s  |
| ``DeliberationConfig`` field                               | fields where both are given)                          |
| ``observation``, ``action_mask``, ``action_mask_key``,     | the ``ObservationFormat`` (``formats``)               |
| ``observation_key``, ``infos``                             |                                                       |
| ``trace``, ``trace_label``                                 | ``parallel_env`` only: an ``analysis.traces.TraceWrapper`` |
|                                                            | around the env                                        |

A keyword that is not given never overrides anything: the config's fields come from ``config=`` (else
``DeliberationConfig``'s own defaults). On a replay backend (``backend="replay"`` with ``backend_kwargs={"dataset":
...}``, or a ``ReplayBackend``), what is not given is the set's recorded game (``replay.dataset.env_settings``: task,
its kwargs, and without ``config=`` agents, rounds, confidence, tokens, sampling), not another one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from deliberation_env.backends.base import Backend
from deliberation_env.core.deliberation import DeliberationConfig
from deliberation_env.formats import ObservationFormat
from deliberation_env.registry import BACKENDS, TASKS
from deliberation_env.replay.backend import recorded_settings
from deliberation_env.tasks.base import Task

DEFAULT_TASK = "arithmetic"
"""The task of an env that names none (and plays no replay set)."""
INVALID_ACTION_MODES = ("raise", "persist")
"""What an env does with a masked action: raise, or play it as PERSIST (the default)."""
FORMAT_KEYWORDS = ("observation", "action_mask", "action_mask_key", "observation_key", "infos")
"""The keywords of the ``ObservationFormat``: how an agent's observation and infos are laid out."""
CONFIG_KEYWORDS = tuple(f.name for f in fields(DeliberationConfig))
FLAT_KEYWORDS = ("num_agents", "max_rounds", "max_cycles", "data_dir", "task_kwargs", "backend_kwargs", "cache",
                 *FORMAT_KEYWORDS)
"""The flat keywords that are no parameter of ``DeliberationEnv`` (besides ``DeliberationConfig``'s fields)."""
WRAPPER_KEYWORDS = ("trace", "trace_label")
"""Keywords of ``parallel_env`` that wrap the env (``analysis.traces.TraceWrapper``)."""
PRESENTATION_KEYWORDS = (*FORMAT_KEYWORDS, "invalid_action", *WRAPPER_KEYWORDS, "render_mode")
"""Env keywords that change how a game is shown and played out, not the game: the observation's layout, what a masked
action does, traces, rendering (the compiled engine leaves them out of a tree and its cache key)."""
_TASK_METHODS = ("problems", "extract_answer", "grade", "solve_messages", "refine_messages", "critic_messages")


@dataclass(frozen=True)
class EnvParts:
    """What a ``DeliberationEnv`` is made of, every name resolved and every value checked."""

    task: Task
    backends: list[Backend]
    """One per agent (the same object where agents share a backend)."""
    config: DeliberationConfig
    format: ObservationFormat
    invalid_action: str


def env_parts(task: str | Task | None, backend: Any, config: DeliberationConfig | None,
              format: ObservationFormat | None, invalid_action: str | None, options: Mapping[str, Any]) -> EnvParts:
    """The parts of an env from its parameters and the flat keywords ``options`` (the module docstring's table)."""
    if "trace" in options or "trace_label" in options:
        raise TypeError("trace= wraps the env: pass it to deliberation_env.parallel_env(..., trace=...), or wrap the "
                        "env with deliberation_env.analysis.traces.TraceWrapper(env, trace, label)")
    options = dict(options)
    given_task_kwargs = options.get("task_kwargs") is not None
    task_kwargs = dict(options.pop("task_kwargs", None) or {})
    backend_kwargs = dict(options.pop("backend_kwargs", None) or {})
    data_dir, cache = options.pop("data_dir", None), options.pop("cache", None)
    format_keywords = {name: options.pop(name) for name in FORMAT_KEYWORDS if name in options}
    if format is not None and format_keywords:
        raise TypeError(f"pass either format= or the format keywords {sorted(format_keywords)}, not both")
    format = format or ObservationFormat(**format_keywords)
    if invalid_action is None:  # PettingZoo's own tests and learners that ignore the mask sample masked actions
        invalid_action = "persist"
    if invalid_action not in INVALID_ACTION_MODES:
        raise ValueError(f"invalid_action must be one of {INVALID_ACTION_MODES}, got {invalid_action!r}")
    backends = make_backends(backend, backend_kwargs, cache)
    recorded = recorded_settings(backends)
    task = task if task is not None else recorded.get("task", DEFAULT_TASK)
    if isinstance(task, str) and task == recorded.get("task") and not given_task_kwargs:
        task_kwargs = dict(recorded["task_kwargs"])
    # a given config is the game asked for: the set's check refuses what it cannot serve
    config_fields = {name: value for name, value in recorded.items() if name in CONFIG_KEYWORDS and config is None}
    config = make_config(config, {**config_fields, **rounds_of(options)})
    return EnvParts(task=make_task(task, data_dir, task_kwargs), backends=per_agent(backends, backend, config.num_agents),
                    config=config, format=format, invalid_action=invalid_action)


def rounds_of(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with PettingZoo's ``max_cycles`` (its max_cycles_test passes it) as ``max_rounds``."""
    options = dict(options)
    max_cycles = options.pop("max_cycles", None)
    if max_cycles is not None:
        if options.get("max_rounds", max_cycles) != max_cycles:
            raise ValueError(f"max_cycles={max_cycles!r} and max_rounds={options['max_rounds']!r} disagree; "
                             "pass only one")
        options["max_rounds"] = max_cycles
    return options


def make_config(config: DeliberationConfig | None, options: dict[str, Any]) -> DeliberationConfig:
    """``config`` (default ``DeliberationConfig()``, whose field defaults are the only defaults) with the given fields
    replaced."""
    if config is None:
        return DeliberationConfig(**options)
    if not isinstance(config, DeliberationConfig):
        raise TypeError(f"config must be a DeliberationConfig, got {type(config).__name__}")
    return replace(config, **options) if options else config


def make_task(task: str | Task, data_dir: str | None, kwargs: dict[str, Any]) -> Task:
    """A registered task by name, or the given Task object (checked for the methods an env calls)."""
    if isinstance(task, str):
        return TASKS.make(task, data_dir=data_dir, **kwargs)
    for method in _TASK_METHODS:
        if not callable(getattr(task, method, None)):
            raise TypeError(f"task must be a registered name or a Task object; {task!r} has no {method}()")
    return task


def make_backends(backend: Any, kwargs: dict[str, Any], cache: str | None) -> list[Backend]:
    """The env's backends: a registered name or a Backend (one entry, shared by all agents), or a list of one per
    agent; with ``cache`` (a file), each distinct backend answers through a ``CachedBackend`` on it."""
    if isinstance(backend, str):
        backends = [BACKENDS.make(backend, **kwargs)]
    elif isinstance(backend, Sequence):
        backends = list(backend)
    else:
        backends = [backend]
    for item in backends:
        if not callable(getattr(item, "generate", None)):
            raise TypeError(f"backend must be a registered name ({', '.join(BACKENDS.names())}), a Backend or a list "
                            f"of Backends; got {item!r}")
    if cache is not None:
        from deliberation_env.backends.cache import CachedBackend

        wrapped: dict[int, Backend] = {}
        backends = [wrapped.setdefault(id(b), CachedBackend(b, cache)) for b in backends]
    return backends


def per_agent(backends: list[Backend], given: Any, count: int) -> list[Backend]:
    """One backend per agent: the shared one (``given`` a name or a Backend) repeated, or the given list (which must
    have one per agent)."""
    if isinstance(given, str) or not isinstance(given, Sequence):
        return backends * count
    if len(backends) != count:
        raise ValueError(f"backend list has {len(backends)} entries but num_agents is {count}: give one per agent")
    return backends
