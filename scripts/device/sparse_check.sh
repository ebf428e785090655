#!/bin/sh
# sparse_check.sh — the sparse decode attention (ATTN_SPARSE) on the GPU,
# from an existing CUDA build (builds nothing):
#   sh scripts/device/sparse_check.sh [BUILD_DIR] [MODEL]
#   (defaults build-cuda, models/SmolLM2-135M-Instruct.Q4_1.gguf)
# 1. test_backend_ops_gpu: the attn_sparse row at every level (prefill
#    chunks through flash attention + the statistics kernel, then one-token
#    steps through select / attend / merge): selections equal to the fp64
#    reference's, outputs under the bf16 rule, block min/max exact, the
#    attention mass NMSE <= 1e-7;
# 2. nstf run on the GPU with --sparse-attn (every layer sparse; graphs and
#    the fused decode at the default level) must generate without error;
# 3. bench_sparse_attn on the GPU at context 8192 (the model's full
#    context), 20 passkey trials and 512 perplexity steps, sparse (top-k 16,
#    window 64, blocks of 16) against dense (top-k covering every block).
# Passing looks like: "attn_sparse ok" for L3..L0 and
#   "test_backend_ops_gpu: N checks, N passed, 0 failed"; the run's text
#   and its speed line; the benchmark's table and its "passkey: sparse a/20,
#   dense b/20" and "perplexity ..." lines (b and the dense perplexity as
#   the CPU's figures in docs/OPTIMIZE.md give for their context; sparse
#   within a few points of dense). Exit 0 when all ran, 1 when one failed
#   or is missing, 77 without a GPU.
set -u
B=${1:-build-cuda}
M=${2:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
rc=0
bin="$B/tests/test_backend_ops_gpu"
if [ ! -x "$bin" ]; then
    echo "test_backend_ops_gpu: $bin not built"
    exit 1
fi
log=$("$bin" 2>&1)
trc=$?
if [ $trc -eq 77 ]; then
    echo "test_backend_ops_gpu: skipped (no GPU)"
    exit 77
fi
echo "$log" | grep -E "attn_sparse|FAIL|test_backend_ops_gpu:" | head -n 60
[ $trc -eq 0 ] || rc=1
if [ ! -f "$M" ]; then
    echo "no model at $M: the run and the benchmark are skipped"
    exit $rc
fi
"$B/nstf" run -m "$M" --device gpu -p "The history of the printing press" -n 64 --temp 0 --sparse-attn 16,64 -v \
    2>&1 | grep -Ev "^nstf: (device|context)" | tail -n 8 || rc=1
"$B/bench/bench_sparse_attn" -m "$M" -c 8192 --trials 20 --text docs/ARCHITECTURE.md --ppl-tokens 512 || rc=1
exit $rc
