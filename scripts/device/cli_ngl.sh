#!/bin/sh
# cli_ngl.sh — the GPU checks of `nstf run -ngl N` (partial offload) and the
# CLI on a GPU machine: builds nothing. Run it from the repository root of a
# tree with a CUDA build (build-cuda/ by default) and the SmolLM2 model in
# models/, on a machine with an NVIDIA GPU.
#
#   sh scripts/device/cli_ngl.sh [BUILD_DIR]
#
# Runs, each with its own log in $BUILD_DIR/cli_ngl/:
#   test_e2e_gpu   GPU logits against the CPU's, and a GPU/CPU split (the
#                  first half of the layers on the GPU) against the CPU and
#                  against the whole model on the GPU, with the stated gates
#   test_cli       the CLI; with a GPU, `run -ngl 1 -v` on a 2-layer model
#                  must print the split and one memory line per device
#   ngl_N          `nstf run -m SmolLM2 -ngl N -v --temp 0 -n 24` for N = 0
#                  (CPU), 15 (layers 0-14 on the GPU, 15-29 on the CPU), 99
#                  (all on the GPU): exit 0; for 15 the split line and the
#                  memory lines of both devices; for 99 "device=gpu" only
# and prints one line per check, "PASS name" or "FAIL name (...)", the three
# answers (for a look: they may differ, the CPU and GPU round differently),
# then "cli_ngl: PASS" (exit 0) or "cli_ngl: FAIL" (exit 1). A skip counts as
# a failure: on a GPU machine nothing may skip.
set -u
b=${1:-build-cuda}
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -x "$b/nstf" ] || [ ! -x "$b/tests/test_e2e_gpu" ]; then
    echo "cli_ngl: no CUDA build at $b (make cuda; or give its folder)" >&2
    exit 2
fi
if [ ! -f "$model" ]; then
    echo "cli_ngl: $model missing (make model)" >&2
    exit 2
fi
logs="$b/cli_ngl"
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
need() { # need NAME PATTERN: the log of NAME has a line matching PATTERN
    if ! grep -q -- "$2" "$logs/$1.log"; then
        echo "FAIL $1 (no line matching '$2'; log $logs/$1.log)"
        ok=0
    fi
}
run test_e2e_gpu "$b/tests/test_e2e_gpu"
run test_cli "$b/tests/test_cli"
for n in 0 15 99; do
    run "ngl_$n" "$b/nstf" run -m "$model" -ngl "$n" -v --temp 0 -n 24 --chat -p "What is the capital of France?"
done
need ngl_0 "memory: device=cpu"
need ngl_15 "split: embedding and layers 0-14 on the GPU, layers 15-29 and the output on the CPU"
need ngl_15 "memory: device=gpu"
need ngl_15 "memory: device=cpu"
need ngl_99 "memory: device=gpu"
if grep -q "memory: device=cpu" "$logs/ngl_99.log"; then
    echo "FAIL ngl_99 (a CPU memory line with every layer on the GPU)"
    ok=0
fi
for n in 0 15 99; do
    printf '  -ngl %-3s ' "$n"
    grep -v '^nstf\|^memory:\|^loading' "$logs/ngl_$n.log" | tr '\n' ' ' | cut -c1-100
    echo
done
grep -h "checks," "$logs"/test_*.log 2>/dev/null | sed 's/^/    /'
if [ $ok = 1 ]; then
    echo "cli_ngl: PASS"
    exit 0
fi
echo "cli_ngl: FAIL"
exit 1
