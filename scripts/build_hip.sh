#!/bin/sh
# build_hip.sh — compile every src/ops/gpu/*.cu as HIP for the AMD targets:
#   hipcc --offload-arch=gfx90a -c            (complete code objects, ROCm headers;
#                                              -save-temps keeps the device assembly)
#   clang++-19 device-only assembly for gfx942 (MI300X) and gfx1100 (RX 7900 XTX)
# into OUT/<target>/<file>.s (plus OUT/gfx90a/<file>.o), what `nstf isa` reads.
# The three targets build in parallel; any kernel that fails to compile for
# any target, or calls into a device library, fails the script.
# Usage: scripts/build_hip.sh [OUT]   (default: build-amd)
# Environment: HIPCC, CLANG (default clang++-19), HIP_INCLUDE (directory that
# holds hip/hip_runtime.h; found from the hipcc/libamdhip64-dev packages
# when unset).
set -eu
OUT=${1:-build-amd}
HIPCC=${HIPCC:-hipcc}
CLANG=${CLANG:-clang++-19}
SRC=$(cd "$(dirname "$0")/.." && pwd)
for t in "$HIPCC" "$CLANG"; do
    command -v "$t" >/dev/null 2>&1 || { echo "build_hip.sh: $t not found (make deps-amd installs it)" >&2; exit 1; }
done
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

# gfx90a: objects with hipcc; the device assembly of the same compile.
build_gfx90a() {
    for f in "$SRC"/src/ops/gpu/*.cu; do
        b=$(basename "$f" .cu)
        echo "hipcc   gfx90a  $b.cu"
        tmp="$OUT/gfx90a/tmp.$b"
        rm -rf "$tmp" && mkdir -p "$tmp"
        $HIPCC -x hip -std=c++17 -O3 -DNDEBUG -DNSTF_HIP_TARGETS='"gfx90a"' $WARN $INC --offload-arch=gfx90a \
            -save-temps=obj -c "$f" -o "$tmp/$b.o" || return 1
        mv "$tmp/$b.o" "$OUT/gfx90a/$b.o"
        mv "$tmp/$b-hip-amdgcn-amd-amdhsa-gfx90a.s" "$OUT/gfx90a/$b.s"
        rm -rf "$tmp"
        check_nolib "$OUT/gfx90a/$b.s" gfx90a "$b" || return 1
    done
}

# gfx942 / gfx1100: device assembly with clang++-19 and no device library.
build_asm() {
    arch=$1
    for f in "$SRC"/src/ops/gpu/*.cu; do
        b=$(basename "$f" .cu)
        echo "clang19 $arch $b.cu"
        $CLANG -x hip -std=c++17 --offload-arch=$arch -nogpulib --cuda-device-only -O3 -S \
            -D__HIP_PLATFORM_AMD__ -DNDEBUG $WARN $HIPINC $INC "$f" -o "$OUT/$arch/$b.s" || return 1
        check_nolib "$OUT/$arch/$b.s" "$arch" "$b" || return 1
    done
}

# Kernels must not call functions (device library or otherwise): everything
# is inlined, so resource figures are the kernel's own.
check_nolib() {
    if grep -E '^\s*s_(swappc|setpc)_b64|__ocml_|__ockl_' "$1" >/dev/null; then
        echo "build_hip.sh: $3.cu for $2 calls a function or device-library routine:" >&2
        grep -E '__ocml_|__ockl_|s_swappc' "$1" | sort -u | head -n 5 >&2
        return 1
    fi
}

build_gfx90a > "$OUT/gfx90a.log" 2>&1 &
p1=$!
build_asm gfx942 > "$OUT/gfx942.log" 2>&1 &
p2=$!
build_asm gfx1100 > "$OUT/gfx1100.log" 2>&1 &
p3=$!
rc=0
for t in "gfx90a $p1" "gfx942 $p2" "gfx1100 $p3"; do
    set -- $t
    if wait "$2"; then
        echo "build_hip.sh: $1 ok ($(grep -c '^hipcc\|^clang19' "$OUT/$1.log") files)"
    else
        echo "build_hip.sh: $1 FAILED:" >&2
        cat "$OUT/$1.log" >&2
        rc=1
    fi
done
[ $rc = 0 ] && echo "build_hip.sh: gfx90a (objects + assembly), gfx942 and gfx1100 (assembly) in $OUT"
exit $rc
