"""Name -> factory registries for tasks and LLM backends.

A registry entry is either a callable factory or a lazy ``"module:attribute"`` path, so a
name can be reserved before (or without) importing heavy code. ``make(name, **kwargs)``
turns a name into an object and explains unknown or unavailable names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class RegistryError(KeyError):
    """An unknown or unavailable registry name (a KeyError so ``except KeyError`` works)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class Registry:
    """Maps names to factories, with helpful errors."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Callable[..., Any] | str] = {}

    def register(self, name: str, factory: Callable[..., Any] | str, *, overwrite: bool = False) -> None:
        """Register ``factory`` (a callable or a ``"module:attr"`` path) under ``name``."""
        if name in self._entries and not overwrite:
            raise ValueError(f"{self.kind} {name!r} is already registered; pass overwrite=True to replace it")
        self._entries[name] = factory

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def factory(self, name: str) -> Callable[..., Any]:
        if name not in self._entries:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; registered {self.kind}s: {', '.join(self.names())}. "
                f"Register your own with deliberation_env.{self.kind.upper()}S.register(name, factory)."
            )
        entry = self._entries[name]
        if callable(entry):
            return entry
        module_name, _, attribute = entry.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            raise RegistryError(
                f"{self.kind} {name!r} is registered but cannot be loaded: {error}. "
                f"If a module is missing, install the matching extra (see the README)."
            ) from error
        return getattr(module, attribute)

    def make(self, name: str, **kwargs: Any) -> Any:
        return self.factory(name)(**kwargs)


TASKS = Registry("task")
BACKENDS = Registry("backend")

TASKS.register("arithmetic", "deliberation_env.tasks.arithmetic:ArithmeticTask")
TASKS.register("jigsaw", "deliberation_env.tasks.jigsaw:JigsawTask")
TASKS.register("gsm8k", "deliberation_env.tasks.gsm8k:GSM8KTask")
TASKS.register("math", "deliberation_env.tasks.math500:MathTask")
TASKS.register("aime24", "deliberation_env.tasks.competition:AIME24Task")
TASKS.register("amc23", "deliberation_env.tasks.competition:AMC23Task")
TASKS.register("mmlu", "deliberation_env.tasks.mmlu:MMLUTask")
TASKS.register("humaneval", "deliberation_env.tasks.humaneval:HumanEvalTask")

BACKENDS.register("sim", "deliberation_env.backends.sim:SimBackend")
BACKENDS.register("transformers", "deliberation_env.backends.transformers:TransformersBackend")
BACKENDS.register("openai", "deliberation_env.backends.openai:OpenAICompatibleBackend")
BACKENDS.register("replay", "deliberation_env.replay.backend:ReplayBackend")
