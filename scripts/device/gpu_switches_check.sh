#!/bin/sh
# gpu_switches_check.sh — the GPU checks of the switch registry and the GEMV
# split: builds nothing. Run it from the repository root of a tree with a
# CUDA build (build-cuda/ by default) on a machine with an NVIDIA GPU.
#
#   sh scripts/device/gpu_switches_check.sh [BUILD_DIR]
#
# Runs, each with its own log in $BUILD_DIR/gpu_switches_check/:
#   test_ops_gpu     every op against its reference; the fused GEMVs (now
#                    gemv_fused.cu, instances of gemv.cu / gemvq.cu) bitwise
#                    against the unfused ones
#   test_gemm_gpu    every GEMM kernel: default, each wgmma tile forced and
#                    the portable one, switched with nstf_switch_set(NSTF_GEMM)
#   test_levels_gpu  every execution level vs L3, fused vs unfused, bf16 and
#                    Q4_1 (bitwise where the level promises it)
#   nstf devices --verbose   the switch listing with a GPU present
# and prints one line per check, "PASS name", "FAIL name (exit N, log ...)"
# or "SKIP name (no GPU)", then "gpu_switches_check: PASS" when every check
# passed (exit 0), else "gpu_switches_check: FAIL" (exit 1). A skip counts as
# a failure: on a GPU machine nothing may skip.
set -u
b=${1:-build-cuda}
if [ ! -x "$b/tests/test_ops_gpu" ]; then
    echo "gpu_switches_check: no CUDA build at $b (make cuda; or give its folder)" >&2
    exit 2
fi
logs="$b/gpu_switches_check"
mkdir -p "$logs"
ok=1
run() { # run NAME COMMAND...
    name=$1
    shift
    "$@" > "$logs/$name.log" 2>&1
    rc=$?
    case $rc in
    0) echo "PASS $name" ;;
    77) echo "SKIP $name (no GPU)"; ok=0 ;;
    *) echo "FAIL $name (exit $rc, log $logs/$name.log)"; tail -n 5 "$logs/$name.log" | sed 's/^/    /'; ok=0 ;;
    esac
}
run test_ops_gpu "$b/tests/test_ops_gpu"
run test_gemm_gpu "$b/tests/test_gemm_gpu"
run test_levels_gpu "$b/tests/test_levels_gpu"
# the listing: every switch, defaults in a clean environment, no warning
run devices_verbose env -u NSTF_GEMM -u NSTF_PDL -u NSTF_GEMV_PRE -u NSTF_PF_BYTES -u NSTF_FD_EARLY \
    -u NSTF_GEMV_ROWS "$b/nstf" devices --verbose
for s in NSTF_GEMM NSTF_PDL NSTF_GEMV_PRE NSTF_PF_BYTES NSTF_FD_EARLY NSTF_GEMV_ROWS; do
    if ! grep -q "^  $s .* default " "$logs/devices_verbose.log"; then
        echo "FAIL devices_verbose ($s not listed with its default; log $logs/devices_verbose.log)"
        ok=0
    fi
done
grep -h "checks," "$logs"/test_*.log 2>/dev/null | sed 's/^/    /'
if [ $ok = 1 ]; then
    echo "gpu_switches_check: PASS"
    exit 0
fi
echo "gpu_switches_check: FAIL"
exit 1
