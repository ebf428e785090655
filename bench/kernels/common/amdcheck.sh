#!/bin/sh
# amdcheck.sh FILE.cu... — compile each file for gfx90a (hipcc, full code
# object) and for gfx942 / gfx1100 (clang++-19, device assembly), then count
# the matrix instructions and print scratch / VGPR lines per kernel.
# Usage from the repository root: sh bench/kernels/common/amdcheck.sh src/ops/gpu/gemm.cu
INC="${AMDCHECK_INC:--Isrc/ops/gpu -Isrc -Iinclude}"
OUTD="${AMDCHECK_OUT:-build-amd}"
mkdir -p "$OUTD"
rc=0
for f in "$@"; do
    b=$(basename "$f" .cu)
    hipcc --offload-arch=gfx90a -O3 -std=c++17 $INC -x hip -c "$f" -o "$OUTD/$b.gfx90a.o" || rc=1
    hipcc --offload-arch=gfx90a -O3 -std=c++17 $INC -x hip --cuda-device-only -S "$f" -o "$OUTD/$b.gfx90a.s" || rc=1
    for a in gfx942 gfx1100; do
        clang++-19 -x hip --offload-arch=$a -nogpulib --cuda-device-only -O3 -S -std=c++17 \
            -D__HIP_PLATFORM_AMD__ $INC "$f" -o "$OUTD/$b.$a.s" || rc=1
    done
    for a in gfx90a gfx942 gfx1100; do
        s="$OUTD/$b.$a.s"
        printf '%-14s %-7s v_mfma=%-4s v_wmma=%-4s max_scratch=%s max_vgpr=%s\n' "$b" "$a" \
            "$(grep -c 'v_mfma' "$s")" "$(grep -c 'v_wmma' "$s")" \
            "$(grep -E '^\s*;\s*ScratchSize:' "$s" | awk '{print $3}' | sort -n | tail -1)" \
            "$(grep -E '^\s*;\s*NumVgprs:' "$s" | awk '{print $3}' | sort -n | tail -1)"
    done
done
exit $rc
