"""Moved to :mod:`baselines.llm.train_llm`; this path (``python -m baselines.train_llm``) keeps working for one
release."""

import sys

from baselines.llm import train_llm as _moved

if __name__ == "__main__":
    _moved.main()
else:
    sys.modules[__name__] = _moved
