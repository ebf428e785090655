#!/bin/sh
# harness_check.sh — runs the three GPU op tests on the shared harness
# (tests/gpu_harness.h) from an existing CUDA build and prints each one's
# count line; builds nothing.
#   sh scripts/device/harness_check.sh [BUILD_DIR]   (default build-cuda)
# Each test prints one PASS/FAIL line per case, then
#   <test>: C cases (P passed, F failed), K checks (P passed, F failed)
# Full logs go to BUILD_DIR/harness_check/<test>.log. Exit 0 when all three
# passed, 1 when any failed or did not run, 77 when there is no GPU.
# Expected on an H100 (sm_90, 4 GEMM kernels per shape):
#   test_ops_gpu        454 cases, 2815 checks
#   test_gemm_gpu       342 cases, 2130 checks
#   test_attention_gpu  101 cases,  760 checks
set -u
B=${1:-build-cuda}
out="$B/harness_check"
mkdir -p "$out" || exit 1
rc=0
for t in test_ops_gpu test_gemm_gpu test_attention_gpu; do
    bin="$B/tests/$t"
    if [ ! -x "$bin" ]; then
        echo "$t: $bin not built"
        rc=1
        continue
    fi
    "$bin" > "$out/$t.log" 2>&1
    trc=$?
    if [ $trc -eq 77 ]; then
        echo "$t: skipped (no GPU)"
        [ $rc -ne 0 ] || rc=77
        continue
    fi
    line=$(grep -E "^$t: [0-9]+ cases" "$out/$t.log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$t: exit $trc without its count line; last lines of $out/$t.log:"
        tail -n 5 "$out/$t.log"
        rc=1
        continue
    fi
    echo "$line  [exit $trc]"
    if [ $trc -ne 0 ]; then
        grep -E '^FAIL ' "$out/$t.log" | head -n 20
        rc=1
    fi
done
exit $rc
