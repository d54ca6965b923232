"""The fast, exact engine: a replay set's game compiled into arrays (``tree``), thousands of episodes stepped per
call (``batch``), and a policy's expected score computed exactly from the tree (``exact``). docs/engine.md."""

from deliberation_env.engine.batch import TreeEnv
from deliberation_env.engine.exact import expected_scores, greedy_probabilities
from deliberation_env.engine.tree import CompiledTree, StaleTree, cache_dir, compile_tree

__all__ = ["CompiledTree", "StaleTree", "TreeEnv", "cache_dir", "compile_tree", "expected_scores",
           "greedy_probabilities"]
