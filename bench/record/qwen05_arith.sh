#!/usr/bin/env bash
# Records the shipped replay set qwen05-arith-v2 (request format 2: a seed of its own per problem; CONCEDE to every
# peer, so it serves every concede-target rule) in chunks, alternating test and train ranges, and commits each
# finished chunk. Resumable: rerun it and it goes on where it stopped (finished chunks are skipped).
# (The first qwen05-arith was recorded with this script under request format 1; its card lists the flaws.)
# A set begun by an older version (JSON-lines chunks) is converted once, before resuming, with
#   python -m deliberation_env.replay.migrate deliberation_env/replay/sets/qwen05-arith-v2 --weights "$MODEL" \
#       --weights-source https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF --weights-license Apache-2.0
# Needs the Qwen2.5-Coder-0.5B-Instruct GGUF (MODEL, default ~/.cache/deliberation-models/...).
# Usage: bash bench/record/qwen05_arith.sh [STEP] [TEST_END] [TRAIN_END]   (defaults 16 400 608)
# The arithmetic test split has 500 problems: test 400-499 stay outside the recording for
# bench/replay_transfer.py (the replay-trained policy played live).
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-$HOME/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
NAME=qwen05-arith-v2
OUT=deliberation_env/replay/sets/$NAME
STEP=${1:-16}; TEST_END=${2:-400}; TRAIN_END=${3:-608}
record() {  # split start end
    python -m deliberation_env.record --out "$OUT" --name "$NAME" --task arithmetic --task-option 'levels=[0,1]' \
        --split "$1" --problems "$2:$3" --agents 3 --rounds 1 --streams 1 --max-tokens 256 --confidence critic_text \
        --chunk "$STEP" --wave 16 --concede-targets all --backend transformers --model "$MODEL" --dtype bfloat16 --batch-size 16 \
        --weights-source https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF --weights-license Apache-2.0 \
        --backend-option converted_cache_dir="$HOME/.cache/deliberation-models/converted" ${THREADS:+--backend-option num_threads="$THREADS"}
    if [ -n "$(git status --porcelain -- "$OUT")" ]; then
        for _ in 1 2 3 4 5; do  # another git process may hold the index for a moment
            git add -- "$OUT" && git commit -q -m "$NAME: recorded $1 problems $2-$(($3 - 1)) (bench/record/qwen05_arith.sh)" -- "$OUT" && break
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
        end=$((train_at + STEP < TRAIN_END ? train_at + STEP : TRAIN_END)); record train "$train_at" "$end"; train_at=$end
    fi
done
