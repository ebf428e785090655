#!/bin/sh
# hf_models.sh — HF model folders on the GPU. Builds nothing: run it from
# the repository root of a tree with a CUDA build (build-cuda/ by default)
# on a machine with an NVIDIA GPU.
#
#   sh scripts/device/hf_models.sh [BUILD_DIR]
#
# 1. test_hf_model: besides its CPU checks, with a GPU it runs the 4
#    reference prompts of tests/data/hf_tiny (2 layers, head size 64,
#    BF16 / F16 / F32 weights mapped from 3 safetensors shards) on the
#    device, from the folder (RoPE in NEOX mode) and from the file `nstf
#    convert` writes (Q/K permuted, adjacent-pair RoPE), against HF
#    transformers' fp32 logits. Passing: the lines "logits folder gpu" and
#    "logits converted (as stored) gpu" (mean KL <= 0.01 nats) and
#    "test_hf_model: N checks, N passed, 0 failed".
# 2. nstf run -m tests/data/hf_tiny --device gpu: exit 0, 16 tokens
#    generated (the speed line on stderr says so).
set -eu
b=${1:-build-cuda}
"$b/tests/test_hf_model"
"$b/nstf" run -m tests/data/hf_tiny --device gpu --verbose -p "The history of computing" -n 16 --temp 0
echo "hf_models: passed"
