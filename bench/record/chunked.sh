#!/usr/bin/env bash
# Records a replay set in chunks, alternating test and train ranges, and commits each finished chunk. Resumable:
# rerun it and it goes on where it stopped (finished chunks are skipped in seconds, before the model loads).
# Usage (from a set's script): bash bench/record/chunked.sh NAME [python -m deliberation_env.record flags...]
#   STEP (default 16): problems per chunk; TEST_END (400) and TRAIN_END (608): record [0, END) of each split.
# Run it from a checkout of its own (a git worktree): it commits there, and edits elsewhere cannot change the code
# under a recording.
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=$1; shift
FLAGS=("$@")
OUT=deliberation_env/replay/sets/$NAME
STEP=${STEP:-16}; TEST_END=${TEST_END:-400}; TRAIN_END=${TRAIN_END:-608}
record() {  # split start end
    python -m deliberation_env.record --out "$OUT" --name "$NAME" --split "$1" --problems "$2:$3" --chunk "$STEP" \
        "${FLAGS[@]}"
    if [ -n "$(git status --porcelain -- "$OUT")" ]; then
        for _ in 1 2 3 4 5; do  # another git process may hold the index for a moment
            git add -- "$OUT" && git commit -q -m "$NAME: recorded $1 problems $2-$(($3 - 1)) (bench/record)" -- "$OUT" \
                && break
            sleep 5
        done
    fi
}
test_at=0; train_at=0
while [ "$test_at" -lt "$TEST_END" ] || [ "$train_at" -lt "$TRAIN_END" ]; do
    if [ "$test_at" -lt "$TEST_END" ]; then
        end=$((test_at + STEP < TEST_END ? test_at + STEP : TEST_END)); record test "$test_at" "$end"; test_at=$end
    fi
    if [ "$train_at" -lt "$TRAIN_END" ]; then
        end=$((train_at + STEP < TRAIN_END ? train_at + STEP : TRAIN_END)); record train "$train_at" "$end"
        train_at=$end
    fi
done
