#!/bin/sh
# gpu_kquants_check.sh — the GPU side of the block and super-block weight
# types (Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) on a
# machine with an NVIDIA GPU. Builds and downloads nothing: it runs the
# binaries of an existing CUDA build folder, given as $B (default
# build-cuda), laid out as the CMake build makes it:
#   $B/nstf  $B/tests/test_ops_gpu  $B/tests/test_backend_ops_gpu
#   $B/tests/test_levels_gpu  $B/tests/test_e2e_gpu  $B/bench/bench_infer
#
#   B=build-cuda sh scripts/device/gpu_kquants_check.sh [STEP...]
#
# Steps (default: all three, in this order):
#   kernels  test_ops_gpu (every type's GEMV in every launch shape against
#            the fp64 reference, the fused GEMVs bitwise against the unfused
#            ones, get_rows bit-exact against nstf_dequantize_row) and
#            test_backend_ops_gpu (matmul of 1..20 tokens, GEMV and the
#            dequantize-then-GEMM prefill, and get_rows of every type through
#            the backend). Per new type, the count of its passing and failing
#            case lines.
#   models   SmolLM2-135M-shaped random models (`nstf gen-model --shape
#            smollm2-135m --type bf16`, then `nstf quantize` to Q5_0, Q5_1,
#            Q4_K, Q5_K, Q6_K, Q4_K_M, Q5_K_M; rows of 576 are not whole
#            super-blocks, so those matrices take llama.cpp's fallback types
#            and the K types land on ffn_down and the mixes' choices),
#            written to $B/gpu_kquants_check/ (about 1.5 GB), each run by
#            test_levels_gpu (every level against the CPU reference; L3's
#            fused decode bitwise against the unfused kernels) and
#            test_e2e_gpu (GPU prefill and decode against the CPU forward:
#            per-position KL, centred NMSE, top-1). Q2_K, Q3_K, IQ4_NL and
#            IQ4_XS have no quantizer, so no model file: the kernels step
#            and the bench cover them.
#   bench    bench_infer --shape llama32-1b --type T (random weights built
#            in memory, every matrix of type T, or the mix) for each new
#            type, the mixes and the bf16/q8_0/q4_0 baselines: decode
#            ms/token at context 512 (graph, device argmax) and prefill 512
#            tokens/s, one line per type. Figures, not verdicts.
#
# Passing: a "PASS name" line per test run (a SKIP on a GPU machine is a
# failure), per new type "TYPE: N cases passed, 0 failed" with N > 0, and
# "gpu_kquants_check: PASS" at the end (exit 0); anything else ends with
# "gpu_kquants_check: FAIL" (exit 1). Logs are in $B/gpu_kquants_check/.
set -u
B=${B:-build-cuda}
steps=${*:-kernels models bench}
for x in nstf tests/test_ops_gpu tests/test_backend_ops_gpu tests/test_levels_gpu tests/test_e2e_gpu bench/bench_infer; do
    if [ ! -x "$B/$x" ]; then
        echo "gpu_kquants_check: $B/$x is missing (set B to a CUDA build folder)" >&2
        exit 2
    fi
done
logs="$B/gpu_kquants_check"
mkdir -p "$logs" || exit 2
ok=1
new_types="Q5_0 Q5_1 IQ4_NL Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS"
run() { # run NAME COMMAND...
    name=$1
    shift
    "$@" > "$logs/$name.log" 2>&1
    rc=$?
    case $rc in
    0) echo "PASS $name" ;;
    77) echo "FAIL $name (skipped: no GPU?)"; ok=0 ;;
    *) echo "FAIL $name (exit $rc, log $logs/$name.log)"; grep -E "^FAIL|failed:" "$logs/$name.log" | head -n 20 | sed 's/^/    /'; ok=0 ;;
    esac
}

for step in $steps; do
    case $step in
    kernels)
        run test_ops_gpu "$B/tests/test_ops_gpu"
        run test_backend_ops_gpu "$B/tests/test_backend_ops_gpu"
        for t in $new_types; do
            # test_ops_gpu: one PASS/FAIL line per case; test_backend_ops_gpu:
            # a "CHECK(...) failed" line naming the type per failure
            p=$(grep -E "^PASS" "$logs/test_ops_gpu.log" | grep -cwF "$t")
            f=$(grep -E "^FAIL|CHECK.*failed" "$logs/test_ops_gpu.log" "$logs/test_backend_ops_gpu.log" | grep -cwF "$t")
            echo "    $t: $p cases passed, $f failed"
            [ "$p" -gt 0 ] && [ "$f" -eq 0 ] || ok=0
        done
        tail -n 1 "$logs/test_ops_gpu.log" | sed 's/^/    test_ops_gpu: /'
        ;;
    models)
        base="$logs/smollm2-135m-bf16.gguf"
        if [ ! -f "$base" ]; then
            "$B/nstf" gen-model --shape smollm2-135m --type bf16 -o "$base" > "$logs/gen.log" 2>&1 ||
                { echo "FAIL gen-model smollm2-135m (log $logs/gen.log)"; ok=0; continue; }
        fi
        for t in Q5_0 Q5_1 Q4_K Q5_K Q6_K Q4_K_M Q5_K_M; do
            f="$logs/smollm2-135m-$t.gguf"
            if [ ! -f "$f" ]; then
                "$B/nstf" quantize "$base" "$f" "$t" -t "$(nproc)" >> "$logs/gen.log" 2>&1 ||
                    { echo "FAIL nstf quantize $t (log $logs/gen.log)"; ok=0; rm -f "$f"; continue; }
            fi
            run "levels_$t" "$B/tests/test_levels_gpu" "$f"
            run "e2e_$t" "$B/tests/test_e2e_gpu" "$f"
            grep -E "types:|KL\(cpu" "$logs/e2e_$t.log" | head -n 6 | sed "s/^/    $t: /"
        done
        ;;
    bench)
        for t in bf16 q8_0 q4_0 $new_types Q4_K_M Q5_K_M; do
            lt=$(echo "$t" | tr 'A-Z' 'a-z')
            if ! "$B/bench/bench_infer" --shape llama32-1b --type "$lt" --prompt 512 --gen 64 --reps 5 \
                > "$logs/bench_$lt.log" 2>&1; then
                echo "FAIL bench_infer $t (log $logs/bench_$lt.log)"
                ok=0
                continue
            fi
            dc=$(grep -F "(graph, device argmax)" "$logs/bench_$lt.log" | head -n 1 | sed -E 's/.*: ([0-9.]+) ms\/token.*/\1/')
            pf=$(grep -E "^prefill" "$logs/bench_$lt.log" | head -n 1 | sed -E 's/.*= ([0-9.]+) tokens\/s.*/\1/')
            echo "bench llama32-1b $t: decode $dc ms/token (context 512, graph, device argmax), prefill 512 $pf tokens/s"
        done
        ;;
    *)
        echo "gpu_kquants_check: unknown step $step (kernels, models, bench)" >&2
        exit 2
        ;;
    esac
done
if [ $ok = 1 ]; then
    echo "gpu_kquants_check: PASS"
    exit 0
fi
echo "gpu_kquants_check: FAIL"
exit 1
