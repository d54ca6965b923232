#!/usr/bin/env bash
# Side by side: the same recording (PROBLEMS test problems of qwen05_arith.sh's tree, into throwaway folders) through
# TransformersBackend in bfloat16 and float32 and through llama.cpp's server (llama_server.sh), one after the other on
# this machine; prints seconds per problem and the ratios, and writes bench/results/record_engines.md.
#   PROBLEMS (default 200:208), MODEL, LLAMA_SERVER, THREADS. Run it with nothing else on the cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL=${MODEL:-$HOME/.cache/deliberation-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
PROBLEMS=${PROBLEMS:-200:208}
N=$(( ${PROBLEMS#*:} - ${PROBLEMS%:*} ))
TMP=$(mktemp -d)
source bench/record/llama_server.sh
TREE=(--task arithmetic --task-option 'levels=[0,1]' --split test --problems "$PROBLEMS" --chunk "$N" --num-agents 3
      --max-rounds 1 --max-tokens 256 --confidence critic_text --wave 16 --concede-targets all)
seconds() {  # name, backend flags...
    local name=$1; shift
    local start; start=$(date +%s.%N)
    python -m deliberation_env.record --out "$TMP/$name" "${TREE[@]}" "$@" > /dev/null 2>&1
    echo "$(date +%s.%N) - $start" | bc
}
bf16=$(seconds bf16 --backend transformers --model "$MODEL" --dtype bfloat16 --batch-size 16 \
    --backend-option converted_cache_dir="$HOME/.cache/deliberation-models/converted")
fp32=$(seconds fp32 --backend transformers --model "$MODEL" --dtype float32 --batch-size 16 \
    --backend-option converted_cache_dir="$HOME/.cache/deliberation-models/converted")
serve_gguf "$MODEL"
served=$(seconds llama "${RECORD_FLAGS[@]}")
CPU=$(lscpu | sed -n 's/^Model name: *//p')
{
    echo "# Recording engines, side by side"
    echo
    echo "\`bash bench/record/engines.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores ($CPU): test problems $PROBLEMS of"
    echo "\`qwen05_arith.sh\`'s tree (3 agents, 1 round, every concede target, all confidence sources), recorded three"
    echo "times in a row into empty folders (model load included)."
    echo
    echo "| engine | seconds | seconds per problem | vs transformers bfloat16 |"
    echo "|---|---|---|---|"
    for row in "TransformersBackend, bfloat16 $bf16" "TransformersBackend, float32 $fp32" "llama.cpp llama-server (GGUF Q4_K_M) $served"; do
        t=${row##* }; name=${row% *}
        printf '| %s | %.0f | %.1f | %.2fx |\n' "$name" "$t" "$(echo "$t / $N" | bc -l)" "$(echo "$bf16 / $t" | bc -l)"
    done
} | tee bench/results/record_engines.md
rm -rf "$TMP"
