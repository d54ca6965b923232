"""Helpers for tests and benches: a loopback OpenAI-compatible server (``servers.LoopbackServer``)."""
