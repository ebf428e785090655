#!/bin/sh
# check_export_llama_cpp.sh — the GGUF that `nstf train --out` writes loads
# in llama.cpp and generates what `nstf run` generates. Fine-tunes SmolLM2
# (LoRA rank 8, merged on export) for four steps on the CPU, then runs the
# same greedy prompt through both.
#
#   sh scripts/check_export_llama_cpp.sh [BUILD_DIR] [LLAMA_CPP_BIN_DIR]
#
# LLAMA_CPP_BIN_DIR holds llama-simple (scripts/build_llama_cpp.sh cpu 2
# llama-simple builds it; default third_party/llama.cpp-0.3.36/build-cpu/bin).
# Passing: "check_export_llama_cpp: same text" (exit 0).
set -eu
b=${1:-build}
l=${2:-third_party/llama.cpp-0.3.36/build-cpu/bin}
smol=models/SmolLM2-135M-Instruct.Q4_1.gguf
out=$(mktemp -d /tmp/nstf_export_check.XXXXXX)
trap 'rm -rf "$out"' EXIT
printf 'The lighthouse keeper wrote in his logbook every evening: the wind, the waves, the ships that passed, and the gulls that came to rest on the rail.\n' > "$out/para.txt"
"$b/nstf" train -m "$smol" --data "$out/para.txt" --batch 1 --seq 32 --steps 4 --lr 2e-3 --warmup 0 \
    --min-lr 2e-3 --lora 8 --device cpu -q --out "$out/tuned.gguf"
ours=$("$b/nstf" run -m "$out/tuned.gguf" -p "The lighthouse keeper" -n 12 --temp 0 2>/dev/null)
theirs=$(LD_LIBRARY_PATH="$l" "$l/llama-simple" -m "$out/tuned.gguf" -n 12 "The lighthouse keeper" 2>/dev/null)
echo "nstf run:     The lighthouse keeper$ours"
echo "llama-simple: $theirs"
[ "$theirs" = "The lighthouse keeper$ours" ] || { echo "check_export_llama_cpp: the texts differ"; exit 1; }
echo "check_export_llama_cpp: same text"
