"""Helpers for tests and benches: a loopback OpenAI-compatible server (``servers.LoopbackServer``) and a local
llama.cpp server that is checked with one completion before use (``llama_server``)."""
