#!/bin/sh
# cpu_vs_llama_cpp.sh — prompt (pp512) and generation (tg128) speed of NSTF
# and llama.cpp's CPU build on the same GGUF files, same thread count,
# alternating the two engines per file so both see the same machine state.
# llama.cpp comes from scripts/build_llama_cpp.sh (its version is pinned
# there). Prints the load average before each run: compare only quiet runs.
#
# usage: sh bench/peers/cpu_vs_llama_cpp.sh THREADS REPS MODEL.gguf [MODEL.gguf ...]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
lcpp=$(ls -d "$root"/third_party/llama.cpp-*/build-cpu/bin 2>/dev/null | tail -1)
[ -x "$lcpp/llama-bench" ] || { echo "no llama-bench: run sh scripts/build_llama_cpp.sh first" >&2; exit 1; }
t=$1; r=$2; shift 2
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
"$lcpp/llama-bench" --version 2>&1 | head -1 || true
for m in "$@"; do
    echo "## $m ($(stat -c %s "$m") bytes) load: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$root/build/nstf" bench -m "$m" -p 512 -n 128 -t "$t" -r "$r" --device cpu
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$lcpp/llama-bench" -m "$m" -p 512 -n 128 -t "$t" -r "$r"
done
