"""Moved: the request grouper is ``deliberation_env.grouping``, beside the episode runner (above the core and the
backends). Importing this module is an error that says so."""

raise ImportError("deliberation_env.backends.grouping moved to deliberation_env.grouping: import generate_by_backend, "
                  "generate_grouped and answer_pending from there")
