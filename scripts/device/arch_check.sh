#!/bin/sh
# arch_check.sh — the architectures of the table (Llama 3.1 RoPE factors,
# Qwen2's QKV bias, Qwen3's q/k norm, Mistral's sliding window) and nstf
# perplexity on a GPU, from an existing CUDA build: builds and downloads
# nothing. Run it from the repository root on a machine with an NVIDIA GPU:
#
#   B=BUILD_DIR sh scripts/device/arch_check.sh    (or: sh scripts/device/arch_check.sh BUILD_DIR)
#
# BUILD_DIR (default build-cuda) is a CUDA build of this tree (make cuda).
# MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf): without it the
# Llama-path checks use a random smollm2-135m-shaped Q4_1 model (nstf
# gen-model) and ppl_gpu_vs_llama_cpp is skipped. Each check prints one
# line, "PASS name", "FAIL name (why; log ...)" or "SKIP name (why)", logs
# in BUILD_DIR/arch_check/; at the end "arch_check: PASS" (exit 0) when
# nothing failed (skips for a missing model or text are listed there),
# else "arch_check: FAIL" (exit 1). A test that exits 77 (no GPU) fails.
#
#   test_backend_ops_gpu   every op row at every level against the CPU,
#                          BIAS and HEAD_NORM, RoPE with frequency factors,
#                          attention with sliding windows among them
#   test_ops_gpu           the fused decode GEMV with RoPE factors bitwise
#                          the unfused GEMV + RoPE ("+factors" cases)
#   test_levels_gpu        the default model, then the GGUF `nstf convert`
#                          writes of each of tests/data/arch (llama31,
#                          mistral, qwen2, qwen3): every level against the
#                          CPU; Qwen models decode unfused
#   test_arch              adds the GPU to its CPU checks: per architecture
#                          the folder and the converted file against
#                          transformers' fp32 logits (mean KL <= 0.01 nats);
#                          FAIL if it says it ran without a GPU
#   test_perplexity, test_e2e_gpu, test_determinism_gpu, test_split
#   run_<arch>             nstf run -m tests/data/arch/<arch> --device gpu:
#                          exit 0 and 8 tokens
#   ppl_gpu_vs_cpu         nstf perplexity, default model, -c 512, on the
#                          text below: the GPU's PPL within 1% of the CPU's
#                          (bf16 activations against 8-bit activation blocks)
#   ppl_gpu_vs_llama_cpp   the default model on Debian's
#                          /usr/share/common-licenses/Apache-2.0, -c 128, on
#                          the GPU: within 0.5% of llama-perplexity's value
#                          recorded in tests/data/perplexity_ref.txt (CPU
#                          llama.cpp); SKIP when that text is not the same
set -u
B=${B:-${1:-build-cuda}}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ ! -x "$B/nstf" ] || [ ! -x "$B/tests/test_ops_gpu" ]; then
    echo "arch_check: no CUDA build at $B (give its folder as B=... or the first argument)" >&2
    exit 2
fi
logs="$B/arch_check"
mkdir -p "$logs" || exit 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ok=1
skipped=""
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; ok=0; }
skip() { echo "SKIP $1"; skipped="$skipped ${1%% *}"; }

# The tests read tests/data and models/ under the source folder the build
# was configured in; when the build came from another tree, point that
# folder at this one.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$B/CMakeCache.txt" 2>/dev/null)
if [ -n "$src" ] && [ ! -d "$src/tests/data/arch" ]; then
    if mkdir -p "$(dirname "$src")" 2>/dev/null && ln -s "$(pwd)" "$src" 2>/dev/null; then
        echo "note: the build's source folder $src was missing; linked to $(pwd)"
    else
        echo "note: the build's source folder $src is missing and could not be linked; data-reading tests will fail"
    fi
fi

run() { # run NAME COMMAND...: PASS on exit 0, SKIP on 77, else FAIL
    name=$1
    shift
    if [ ! -x "$1" ]; then
        fail "$name (not built: $1)"
        return
    fi
    "$@" >"$logs/$name.log" 2>&1
    rc=$?
    case $rc in
    0) pass "$name" ;;
    77) fail "$name (exit 77, skipped: no GPU or a missing precondition; log $logs/$name.log)" ;;
    *)
        fail "$name (exit $rc; log $logs/$name.log)"
        tail -n 5 "$logs/$name.log" | sed 's/^/    /'
        ;;
    esac
}

run test_backend_ops_gpu "$B/tests/test_backend_ops_gpu"
run test_ops_gpu "$B/tests/test_ops_gpu"
if grep -q "+factors" "$logs/test_ops_gpu.log" 2>/dev/null; then
    pass "test_ops_gpu_factors_cases"
