"""Moved to ``deliberation_env.protocols``; this alias of that module stays for one release."""

import sys

from deliberation_env import protocols

sys.modules[__name__] = protocols
