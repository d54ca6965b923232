"""Running untrusted model-written code in an isolated, resource-limited process (``runner``; the code that runs
inside the child is ``bootstrap.py``). Used by the HumanEval task; see docs/sandbox.md."""

from deliberation_env.sandbox.runner import *  # noqa: F403
from deliberation_env.sandbox.runner import __all__  # noqa: F401
