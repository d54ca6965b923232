"""Moved to :mod:`baselines.meta.train`; this path (``python -m baselines.train``) keeps working for one release."""

import sys

from baselines.meta import train as _moved

if __name__ == "__main__":
    _moved.main()
else:
    sys.modules[__name__] = _moved
