"""Moved to ``deliberation_env.analysis.fidelity``; this alias of that module stays for one release."""

import sys

from deliberation_env.analysis import fidelity

sys.modules[__name__] = fidelity
