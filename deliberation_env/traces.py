"""Moved to ``deliberation_env.analysis.traces``; this alias of that module stays for one release."""

import sys

from deliberation_env.analysis import traces

sys.modules[__name__] = traces
