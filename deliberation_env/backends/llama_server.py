"""Moved to ``deliberation_env.testing.llama_server`` (test tooling); this re-export stays for one release."""

from deliberation_env.testing.llama_server import free_port, llama_server

__all__ = ["free_port", "llama_server"]
