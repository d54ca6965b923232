"""deliberation_env: multi-agent LLM deliberation as a PettingZoo environment.

    import deliberation_env
    env = deliberation_env.parallel_env(task="arithmetic", backend="sim", num_agents=3, max_rounds=3)
"""

from __future__ import annotations

from typing import Any

from pettingzoo.utils import parallel_to_aec
from pettingzoo.utils import wrappers as pz_wrappers  # not `wrappers`: our submodule of that name would shadow it

from deliberation_env.core.deliberation import Action
from deliberation_env.env import DeliberationEnv
from deliberation_env.make import parallel_env, replay_env
from deliberation_env.registry import BACKENDS, TASKS
from deliberation_env.text import TextDeliberationEnv, text_env

__version__ = "0.1.0"

raw_env = DeliberationEnv


def env(**kwargs: Any):
    """The same environment, PettingZoo AEC API (``parallel_to_aec`` plus the standard wrappers).

    Observations default to ``observation="masked"``: ``{"observation": vector, "action_mask": mask}``,
    the AEC convention of PettingZoo's classic envs that AEC consumers (e.g. Tianshou) index.
    """
    kwargs.setdefault("observation", "masked")
    aec = parallel_to_aec(parallel_env(**kwargs))
    return pz_wrappers.OrderEnforcingWrapper(pz_wrappers.AssertOutOfBoundsWrapper(aec))


def _register_with_pettingzoo() -> None:
    """Make ``pettingzoo.make("parallel", ENV_ID, ...)`` work where PettingZoo has a registry (>= 1.27)."""
    import pettingzoo

    register = getattr(pettingzoo, "register", None)
    if register is None:
        return
    registries = (("parallel", "parallel_registry"), ("aec", "aec_registry"))
    for env_type, attribute in registries:
        if ENV_ID not in getattr(pettingzoo, attribute, {}):
            register(env_type, ENV_ID, entry_point=f"deliberation_env:{'parallel_env' if env_type == 'parallel' else 'env'}")


ENV_ID = "deliberation_env/Deliberation-v0"
_register_with_pettingzoo()

__all__ = ["ENV_ID", "Action", "BACKENDS", "DeliberationEnv", "TASKS", "TextDeliberationEnv", "env", "parallel_env",
           "raw_env", "replay_env", "text_env", "__version__"]
