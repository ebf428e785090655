#!/bin/sh
# build_llama_cpp.sh — build llama.cpp's tools for side-by-side comparisons
# (llama-bench, llama-perplexity, llama-quantize, llama-simple, llama-cli,
# llama-server). The sources come from the PyPI sdist of llama-cpp-python,
# which vendors llama.cpp; the pinned version below fixes the llama.cpp
# commit we compare against. Output: third_party/llama.cpp-<ver>/ (git-ignored),
# binaries in its build-cpu/bin or build-cuda/bin.
#
# usage: sh scripts/build_llama_cpp.sh [cpu|cuda] [jobs] [targets...]
#   cpu  (default) native CPU build (GGML_NATIVE: AVX2 / AVX-512 as the CPU has)
#   cuda CUDA build for sm_90a (H100), on a machine with nvcc
#   targets: default llama-bench llama-perplexity llama-quantize llama-simple
#            llama-cli llama-server
set -eu
LCP_VERSION=0.3.36
kind=${1:-cpu}
jobs=${2:-$(nproc 2>/dev/null || echo 2)}
[ $# -gt 2 ] && shift 2 || set --
targets=${*:-llama-bench llama-perplexity llama-quantize llama-simple llama-cli llama-server}
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/third_party/llama.cpp-$LCP_VERSION"
py=$(command -v python3 || command -v python)

if [ ! -f "$dest/CMakeLists.txt" ]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    echo "build_llama_cpp: downloading the sdist of llama-cpp-python==$LCP_VERSION" >&2
    "$py" -m pip download --quiet --no-binary :all: --no-deps --disable-pip-version-check \
        -d "$tmp" "llama-cpp-python==$LCP_VERSION" >&2
    tar -xzf "$tmp"/llama_cpp_python-$LCP_VERSION.tar.gz -C "$tmp"
    mkdir -p "$root/third_party"
    rm -rf "$dest"
    mv "$tmp/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp" "$dest"
fi

case "$kind" in
cpu)  bdir="$dest/build-cpu";  extra="-DGGML_NATIVE=ON" ;;
cuda) bdir="$dest/build-cuda"; extra="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a" ;;
*) echo "build_llama_cpp: unknown kind '$kind' (cpu|cuda)" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086
cmake -S "$dest" -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON $extra >&2
# shellcheck disable=SC2086
cmake --build "$bdir" -j "$jobs" --target $targets >&2
# The exact llama.cpp commit the sdist vendors, when it records one.
echo "llama-cpp-python $LCP_VERSION -> $bdir/bin" >&2
"$bdir/bin/llama-bench" --version 2>&1 | head -2 >&2 || true
