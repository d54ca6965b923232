"""Statistics helpers of the evaluation code (kept for imports; they live in ``deliberation_env.metrics``)."""

from deliberation_env.metrics import paired_bootstrap, wilson_interval

__all__ = ["paired_bootstrap", "wilson_interval"]
