#!/usr/bin/env bash
# Records the team set qwen05-team-arith: the qwen05-arith-v2 settings (request format 2, every concede target,
# arithmetic levels 0-1, 1 round) with a heterogeneous team: one agent with the default prompt, one with the
# no_code prompt and a program-aided agent (a prompt that asks for a program; its program runs in the sandbox and
# the answer it prints is its answer: core/tools.py). The first two have the checking tool: a program in their
# text runs too, only to say whether it prints the text's answer (an external verifier, feature tool_agrees). The team was picked by bench/studies/team_band.py on 120 train
# problems outside the recording (docs/replay.md, "Picking a team"; bench/results/team_band_120.md).
# Resumable, committed chunks (bench/record/chunked.sh: STEP, TEST_END, TRAIN_END); the model is served by
# llama.cpp's llama-server (bench/record/llama_server.sh), on port 8090 so that it can run beside qwen05_arith.sh.
set -euo pipefail
MODEL=${MODEL:-$HOME/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
export LLAMA_PORT=${LLAMA_PORT:-8090}
source "$(dirname "$0")/llama_server.sh"
serve_gguf "$MODEL"
bash "$(dirname "$0")/chunked.sh" qwen05-team-arith --task arithmetic --task-option 'levels=[0,1]' \
    --num-agents 3 --max-rounds 1 --streams 1 --max-tokens 256 --confidence critic_text --wave 16 --concede-targets all \
    --env-option 'roles=[{"name": "default", "tool": "python_check"}, {"name": "no_code", "prompt": "no_code", "tool": "python_check"}, {"name": "program", "prompt": "program", "tool": "python"}]' \
    "${RECORD_FLAGS[@]}" \
    --weights-source https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF --weights-license Apache-2.0
