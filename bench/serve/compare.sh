#!/bin/sh
# compare.sh — `nstf serve` and llama.cpp's `llama-server` on the same model
# file with the same slots and KV size, driven by bench_serve.py in turn
# (one server at a time), one table row each.
#
#   sh bench/serve/compare.sh MODEL [N_STREAMS] [PROMPT] [GEN]
#
# Environment: NSTF (default build/nstf), LLAMA_SERVER (path to llama-server;
# unset: only nstf runs), DEVICE (nstf --device, default auto), THREADS (-t),
# NGL (llama-server -ngl, default 99), EXTRA_NSTF / EXTRA_LLAMA (more flags),
# REQUESTS (requests in all, default 2 x streams).
# Both servers get -np N and a KV cache of N x (PROMPT + GEN) positions.
set -eu
model=$1
n=${2:-32}
prompt=${3:-512}
gen=${4:-128}
nstf=${NSTF:-build/nstf}
requests=${REQUESTS:-$((2 * n))}
ctx=$((n * (prompt + gen)))
here=$(dirname "$0")
port=18080
threads=""
[ -n "${THREADS:-}" ] && threads="-t $THREADS"

wait_up() { # wait_up PORT PID
    i=0
    until python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null; do
        kill -0 "$2" 2>/dev/null || { echo "compare.sh: the server exited" >&2; exit 1; }
        i=$((i + 1)); [ $i -lt 600 ] || { echo "compare.sh: the server did not come up" >&2; exit 1; }
        sleep 1
    done
}

bench() { # bench LABEL
    python3 "$here/bench_serve.py" --url "http://127.0.0.1:$port" -n "$n" --requests "$requests" \
        --prompt-tokens "$prompt" --gen-tokens "$gen" --label "$1"
}

# shellcheck disable=SC2086
"$nstf" serve -m "$model" --port $port -np "$n" -c "$ctx" -b $((n > 512 ? n : 512)) --device "${DEVICE:-auto}" \
    --max-tokens "$gen" $threads ${EXTRA_NSTF:-} 2>nstf_serve.log &
pid=$!
wait_up $port $pid
bench "nstf serve"
kill -TERM $pid; wait $pid || true

if [ -n "${LLAMA_SERVER:-}" ]; then
    # shellcheck disable=SC2086
    "$LLAMA_SERVER" -m "$model" --port $port -np "$n" -c "$ctx" -ngl "${NGL:-99}" --cont-batching $threads \
        ${EXTRA_LLAMA:-} 2>llama_server.log &
    pid=$!
    wait_up $port $pid
    bench "llama-server"
    kill -TERM $pid; wait $pid || true
fi
