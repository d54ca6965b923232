"""LLM backends behind one protocol: ``generate(list[Request]) -> list[Completion]``.

Heavy backends (torch, httpx) are imported only on first use of their names.
"""

from __future__ import annotations

import importlib
from typing import Any

from deliberation_env.backends.base import Backend
from deliberation_env.backends.sim import SimBackend, SimConfig
from deliberation_env.chat import Message
from deliberation_env.core.sim_context import SimContext
from deliberation_env.requests import Completion, Request

_LAZY = {
    "TransformersBackend": "deliberation_env.backends.transformers",
    "OpenAICompatibleBackend": "deliberation_env.backends.openai",
    "CachedBackend": "deliberation_env.backends.cache",
    "smollm2_gguf_path": "deliberation_env.backends.models",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Backend", "Completion", "Message", "Request", "SimBackend", "SimConfig", "SimContext", *_LAZY]
