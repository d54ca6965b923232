"""Moved: the simulator's context is ``deliberation_env.core.sim_context``, a hook the core owns. Importing this module
is an error that says so."""

raise ImportError("deliberation_env.backends.sim_context moved to deliberation_env.core.sim_context: import SimContext, "
                  "register_source and sim_context from there")
