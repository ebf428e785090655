#!/bin/sh
# arch_check.sh — the architectures of the table (Llama 3.1 RoPE scaling,
# Qwen2, Qwen3, Mistral's sliding window) and nstf perplexity on the GPU.
# Builds nothing: run it from the repository root of a tree with a CUDA
# build (build-cuda/ by default) on a machine with an NVIDIA GPU; the
# default model (models/SmolLM2-135M-Instruct.Q4_1.gguf) is needed for 5.
#
#   sh scripts/device/arch_check.sh [BUILD_DIR]
#
# What passing looks like:
# 1. test_backend_ops_gpu: every row of the op table at every level, among
#    them BIAS and HEAD_NORM, RoPE with frequency factors and attention with
#    sliding windows (prefill tiles skipped before the window, split-KV
#    decode starting at it): "test_backend_ops_gpu: N checks, N passed, 0
#    failed".
# 2. test_ops_gpu: the fused decode GEMV with RoPE factors bitwise equal to
#    the unfused GEMV + RoPE ("gemv_fused ... rope/norm+factors" lines pass),
#    and every earlier case as before.
# 3. test_levels_gpu on the default model (the Llama path: L0-L3 against
#    the CPU, L3's fused decode bitwise the unfused kernels, as before) and
#    on GGUF files `nstf convert` writes of tests/data/arch: llama31 (fused
#    decode with RoPE factors, bitwise the unfused), mistral (window 16
#    with a 20-token prompt and 4 decode steps), qwen2 and qwen3 (decoded
#    unfused: "L3 fused decode: not used ... with QKV biases or q/k norms").
#    Each: "test_levels_gpu: N checks, N passed, 0 failed".
# 4. test_arch: with a GPU it adds, per architecture, the folder and the
#    converted file on the device against transformers' fp32 logits (lines
#    "logits <arch> folder gpu" / "converted gpu", mean KL <= 0.01 nats),
#    and one token per forward for llama31 and mistral (the graph-captured
#    decode with factors / window at every position): all pass.
# 5. test_e2e_gpu, test_determinism_gpu: the Llama path unchanged.
# 6. nstf perplexity of the default model on /usr/share/common-licenses/GPL-3
#    (-c 512) on the GPU and on the CPU: both "Final estimate" lines
#    printed; the GPU's PPL within 1% of the CPU's (bf16 activations
#    against 8-bit activation blocks; record both in docs/PERFORMANCE.md).
set -eu
b=${1:-build-cuda}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$b/tests/test_backend_ops_gpu"
"$b/tests/test_ops_gpu"
"$b/tests/test_levels_gpu" models/SmolLM2-135M-Instruct.Q4_1.gguf
for a in llama31 mistral qwen2 qwen3; do
    "$b/nstf" convert "tests/data/arch/$a" -o "$tmp/$a.gguf"
    echo "== test_levels_gpu on $a"
    "$b/tests/test_levels_gpu" "$tmp/$a.gguf"
done
"$b/tests/test_arch"
"$b/tests/test_e2e_gpu"
"$b/tests/test_determinism_gpu"

text=/usr/share/common-licenses/GPL-3
gpu=$("$b/nstf" perplexity -m models/SmolLM2-135M-Instruct.Q4_1.gguf -f "$text" -c 512 --device gpu |
    sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p')
cpu=$("$b/nstf" perplexity -m models/SmolLM2-135M-Instruct.Q4_1.gguf -f "$text" -c 512 --device cpu |
    sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p')
echo "perplexity on $text, -c 512: GPU $gpu, CPU $cpu"
awk -v g="$gpu" -v c="$cpu" 'BEGIN { d = g / c - 1; if (d < 0) d = -d; if (g == "" || c == "" || d > 0.01) exit 1 }' ||
    { echo "arch_check: GPU and CPU perplexity differ by more than 1%"; exit 1; }
echo "arch_check: passed"
