#!/bin/sh
# serve_check.sh — the GPU checks of serving (paged KV cache, continuous
# batches, nstf serve on the GPU): builds and downloads nothing. Run it from
# the repository root of a tree with a CUDA build (build-cuda/ by default) on
# a machine with an NVIDIA GPU.
#
#   sh scripts/device/serve_check.sh [BUILD_DIR]      (or B=BUILD_DIR sh ...)
#
# Runs, each with its own log in $BUILD_DIR/serve_check/:
#   test_paged_attn_gpu  nstf_gpu_paged_attention against the fp64 reference:
#                        mixed batches over shuffled blocks, a shared prefix,
#                        64 decode sequences, argument validation
#   test_e2e_gpu         the GPU forward against the CPU's, now also for a
#                        continuous batch of 4 sequences over a paged cache
#                        (lines "cb seq N ... ok"); needs the models the test
#                        names (random ones it generates, and the real
#                        models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   test_serve_gpu       tests/serve/test_serve.py with --device gpu: the
#                        openai client against nstf serve on the GPU (needs
#                        python3 with the openai package, else SKIP)
# and prints one line per check, "PASS name", "FAIL name (exit N, log ...)"
# or "SKIP name (why)", then "serve_check: PASS" when every check passed
# (exit 0), else "serve_check: FAIL" (exit 1). test_serve_gpu may skip
# (no openai package on the machine); the other two may not.
set -u
b=${1:-${B:-build-cuda}}
if [ ! -x "$b/tests/test_paged_attn_gpu" ] || [ ! -x "$b/nstf" ]; then
    echo "serve_check: no CUDA build with test_paged_attn_gpu at $b (make cuda; or give its folder)" >&2
    exit 2
fi
logs="$b/serve_check"
mkdir -p "$logs"
ok=1
run() { # run NAME MAY_SKIP COMMAND...
    name=$1
    may_skip=$2
    shift 2
    "$@" > "$logs/$name.log" 2>&1
    rc=$?
    case $rc in
    0) echo "PASS $name" ;;
    77)
        echo "SKIP $name ($(tail -n 1 "$logs/$name.log"))"
        [ "$may_skip" = yes ] || ok=0
        ;;
    *)
        echo "FAIL $name (exit $rc, log $logs/$name.log)"
        grep -E '^(FAIL|  .*FAIL)' "$logs/$name.log" | head -n 10 | sed 's/^/    /'
        tail -n 3 "$logs/$name.log" | sed 's/^/    /'
        ok=0
        ;;
    esac
}
run test_paged_attn_gpu no "$b/tests/test_paged_attn_gpu"
if [ -x "$b/tests/test_e2e_gpu" ]; then
    run test_e2e_gpu no "$b/tests/test_e2e_gpu"
    grep -E 'continuous batch|cb seq' "$logs/test_e2e_gpu.log" | sed 's/^/    /'
else
    echo "FAIL test_e2e_gpu (not built at $b/tests/test_e2e_gpu)"
    ok=0
fi
if command -v python3 > /dev/null 2>&1; then
    run test_serve_gpu yes python3 tests/serve/test_serve.py --nstf "$b/nstf" \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --device gpu
else
    echo "SKIP test_serve_gpu (no python3)"
fi
if [ $ok -eq 1 ]; then
    echo "serve_check: PASS"
    exit 0
fi
echo "serve_check: FAIL"
exit 1
