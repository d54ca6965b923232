"""Say which CPU features the installed llama.cpp (llama-cpp-python) was built with.

    python scripts/llama_build_info.py                   # one line: version and compiled-in features
    python scripts/llama_build_info.py --check-portable  # exit 1 unless it is installed and portable

"Portable" means no AVX512 or AMX kernels compiled in: such a build runs only on CPUs that have them
(and a native build crashed on its first completion on one machine that did). scripts/setup-tests.sh
builds with GGML_NATIVE=OFF, which gives AVX2/FMA/F16C kernels that run on any x86-64 CPU with AVX2.
"""

from __future__ import annotations

import re
import sys

NOT_PORTABLE = ("AVX512", "AMX")


def compiled_features() -> tuple[str, list[str]]:
    """(llama-cpp-python version, the CPU features its build enabled)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    text = info.decode() if isinstance(info, bytes) else str(info)
    return llama_cpp.__version__, [name for name, on in re.findall(r"(\w+) = (\d)", text) if on == "1"]


def main(argv: list[str]) -> int:
    try:
        version, features = compiled_features()
    except ImportError:
        print("llama-cpp-python is not installed", file=sys.stderr)
        return 1
    native = [name for name in features if name.startswith(NOT_PORTABLE)]
    print(f"llama-cpp-python {version}: built with {', '.join(features) or 'no listed CPU features'}"
          + (f"; NOT portable ({', '.join(native)})" if native else "; portable (no AVX512/AMX kernels)"))
    return 1 if "--check-portable" in argv and native else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
