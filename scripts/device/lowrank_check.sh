#!/bin/sh
# lowrank_check.sh — the low-rank path on the GPU, from an existing CUDA
# build (builds nothing):
#   sh scripts/device/lowrank_check.sh [BUILD_DIR]   (default build-cuda)
# 1. test_backend_ops_gpu: the matmul_lr row at every level (F32, F16, BF16
#    and Q8_0 factors, 3 and 20 tokens, bf16 rule) — its lines are shown;
# 2. test_lowrank_gpu: SmolLM2 (or the random SmolLM2-shaped model) with
#    six matrices per layer as exact factorizations against the dense model
#    at every level (NMSE <= 1e-6 of the logits).
# Passing looks like: "matmul_lr ... ok" for L3..L0 and
#   "test_backend_ops_gpu: N checks, N passed, 0 failed",
#   "L0..L3: factorized vs dense logits, worst NMSE ..." and
#   "test_lowrank_gpu: 31 checks, 31 passed, 0 failed" (4 levels).
# Exit 0 when both passed, 1 when one failed or is missing, 77 without a GPU.
set -u
B=${1:-build-cuda}
rc=0
for t in test_backend_ops_gpu test_lowrank_gpu; do
    bin="$B/tests/$t"
    if [ ! -x "$bin" ]; then
        echo "$t: $bin not built"
        rc=1
        continue
    fi
    log=$("$bin" 2>&1)
    trc=$?
    if [ $trc -eq 77 ]; then
        echo "$t: skipped (no GPU)"
        [ $rc -ne 0 ] || rc=77
        continue
    fi
    echo "$log" | grep -E "matmul_lr|factorized|FAIL|$t:" | head -n 40
    [ $trc -eq 0 ] || rc=1
done
exit $rc
