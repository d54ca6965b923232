#!/usr/bin/env bash
# Writes constraints-tests.txt from the active environment (after a green `python -m pytest -q` there).
set -euo pipefail
cd "$(dirname "$0")/.."
{
    head -3 constraints-tests.txt
    python -m pip freeze | grep -v -E "^-e|^deliberation" | sed -E 's/^torch==([0-9.]+)\+cpu$/torch==\1/'
} > constraints-tests.txt.new
mv constraints-tests.txt.new constraints-tests.txt
echo "lock-tests.sh: $(grep -c '==' constraints-tests.txt) pins written to constraints-tests.txt"
