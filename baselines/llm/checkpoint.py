"""Training state of ``baselines.llm.train_llm`` (``--save-every``, ``--resume``) and the best team of
``--eval-every``.

``<out>/state/`` holds everything an interrupted run needs to continue as if it had not stopped:

- ``weights.pt``: the trainable tensors (``TeamPolicy.trainable_state``: the adapters, or the full weights);
- ``optimizer.pt``: the AdamW and learning-rate schedule states;
- ``rng_<rank>.pt``: each process's python, numpy and torch (and CUDA) generator states and the rollout generator
  (which draws the problems of every update);
- ``trainer.json``: the next update, the metric rows logged so far, the before-training evaluation, the best
  accuracy seen by ``--eval-every``, the number of processes, and the run's settings.

The folder is written next to the old one and moved into place, so a run killed while saving keeps the previous
state. With several processes, ``--out`` must be a filesystem that every process sees (each writes its RNG file).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

STATE = "state"
BEST = "best"


@dataclass
class Progress:
    """What the loop carries from update to update besides the weights, optimizer and generators."""

    update: int = 0
    """The next update (the number done)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The metric rows logged so far."""
    evaluations: list[dict[str, Any]] = field(default_factory=list)
    """The evaluation rows before training (``--evaluate``)."""
    best: dict[str, Any] | None = None
    """The most accurate ``--eval-every`` evaluation so far (its row, with ``update``)."""


def state_folder(path: str) -> str:
    """``path`` or ``path/state``, whichever holds a training state; ValueError otherwise."""
    for folder in (path, os.path.join(path, STATE)):
        if os.path.isfile(os.path.join(folder, "trainer.json")):
            return folder
    raise ValueError(f"--resume {path}: no training state there (trainer.json in it or in {os.path.join(path, STATE)}); "
                     "give the state folder of a run trained with --save-every")


RESUME_FREE = ("resume", "out", "progress", "tensorboard", "max_minutes", "threads", "device", "agent_devices",
               "generate_batch", "generate_url", "sync_dir", "sync_server_dir", "converted_cache_dir", "evaluate",
               "eval_every", "eval_problems", "eval_seeds", "save_every", "save_merged")
"""Settings a resumed run may change: where it runs, what it logs, evaluates and saves (and ``updates`` under a
constant learning rate, which then only says where to stop). Every other setting shapes the training."""


RENAMED_SETTINGS = {"agents": "num_agents"}
"""Settings saved under an older name (trainer.json, study results) -> their name now."""


def current_names(settings: dict[str, Any]) -> dict[str, Any]:
    """Saved settings (``asdict(LLMTrainConfig)`` of any version) under today's names."""
    return {RENAMED_SETTINGS.get(key, key): value for key, value in settings.items()}


def settings_differences(saved: dict[str, Any], now: dict[str, Any], defaults: dict[str, Any]) -> list[str]:
    """``name (saved value, value now)`` for every training setting of ``now`` that differs from ``saved`` (both
    ``asdict(LLMTrainConfig)``; a setting the saved run predates counts as its value in ``defaults``)."""
    defaults, now = (json.loads(json.dumps(values, default=_plain)) for values in (defaults, now))  # as saved
    saved = current_names(saved)
    free = set(RESUME_FREE)
    if now.get("lr_schedule") == saved.get("lr_schedule") == "constant":
        free.add("updates")
    return [f"{key} ({saved.get(key, defaults.get(key))!r} saved, {value!r} now)" for key, value in now.items()
            if key not in free and saved.get(key, defaults.get(key)) != value]


