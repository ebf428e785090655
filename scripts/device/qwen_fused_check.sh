#!/bin/sh
# qwen_fused_check.sh — Qwen2's QKV bias and Qwen3's per-head q/k norm in
# the level-3 fused decode, on a machine with an NVIDIA GPU. Builds and
# downloads nothing: it runs the binaries of an existing CUDA build folder
# (make cuda), given as $B (default build-cuda), from the repository root:
#
#   B=build-cuda sh scripts/device/qwen_fused_check.sh
#
# Needs python3 with torch and transformers for the larger random models
# (scripts/device/make_qwen_shapes.py; no network). Steps, one line each:
#
#   test_ops_gpu        every case; among them the fused QKV GEMV with the
#                       bias and/or the q/k norm ("gemv_fused qkv" lines) for
#                       BF16, F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
#                       Q6_K weights at Qwen2.5-0.5B, Qwen3-0.6B and
#                       Qwen2.5-7B QKV shapes, odd head counts, head_dim
#                       256, and x = 0 (the output is the bias alone; v's
#                       rows must be bf16(bias)): bitwise the unfused kernels
#                       (rmsnorm, gemv, bias x3, head_norm, rope) and within
#                       2x a naive bf16 chain's NMSE of the fp64 references;
#                       and the q/k norm's second kernel alone
#                       ("head_norm_rope" lines: head_dim 6..256, k heads
#                       only 2-byte aligned) bitwise head_norm + rope; the
#                       counts of those cases are printed
#   test_backend_ops_gpu  the BIAS and HEAD_NORM op rows at every level
#   levels_<model>      test_levels_gpu on the GGUF `nstf convert` writes of
#                       tests/data/arch/qwen2 and qwen3 (BF16), and on random
#                       Qwen2.5-0.5B-wide and Qwen3-0.6B-wide models (4
#                       layers) converted and quantized: every level against
#                       the CPU reference, and L3's fused decode bitwise the
#                       unfused kernels; the step must now take the fused
#                       path (a "fused decode ... with the QKV bias / q/k
#                       norm" line) and launch fewer kernels than unfused.
#                       Printed per model: "kernels per decode step: F fused,
#                       U unfused" (the captured graph's nodes; before this
#                       change a Qwen step ran the U kernels)
#   test_arch           its GPU lines: the Qwen folders and converted files
#                       against transformers' logits (mean KL <= 0.01 nats)
#   bench (figures)     bench_infer decode ms/token (context 512, graph,
#                       device argmax) of the random Qwen models, fused and
#                       --unfused (the level-3 graph of the unfused kernels)
#
# Passing: "PASS name" for every step, "gemv_fused qkv: 130 cases passed,
# 0 failed", "head_norm_rope: 11 cases passed, 0 failed", and
# "qwen_fused_check: PASS" at the end (exit 0). A test that exits 77
# (skipped) is a failure here. Logs in $B/qwen_fused_check/.
set -u
B=${B:-${1:-build-cuda}}
for x in nstf tests/test_ops_gpu tests/test_backend_ops_gpu tests/test_levels_gpu tests/test_arch; do
    if [ ! -x "$B/$x" ]; then
        echo "qwen_fused_check: $B/$x is missing (set B to a CUDA build folder)" >&2
        exit 2
    fi
done
logs="$B/qwen_fused_check"
mkdir -p "$logs" || exit 2
ok=1
run() { # run NAME COMMAND...: PASS on exit 0, else FAIL (77, a skip, too)
    name=$1
    shift
    "$@" >"$logs/$name.log" 2>&1
    rc=$?
    case $rc in
    0) echo "PASS $name" ;;
    77) echo "FAIL $name (exit 77, skipped: no GPU?; log $logs/$name.log)"; ok=0 ;;
    *)
        echo "FAIL $name (exit $rc; log $logs/$name.log)"
        grep -E "^FAIL|failed" "$logs/$name.log" | head -n 10 | sed 's/^/    /'
        ok=0
        ;;
    esac
}

