"""What a replay set's card says about how it was made: sampling parameters, weights, library versions."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from deliberation_env.core.deliberation import Deliberation, DeliberationConfig
from deliberation_env.registry import BACKENDS
from deliberation_env.replay.format import sha256_file
from deliberation_env.tasks.base import Problem, Task

LIBRARIES = ("deliberation-env", "torch", "transformers", "llama-cpp-python", "vllm", "openai", "pyarrow", "numpy")
"""Distributions whose versions a card records, where installed."""


def library_versions(names: Sequence[str] = LIBRARIES) -> dict[str, str]:
    """Python's and the installed distributions' versions of ``names`` (default ``LIBRARIES``; read from package
    metadata, nothing imported)."""
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def sampling_of(task: Task, config: DeliberationConfig, problem: Problem) -> dict[str, Any]:
    """Every sampling parameter of the recording's requests, read off the requests the core makes."""
    core = Deliberation(task, config)
    core.start(problem, 0)
    solve = core.pending_requests()[0]
    return {"temperature": solve.temperature, "critic_temperature": config.critic_temperature,
            "top_p": solve.top_p, "max_tokens": solve.max_tokens, "critic_max_tokens": config.critic_max_tokens,
            "seed": f"one per request, from the problem, stream, round, agent and kind (deliberation_env.core.seeds, "
                    f"request format {config.request_format})",
            "logprobs": "every kept token's log-probability for solutions and refinements; the first token's top "
                        "log-probabilities for critic calls (how many: the model identity's top_logprobs)"}


def weights_of(backend: str, model: str | None, source: str | None = None, license: str | None = None, *,
               file: str | None = None) -> dict[str, Any]:
    """The model file's sha256, size and origin when the recorder can see it; else ``sha256`` None and why (where the
    weights are is the backend's declaration, ``registry.BackendSpec.weights``). ``file``: for a served model, the
    file the server loaded (the recorder cannot see which one it did)."""
    weights = BACKENDS.spec(backend).weights
    if weights == "none":
        return {"sha256": None, "reason": f"the {backend} backend has no weights"}
    if file is not None:
        return {**_file_weights(Path(file).expanduser(), source, license), "served_as": model}
    if weights == "served":
        return {"sha256": None, "source": source, "license": license,
                "reason": f"served by an OpenAI-compatible server as {model!r}: its weights are not visible here"}
    path = Path(model).expanduser() if model else None
    if path is None or not path.is_file():
        return {"sha256": None, "source": source or model, "license": license,
                "reason": "a hub id or folder, not one file: the hub revision pins the weights"}
    return _file_weights(path, source, license)


def _file_weights(path: Path, source: str | None, license: str | None) -> dict[str, Any]:
    return {"file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size, "source": source,
            "license": license}
