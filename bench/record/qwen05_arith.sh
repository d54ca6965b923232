#!/usr/bin/env bash
# Records the shipped replay set qwen05-arith-v2 (request format 2: a seed of its own per problem; CONCEDE to every
# peer, so it serves every concede-target rule and concede_to_peer) in resumable, committed chunks
# (bench/record/chunked.sh: STEP, TEST_END, TRAIN_END). The model is served by llama.cpp's llama-server
# (bench/record/llama_server.sh: LLAMA_SERVER, SLOTS, THREADS). The first qwen05-arith was recorded with
# TransformersBackend under request format 1; its card lists the flaws.
# Needs the Qwen2.5-Coder-0.5B-Instruct GGUF (MODEL, default ~/.cache/deliberation-models/...). The arithmetic test
# split has 500 problems: test 400-499 stay outside the recording for bench/studies/replay_transfer.py (the replay-trained
# policy played live).
set -euo pipefail
MODEL=${MODEL:-$HOME/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
source "$(dirname "$0")/llama_server.sh"
serve_gguf "$MODEL"
bash "$(dirname "$0")/chunked.sh" qwen05-arith-v2 --task arithmetic --task-option 'levels=[0,1]' \
    --num-agents 3 --max-rounds 1 --streams 1 --max-tokens 256 --confidence critic_text --wave 16 --concede-targets all \
    "${RECORD_FLAGS[@]}" \
    --weights-source https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF --weights-license Apache-2.0
