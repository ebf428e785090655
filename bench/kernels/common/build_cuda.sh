#!/bin/sh
# build_cuda.sh [OUTDIR] — builds the GEMM / attention tests and benchmarks
# with nvcc (sm_90a + sm_80) outside CMake, for the kernel sandbox.
# Run from the repository root. GPU_INC may add include dirs.
set -e
O="${1:-build-cuda-mm}"
mkdir -p "$O"
INC="-Isrc/ops/gpu -Isrc -Iinclude"
ARCH="-gencode=arch=compute_90a,code=sm_90a -gencode=arch=compute_80,code=sm_80"
NV="nvcc -O3 -std=c++17 $ARCH $INC -Xcompiler -Wall,-Wextra"
cc -O2 -std=c11 -Iinclude -Isrc -c src/core/status.c -o "$O/status.o"
for k in gpu_common gemm flash_attn flash_decode; do
    [ -f src/ops/gpu/$k.cu ] && $NV -c src/ops/gpu/$k.cu -o "$O/$k.o" &
done
wait
OBJS=$(ls "$O"/gpu_common.o "$O"/gemm.o "$O"/flash_attn.o "$O"/flash_decode.o 2>/dev/null | tr '\n' ' ')
for t in test_gemm_gpu test_attention_gpu; do
    [ -f tests/$t.cu ] && $NV tests/$t.cu $OBJS "$O/status.o" -o "$O/$t"
done
[ -f bench/kernels/gemm/bench_gemm.cu ] && $NV bench/kernels/gemm/bench_gemm.cu $OBJS "$O/status.o" -lcublas -o "$O/bench_gemm"
[ -f bench/kernels/attention/bench_attention.cu ] && $NV bench/kernels/attention/bench_attention.cu $OBJS "$O/status.o" -o "$O/bench_attention"
echo built into "$O"
