#!/usr/bin/env bash
# Records several replay sets in turn, so that they grow together: each set's script records up to END problems of
# each split, then the next set's, then END grows by STEP. A set's script resumes where it stopped (finished chunks
# are skipped in seconds), so rerun this after an interruption. Run it from a checkout of its own (a git worktree),
# as chunked.sh says:
#   bash bench/record/alternate.sh bench/record/qwen05_arith.sh bench/record/qwen05_team_arith.sh
# STEP (16), TEST_END (400) and TRAIN_END (608) as in chunked.sh; FROM (STEP): the first END, to skip what every
# set already holds.
set -euo pipefail
STEP=${STEP:-16}; TEST_END=${TEST_END:-400}; TRAIN_END=${TRAIN_END:-608}
last=$(( TEST_END > TRAIN_END ? TEST_END : TRAIN_END ))
for ((end = ${FROM:-$STEP}; ; end += STEP)); do
    end=$(( end < last ? end : last ))
    for script in "$@"; do
        echo "$(date '+%F %T') $script: up to problem $end of each split"
        TEST_END=$(( end < TEST_END ? end : TEST_END )) TRAIN_END=$(( end < TRAIN_END ? end : TRAIN_END )) \
            STEP=$STEP bash "$script"
    done
    [ "$end" -lt "$last" ] || break
done