else
    fail "test_ops_gpu_factors_cases (no '+factors' case in $logs/test_ops_gpu.log)"
fi
if [ -f "$MODEL" ]; then
    run test_levels_gpu_llama "$B/tests/test_levels_gpu" "$MODEL"
else
    echo "note: $MODEL missing: test_levels_gpu and the GPU/CPU perplexity use random smollm2-135m-shaped models"
    run test_levels_gpu_llama "$B/tests/test_levels_gpu"
fi
for a in llama31 mistral qwen2 qwen3; do
    if "$B/nstf" convert "tests/data/arch/$a" -o "$tmp/$a.gguf" >"$logs/convert_$a.log" 2>&1; then
        run "test_levels_gpu_$a" "$B/tests/test_levels_gpu" "$tmp/$a.gguf"
    else
        fail "test_levels_gpu_$a (nstf convert failed; log $logs/convert_$a.log)"
    fi
done
run test_arch "$B/tests/test_arch"
if grep -q "no GPU" "$logs/test_arch.log" 2>/dev/null; then
    fail "test_arch_gpu (test_arch ran without a GPU)"
elif grep -q "gpu" "$logs/test_arch.log" 2>/dev/null; then
    pass "test_arch_gpu"
else
    fail "test_arch_gpu (no GPU lines in $logs/test_arch.log)"
fi
run test_perplexity "$B/tests/test_perplexity"
run test_e2e_gpu "$B/tests/test_e2e_gpu"
run test_determinism_gpu "$B/tests/test_determinism_gpu"
run test_split "$B/tests/test_split"
for a in llama31 mistral qwen2 qwen3; do
    run "run_$a" "$B/nstf" run -m "tests/data/arch/$a" --device gpu --verbose -p "The history of computing" -n 8 --temp 0
done

# perplexity: "Final estimate: PPL = X +/- Y" of nstf perplexity
ppl() { # ppl NAME ARGS...: prints X, log in $logs/NAME.log
    name=$1
    shift
    "$B/nstf" perplexity "$@" >"$logs/$name.log" 2>&1
    sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$logs/$name.log"
}
within() { # within A B BOUND: |A/B - 1| <= BOUND
    awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { if (a == "" || b == "" || b == 0) exit 1; d = a / b - 1; if (d < 0) d = -d; exit !(d <= t) }'
}
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || text=README.md
pm=$MODEL
if [ ! -f "$pm" ]; then
    pm=$tmp/random_q4_1.gguf
    "$B/nstf" gen-model --shape smollm2-135m --type q4_1 -o "$pm" >"$logs/gen_model.log" 2>&1 ||
        fail "gen_model (log $logs/gen_model.log)"
fi
g=$(ppl ppl_gpu -m "$pm" -f "$text" -c 512 --device gpu)
c=$(ppl ppl_cpu -m "$pm" -f "$text" -c 512 --device cpu)
if within "$g" "$c" 0.01; then
    pass "ppl_gpu_vs_cpu ($(basename "$pm"), $text, -c 512: GPU $g, CPU $c; bound 1%)"
else
    fail "ppl_gpu_vs_cpu ($(basename "$pm"), $text, -c 512: GPU '$g', CPU '$c'; bound 1%; logs $logs/ppl_gpu.log, ppl_cpu.log)"
fi
if [ ! -f "$MODEL" ]; then
    skip "ppl_gpu_vs_llama_cpp ($MODEL missing)"
else
    apache=/usr/share/common-licenses/Apache-2.0
    ref=$(sed -n 's/^final //p' tests/data/perplexity_ref.txt)
    if [ "$(md5sum "$apache" 2>/dev/null | cut -d' ' -f1)" != 3b83ef96387f14655fc854ddc3c6bd57 ]; then
        skip "ppl_gpu_vs_llama_cpp ($apache missing or not the text of the reference)"
    else
        g=$(ppl ppl_gpu_apache -m "$MODEL" -f "$apache" -c 128 --device gpu)
        if within "$g" "$ref" 0.005; then
            pass "ppl_gpu_vs_llama_cpp (Apache-2.0, -c 128: GPU $g, llama-perplexity $ref; bound 0.5%)"
        else
            fail "ppl_gpu_vs_llama_cpp (Apache-2.0, -c 128: GPU '$g', llama-perplexity $ref; bound 0.5%; log $logs/ppl_gpu_apache.log)"
        fi
    fi
fi

for f in "$logs"/test_*.log; do # each test's count line, by log name
    [ -f "$f" ] && grep -h "checks," "$f" | tail -n 1 | sed "s/^/    $(basename "$f" .log): /"
done
if [ $ok = 1 ]; then
    echo "arch_check: PASS${skipped:+ (skipped:$skipped)}"
    exit 0
fi
echo "arch_check: FAIL"
exit 1