run test_ops_gpu "$B/tests/test_ops_gpu"
# cases COUNT PREFIX: the PASS/FAIL lines of test_ops_gpu's cases named PREFIX
cases() {
    p=$(grep -E "^PASS $2" "$logs/test_ops_gpu.log" | wc -l)
    f=$(grep -E "^FAIL $2" "$logs/test_ops_gpu.log" | wc -l)
    echo "    $2: $p cases passed, $f failed (want $1 and 0)"
    [ "$p" -eq "$1" ] && [ "$f" -eq 0 ] || ok=0
}
cases 130 "gemv_fused qkv"
cases 11 "head_norm_rope"
tail -n 1 "$logs/test_ops_gpu.log" | sed 's/^/    /'
run test_backend_ops_gpu "$B/tests/test_backend_ops_gpu"

# levels MODEL_NAME GGUF: test_levels_gpu, then the fused decode's lines
levels() {
    run "levels_$1" "$B/tests/test_levels_gpu" "$2"
    l="$logs/levels_$1.log"
    if grep -q "L3 fused decode with the" "$l"; then
        k=$(sed -n 's/.*graph nodes): \([0-9]*\) kernels fused, \([0-9]*\) unfused.*/\1 fused, \2 unfused/p' "$l")
        echo "    $1: kernels per decode step: $k"
    else
        echo "FAIL fused_$1 (the Qwen decode did not take the fused path; log $l)"
        grep -E "L3 fused decode" "$l" | sed 's/^/    /'
        ok=0
    fi
}

for a in qwen2 qwen3; do
    if "$B/nstf" convert "tests/data/arch/$a" -o "$logs/$a.gguf" >"$logs/convert_$a.log" 2>&1; then
        levels "$a-bf16" "$logs/$a.gguf"
    else
        echo "FAIL convert_$a (log $logs/convert_$a.log)"
        ok=0
    fi
done

if python3 scripts/device/make_qwen_shapes.py "$logs/hf" 4 >"$logs/make_qwen_shapes.log" 2>&1; then
    # Qwen2.5-0.5B's width 896 is no whole number of super-blocks: the
    # K types would fall back to others per matrix (a mix, which decodes
    # unfused), so that model takes the 32-element types
    for m in "qwen25-0.5b:BF16 F16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1" "qwen3-0.6b:BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K"; do
        model=${m%%:*} # not "name": run() and levels() set that one
        if ! "$B/nstf" convert "$logs/hf/$model" -o "$logs/$model-BF16.gguf" >"$logs/convert_$model.log" 2>&1; then
            echo "FAIL convert_$model (log $logs/convert_$model.log)"
            ok=0
            continue
        fi
        for t in ${m#*:}; do
            g="$logs/$model-$t.gguf"
            if [ "$t" != BF16 ] && ! "$B/nstf" quantize "$logs/$model-BF16.gguf" "$g" "$t" -t "$(nproc)" \
                >>"$logs/convert_$model.log" 2>&1; then
                echo "FAIL quantize_$model-$t (log $logs/convert_$model.log)"
                ok=0
                continue
            fi
            levels "$model-$t" "$g"
        done
    done
else
    echo "FAIL make_qwen_shapes (python3 with torch and transformers; log $logs/make_qwen_shapes.log)"
    ok=0
fi

run test_arch "$B/tests/test_arch"
if grep -q "no GPU" "$logs/test_arch.log" 2>/dev/null; then
    echo "FAIL test_arch_gpu (test_arch ran without a GPU)"
    ok=0
fi

# figures, not verdicts: decode ms/token of the random Qwen models, the
# fused step against the level-3 graph of the unfused kernels (the before)
if [ -x "$B/bench/bench_infer" ]; then
    for g in "$logs/qwen25-0.5b-BF16.gguf" "$logs/qwen3-0.6b-BF16.gguf" "$logs/qwen3-0.6b-Q4_K.gguf"; do
        [ -f "$g" ] || continue
        n=$(basename "$g" .gguf)
        for u in "" --unfused; do
            if "$B/bench/bench_infer" -m "$g" --prompt 512 --gen 64 --reps 5 $u >"$logs/bench_$n$u.log" 2>&1; then
                d=$(grep -F "(graph, device argmax)" "$logs/bench_$n$u.log" | sed -E 's/.*: ([0-9.]+) ms\/token.*/\1/')
                echo "    bench $n (4 layers) decode ${u:+un}fused: $d ms/token (context 512, graph, device argmax)"
            else
                echo "    bench $n${u:+ $u}: bench_infer failed (log $logs/bench_$n$u.log)"
            fi
        done
    done
fi

if [ $ok = 1 ]; then
    echo "qwen_fused_check: PASS"
    exit 0
fi
echo "qwen_fused_check: FAIL"
exit 1
