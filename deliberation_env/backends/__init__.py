"""LLM backends behind one protocol: ``generate(list[Request]) -> list[Completion]``."""

from deliberation_env.backends.base import Backend, Completion, Message, Request, SimContext
from deliberation_env.backends.sim import SimBackend, SimConfig

__all__ = ["Backend", "Completion", "Message", "Request", "SimBackend", "SimConfig", "SimContext"]
