"""Moved to ``deliberation_env.sandbox``; this re-export stays for one release."""

from deliberation_env.sandbox.runner import *  # noqa: F403
from deliberation_env.sandbox.runner import __all__  # noqa: F401
