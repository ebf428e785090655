#!/bin/sh
# build_hip.sh — compile every src/ops/gpu/*.cu as HIP for the AMD targets:
#   hipcc --offload-arch=gfx90a -c            (complete code objects, ROCm headers)
#   clang++-19 device-only assembly for gfx942 (MI300X) and gfx1100 (RX 7900 XTX)
# Usage: scripts/build_hip.sh [build-folder]   (default: build-hip)
# Environment: HIPCC, CLANG (default clang++-19), HIP_INCLUDE (directory that
# holds hip/hip_runtime.h; found from the hipcc/libamdhip64-dev packages
# when unset). Exits non-zero on the first failure.
set -eu
OUT=${1:-build-hip}
HIPCC=${HIPCC:-hipcc}
CLANG=${CLANG:-clang++-19}
SRC=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${HIP_INCLUDE:-}" ]; then
    h=$(dpkg -L libamdhip64-dev hipcc 2>/dev/null | grep '/hip/hip_runtime.h$' | head -n 1 || true)
    [ -n "$h" ] || h=/opt/rocm/include/hip/hip_runtime.h
    HIP_INCLUDE=$(dirname "$(dirname "$h")")
fi
mkdir -p "$OUT/gfx90a" "$OUT/gfx942" "$OUT/gfx1100"
INC="-I$SRC/include -I$SRC/src"
# A system include directory must not be repeated with -isystem: that would
# reorder it before libstdc++'s and break its #include_next <math.h>.
HIPINC=""
[ "$HIP_INCLUDE" = /usr/include ] || HIPINC="-isystem $HIP_INCLUDE"
WARN="-Wall -Wextra -Wno-unused-parameter -Werror"
n=0
for f in "$SRC"/src/ops/gpu/*.cu; do
    b=$(basename "$f" .cu)
    echo "hipcc gfx90a      $b.cu"
    $HIPCC -x hip -std=c++17 -O3 -DNDEBUG $WARN $INC --offload-arch=gfx90a -c "$f" -o "$OUT/gfx90a/$b.o"
    for arch in gfx942 gfx1100; do
        echo "clang++ $arch $b.cu"
        $CLANG -x hip -std=c++17 --offload-arch=$arch -nogpulib --cuda-device-only -O3 -S \
            -D__HIP_PLATFORM_AMD__ -DNDEBUG $WARN $HIPINC $INC \
            "$f" -o "$OUT/$arch/$b.s"
        # -nogpulib: no device library, so any call left to one is an error.
        if grep -E '^\s*s_(swappc|setpc)_b64|__ocml_|__ockl_' "$OUT/$arch/$b.s" >/dev/null; then
            echo "build_hip.sh: $b.cu for $arch calls a device-library function:" >&2
            grep -E '__ocml_|__ockl_' "$OUT/$arch/$b.s" | sort -u | head -n 5 >&2
            exit 1
        fi
    done
    n=$((n + 1))
done
echo "build_hip.sh: $n files built for gfx90a (objects), gfx942 and gfx1100 (assembly) in $OUT"
