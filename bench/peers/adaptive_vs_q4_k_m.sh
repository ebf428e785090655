#!/bin/sh
# adaptive_vs_q4_k_m.sh — adaptive precision (`nstf quantize ... auto`) at
# the size of llama.cpp's Q4_K_M of the same F16 file, against that Q4_K_M
# and NSTF's own, by perplexity (llama-perplexity and nstf perplexity on
# the same text and windows) and KL / top-1 against the F16 file. llama.cpp
# comes from scripts/build_llama_cpp.sh (llama-quantize, llama-perplexity).
#
# usage: sh bench/peers/adaptive_vs_q4_k_m.sh F16.gguf CALIB.txt EVAL.txt WORKDIR [THREADS]
#   The sensitivity table is kept in WORKDIR/sens.tsv and reused when there.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
lcpp=$(ls -d "$root"/third_party/llama.cpp-*/build-cpu/bin 2>/dev/null | tail -1)
[ -x "$lcpp/llama-perplexity" ] && [ -x "$lcpp/llama-quantize" ] ||
    { echo "no llama-perplexity / llama-quantize: run sh scripts/build_llama_cpp.sh cpu first" >&2; exit 1; }
f16=$1 calib=$2 eval=$3 dir=$4 t=${5:-2}
nstf="$root/build/nstf"
mkdir -p "$dir"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$root" rev-parse --short HEAD) cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
[ -f "$dir/lq4km.gguf" ] || "$lcpp/llama-quantize" "$f16" "$dir/lq4km.gguf" Q4_K_M "$t" >/dev/null 2>&1
[ -f "$dir/nq4km.gguf" ] || "$nstf" quantize "$f16" "$dir/nq4km.gguf" Q4_K_M -t "$t"
# the budget: llama.cpp's Q4_K_M tensor data, bytes
budget=$(python3 -c "from gguf import GGUFReader; import sys; print(sum(int(x.n_bytes) for x in GGUFReader(sys.argv[1]).tensors))" "$dir/lq4km.gguf")
echo "budget: $budget bytes of tensor data (llama.cpp's Q4_K_M)"
if [ -f "$dir/sens.tsv" ]; then sens="--sensitivity $dir/sens.tsv"; else sens="--save-sensitivity $dir/sens.tsv"; fi
# shellcheck disable=SC2086
"$nstf" quantize "$f16" "$dir/auto.gguf" auto --calib "$calib" --calib-tokens 128 --target-size "$budget" \
    --eval "$eval" --eval-tokens 512 $sens -t "$t"
"$nstf" perplexity -m "$f16" -f "$eval" -c 128 -t "$t" --device cpu --save-logits "$dir/f16.logits" 2>&1 | grep "Final estimate"
for m in lq4km nq4km auto; do
    echo "## $m: $(stat -c %s "$dir/$m.gguf") bytes"
    "$nstf" perplexity -m "$dir/$m.gguf" -c 128 -t "$t" --device cpu --kl-base "$dir/f16.logits" 2>&1 |
        grep -E "Mean PPL\(Q\)|Mean    KLD|Same top p"
    "$lcpp/llama-perplexity" -m "$dir/$m.gguf" -f "$eval" -c 128 -t "$t" 2>&1 | grep -E "Final estimate" || true
done
echo "## f16"
"$lcpp/llama-perplexity" -m "$f16" -f "$eval" -c 128 -t "$t" 2>&1 | grep -E "Final estimate" || true
