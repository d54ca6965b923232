"""Moved to ``deliberation_env.analysis.calibrate``; this alias of that module stays for one release."""

import sys

from deliberation_env.analysis import calibrate

if __name__ == "__main__":  # python -m deliberation_env.calibrate ...
    sys.exit(calibrate.main())
sys.modules[__name__] = calibrate