def check_resume(path: str, settings: dict[str, Any], defaults: dict[str, Any]) -> str:
    """The state folder of ``path`` (``state_folder``); ValueError naming every training setting that differs from
    the saved run's (``settings_differences``)."""
    folder = state_folder(path)
    with open(os.path.join(folder, "trainer.json"), encoding="utf-8") as f:
        saved = json.load(f).get("settings") or {}
    differing = settings_differences(saved, settings, defaults)
    if differing:
        raise ValueError(f"--resume {path}: the run was saved with other settings: {'; '.join(differing)}; resume "
                         f"with the saved ones ({os.path.join(folder, 'trainer.json')}, 'settings'), or start a new "
                         "run without --resume")
    return folder


def rng_states(rollout_rng: np.random.Generator) -> dict[str, Any]:
    """This process's generator states."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
              "rollout": rollout_rng.bit_generator.state}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any], rollout_rng: np.random.Generator) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    rollout_rng.bit_generator.state = states["rollout"]
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_state(out: str, team: Any, optimizer: Any, scheduler: Any, rollout_rng: np.random.Generator,
               progress: Progress, parallel: Any, settings: dict[str, Any]) -> str:
    """Write ``<out>/state`` (module docstring); every process calls it. Returns the folder."""
    final = os.path.join(out, STATE)
    staging = final + ".partial"
    if parallel.is_main:
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        torch.save(team.trainable_state(), os.path.join(staging, "weights.pt"))
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                   os.path.join(staging, "optimizer.pt"))
        with open(os.path.join(staging, "trainer.json"), "w", encoding="utf-8") as f:
            json.dump({**asdict(progress), "world_size": parallel.world, "settings": settings}, f, default=_plain)
    parallel.barrier()
    torch.save(rng_states(rollout_rng), os.path.join(staging, f"rng_{parallel.rank}.pt"))
    parallel.barrier()
    if parallel.is_main:
        previous = final + ".old"
        if os.path.isdir(final):
            os.replace(final, previous)
        os.replace(staging, final)
        shutil.rmtree(previous, ignore_errors=True)
    parallel.barrier()
    return final


def load_state(path: str, team: Any, optimizer: Any, scheduler: Any, rollout_rng: np.random.Generator,
               parallel: Any, out: str) -> Progress:
    """Restore a ``save_state`` folder (or the run folder holding it) into the team, optimizer, schedule and
    generators; returns the progress to continue from. Every process calls it. A run resumed into another ``out``
    gets a copy of the old run's best team."""
    folder = state_folder(path)
    best = os.path.join(os.path.dirname(os.path.abspath(folder)), BEST)
    if parallel.is_main and os.path.isdir(best) and not os.path.exists(os.path.join(out, BEST)):
        shutil.copytree(best, os.path.join(out, BEST))
    with open(os.path.join(folder, "trainer.json"), encoding="utf-8") as f:
        saved = json.load(f)
    if saved["world_size"] != parallel.world:
        raise ValueError(f"--resume {path}: the state was saved by {saved['world_size']} process(es); resume with "
                         f"the same number (this run has {parallel.world}), so that every generator continues")
    team.load_trainable_state(torch.load(os.path.join(folder, "weights.pt"), map_location="cpu"))
    states = torch.load(os.path.join(folder, "optimizer.pt"), map_location="cpu")
    optimizer.load_state_dict(states["optimizer"])
    scheduler.load_state_dict(states["scheduler"])
    # our own file of generator states (numpy's is a tuple holding an array, which weights_only refuses)
    restore_rng(torch.load(os.path.join(folder, f"rng_{parallel.rank}.pt"), weights_only=False), rollout_rng)
    return Progress(saved["update"], saved["rows"], saved["evaluations"], saved["best"])


def save_best(out: str, team: Any, row: dict[str, Any], update: int, merged: bool) -> str:
    """Save the team under ``<out>/best`` (``TeamPolicy.save``) with ``eval.json``: the update and its evaluation."""
    folder = os.path.join(out, BEST)
    team.save(folder, merged=merged)
    with open(os.path.join(folder, "eval.json"), "w", encoding="utf-8") as f:
        json.dump({"update": update, **row}, f, indent=2, default=_plain)
    return folder


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else str(value)
