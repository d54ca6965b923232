"""The env factories: ``parallel_env`` (a named task and backend) and ``replay_env`` (a replay set's own settings).

They sit above the env, replay and analysis modules, which never import them: the env binds a replay backend
(``replay.backend.bind_replay``) without replay knowing the env, ``trace=`` wraps the env in
``analysis.traces.TraceWrapper`` here, outside it, and analysis takes an env factory as an argument (the program
``analysis.calibrate`` hands it ``parallel_env``). Both are re-exported as ``deliberation_env.parallel_env`` and
``deliberation_env.replay_env``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from deliberation_env.env import DeliberationEnv
from deliberation_env.replay.backend import ReplayBackend
from deliberation_env.replay.dataset import (
    ReplayError,
    ReplaySet,
    departures,
    split_mismatch,
    split_problem_ids,
    task_mismatch,
)


def parallel_env(task: Any = None, backend: Any = "sim", num_agents: int | None = None, max_rounds: int | None = None,
                 data_dir: str | None = None, split: str = "train", render_mode: str | None = None,
                 **options: Any) -> Any:
    """The deliberation environment, PettingZoo Parallel API (see ``deliberation_env.env``): a ``DeliberationEnv``,
    in a ``TraceWrapper`` when ``trace=`` is given. ``options``: every keyword of ``env.accepted_options()``.

    What is not given comes from ``config=`` when given, else from a replay backend's recording, else from
    ``DeliberationConfig``'s defaults (the task: ``options.DEFAULT_TASK``). ``split`` defaults to ``"train"``:
    evaluate with ``split="test"``."""
    trace, label = options.pop("trace", None), options.pop("trace_label", None)
    given: dict[str, Any] = {name: value for name, value in (("num_agents", num_agents), ("max_rounds", max_rounds))
                             if value is not None}
    env = DeliberationEnv(task, backend, split=split, render_mode=render_mode, data_dir=data_dir, **given, **options)
    if trace is None:
        return env
    from deliberation_env.analysis.traces import TraceWrapper  # only traced runs pay for the import

    return TraceWrapper(env, trace, label, task_kwargs=options.get("task_kwargs"))


def replay_env(dataset: str | os.PathLike[str] | ReplaySet, split: str = "train", *, fallback: Any = None,
               fallback_model: str | None = None, data_dir: str | None = None, digest: str | None = None,
               **options: Any) -> Any:
    """A ``parallel_env`` on a replay set with the set's own recorded settings (task, prompts, agents, rounds,
    confidence, tokens, streams); ``options`` override env keywords (e.g. ``observation="flat"``, ``max_rounds``
    below the recorded rounds, another recorded ``confidence``, ``trace=``). ``split``: the set's split (default
    ``"train"``; evaluate on ``split="test"``). ``fallback`` answers what the set lacks; it must be the recorded model
    unless ``fallback_model`` names the one you accept instead. ``digest``: the set digest the set must have
    (``replay.card``; or name it ``"<set>#<digest>"``). A game that departs from the recording (``departures``: fewer
    rounds, another recorded confidence source) warns, naming the set and each departure; rounds past the recording
    with ``refine_rounds`` (the benchmark's sequential games) do not."""
    replay = dataset if isinstance(dataset, ReplaySet) else ReplaySet(dataset, digest)
    if digest is not None and replay.digest != digest:
        raise ReplayError(f"replay set {replay.card.name!r} ({replay.path}) has digest {replay.digest}, not the "
                          f"pinned {digest}: it is another set than the one pinned")
    card, where = replay.card, f"replay set {replay.card.name!r} ({replay.path})"
    if options.get("task", card.task) != card.task:
        raise ReplayError(task_mismatch(card, where, options["task"]))
    if dict(options.get("task_kwargs", card.task_kwargs)) != card.task_kwargs:
        raise ReplayError(f"{where} was recorded with task_kwargs {card.task_kwargs}, not {options['task_kwargs']}: "
                          "drop task_kwargs= (replay_env() builds the recorded task), or record a set with them")
    if split_problem_ids(card, split) is None:  # before the env asks the task for a split it may not have
        raise ReplayError(split_mismatch(card, where, split))
    backend = ReplayBackend(replay, fallback=fallback, fallback_model=fallback_model)
    # the env takes every setting not given here from the set's recording (options.env_parts)
    env = parallel_env(backend=backend, split=split, data_dir=data_dir, **options)
    config = getattr(env, "config", None) or env.unwrapped.config
    departed = departures(card, config, extensions=False)
    if departed:
        warnings.warn(f"{replay.identity} played with departures from its recording: {', '.join(departed)}; its "
                      "results are not the recorded game's (not a benchmark cell's)", DepartureWarning, stacklevel=2)
    return env


class DepartureWarning(UserWarning):
    """A replay env whose game departs from its set's recording (``replay.departures``)."""
