"""Moved to :mod:`baselines.evaluation.evaluate`; this path (``python -m baselines.evaluate``) keeps working for one
release."""

import sys

from baselines.evaluation import evaluate as _moved

if __name__ == "__main__":
    _moved.main()
else:
    sys.modules[__name__] = _moved
