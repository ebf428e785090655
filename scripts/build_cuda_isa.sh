#!/bin/sh
# build_cuda_isa.sh — compile every src/ops/gpu/*.cu for sm_90a with nvcc and
# keep what `nstf isa` reads, in OUT/sm_90a/:
#   <file>.ptxas.txt   `-Xptxas -v` (registers, stack frame, spill bytes per kernel)
#   <file>.ptx         the PTX (instruction counts when there is no SASS)
#   <file>.sass        `cuobjdump --dump-sass`, when a cuobjdump can be found
# Usage: scripts/build_cuda_isa.sh [OUT]   (default: build-amd)
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc),
# CUOBJDUMP (default: on PATH, next to nvcc, or OUT/tools/cuobjdump as put
# there by `scripts/install_deps.sh amd`; nvdisasm must sit beside it). Without nvcc it says so and exits 0
# (the CUDA part of the report is optional); a compile error exits 1.
set -eu
OUT=${1:-build-amd}
SRC=$(cd "$(dirname "$0")/.." && pwd)
NVCC=${NVCC:-$(command -v nvcc || true)}
[ -n "$NVCC" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || NVCC=/usr/local/cuda/bin/nvcc
if [ -z "$NVCC" ]; then
    echo "build_cuda_isa.sh: no nvcc; the sm_90a part of the ISA report is skipped"
    exit 0
fi
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || true)}
[ -n "$CUOBJDUMP" ] || [ ! -x "$(dirname "$NVCC")/cuobjdump" ] || CUOBJDUMP="$(dirname "$NVCC")/cuobjdump"
[ -n "$CUOBJDUMP" ] || [ ! -x "$OUT/tools/cuobjdump" ] || CUOBJDUMP="$OUT/tools/cuobjdump"
# cuobjdump runs nvdisasm, which it looks for on PATH (both come in the
# CUDA toolkit, or as the PyPI wheels nvidia-cuda-cuobjdump / -nvdisasm).
[ -z "$CUOBJDUMP" ] || PATH="$(dirname "$CUOBJDUMP"):$PATH"
D="$OUT/sm_90a"
mkdir -p "$D"
rm -f "$D"/*.sass "$D"/*.ptx "$D"/*.ptxas.txt
FLAGS="-O3 -std=c++17 -DNDEBUG --expt-relaxed-constexpr -I$SRC/include -I$SRC/src -Xcompiler -Wall,-Wextra,-Wno-unused-parameter"
n=0
for f in "$SRC"/src/ops/gpu/*.cu; do
    b=$(basename "$f" .cu)
    echo "nvcc sm_90a       $b.cu"
    if ! $NVCC $FLAGS -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c "$f" -o "$D/$b.o" 2> "$D/$b.ptxas.txt"; then
        cat "$D/$b.ptxas.txt" >&2
        echo "build_cuda_isa.sh: $b.cu failed for sm_90a" >&2
        exit 1
    fi
    $NVCC $FLAGS -arch=compute_90a -ptx "$f" -o "$D/$b.ptx"
    if [ -n "$CUOBJDUMP" ] && ! "$CUOBJDUMP" --dump-sass "$D/$b.o" > "$D/$b.sass"; then
        echo "build_cuda_isa.sh: cuobjdump failed; counting from PTX instead" >&2
        rm -f "$D/$b.sass"
        CUOBJDUMP=""
    fi
    rm -f "$D/$b.o"
    n=$((n + 1))
done
if [ -n "$CUOBJDUMP" ]; then how="SASS from $CUOBJDUMP"; else how="no cuobjdump: instruction counts from PTX"; fi
echo "build_cuda_isa.sh: $n files for sm_90a in $D ($how)"
