"""Moved to ``deliberation_env.analysis.metrics``; this alias of that module stays for one release."""

import sys

from deliberation_env.analysis import metrics

sys.modules[__name__] = metrics
