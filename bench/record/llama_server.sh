#!/usr/bin/env bash
# Sourced by a set's script: `serve_gguf FILE` serves a GGUF file with llama.cpp's llama-server on 127.0.0.1 for the
# recorder (--backend openai), and stops it when the script exits. It batches every pending request on the GGUF's
# own kernels: on 2 CPU cores it recorded Qwen2.5-Coder-0.5B's trees at about 48 s per problem (docs/replay.md).
#   LLAMA_SERVER: the llama-server binary (default: llama-server on PATH; how to build it: docs/replay.md,
#   "Recording"). LLAMA_PORT (8089), SLOTS (16: requests decoded together), THREADS (all cores), LLAMA_LOG.
# Sets RECORD_FLAGS: the recorder's backend flags, naming the served model "<file stem>@llama.cpp-<commit>" (so a
# resumed recording on another server build is refused) and telling the card the file's sha256 and the sampler.
serve_gguf() {
    local model=$1 bin=${LLAMA_SERVER:-llama-server} port=${LLAMA_PORT:-8089} slots=${SLOTS:-16}
    if ! command -v "$bin" > /dev/null; then
        echo "llama-server not found: set LLAMA_SERVER=/path/to/llama-server (docs/replay.md, Recording)" >&2
        exit 2
    fi
    if [ ! -f "$model" ]; then
        echo "no model file $model: set MODEL=/path/to/model.gguf" >&2
        exit 2
    fi
    local build
    build=$("$bin" --version 2>&1 | sed -n 's/.*commit \([0-9a-f]*\).*/\1/p')
    local served_as
    served_as="$(basename "$model" .gguf)@llama.cpp-${build:-unknown}"
    # Only temperature and top_p (sent per request) shape sampling: top-k and min-p are off, as in transformers.
    local sampler=(--top-k 0 --min-p 0 --repeat-penalty 1)
    "$bin" -m "$model" --alias "$served_as" --host 127.0.0.1 --port "$port" -c $((slots * 2048)) -np "$slots" \
        -t "${THREADS:-$(nproc)}" --jinja --no-webui "${sampler[@]}" > "${LLAMA_LOG:-/dev/null}" 2>&1 &
    SERVER_PID=$!
    trap 'kill "$SERVER_PID" 2> /dev/null' EXIT
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
        kill -0 "$SERVER_PID" 2> /dev/null || { echo "llama-server exited at start (LLAMA_LOG=file to see why)" >&2; exit 2; }
        sleep 1
    done
    RECORD_FLAGS=(--backend openai --model "$served_as" --base-url "http://127.0.0.1:$port/v1"
                  --backend-option timeout=1200 --weights-file "$model"
                  --server-info "llama.cpp llama-server (commit ${build:-unknown}), ${sampler[*]}, $slots slots, chat template from the GGUF (--jinja)")
}

# Run as a command (`bash bench/record/llama_server.sh MODEL`), it serves MODEL in the foreground until stopped.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    serve_gguf "$1"
    echo "serving ${RECORD_FLAGS[3]} on port ${LLAMA_PORT:-8089}" >&2
    wait "$SERVER_PID"
fi
