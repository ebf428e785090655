#!/bin/sh
# train_speed.sh — the GPU training step's tests and speed, from an existing
# CUDA build; builds nothing and downloads nothing. Run it from the
# repository root on a machine with an NVIDIA GPU:
#
#   B=build-cuda sh scripts/device/train_speed.sh      (or: sh ... BUILD_DIR)
#
# B is a CUDA build folder (make cuda): $B/nstf, $B/tests/test_train_gpu,
# $B/tests/test_backend_ops_gpu. Logs go to ${LOGS:-$B/train_speed}/.
#
# Checks (one line each, "PASS name" or "FAIL name (why; log FILE)"):
#  test_train_gpu        the GPU step against the CPU's on tests/data/hf_tiny
#                        (loss and norm within 1%, gradients NMSE <= 1e-3,
#                        recompute modes bitwise, LoRA)
#  test_backend_ops_gpu  every op at every level and every training row in
#                        gradient mode against the references (fp32 NMSE <=
#                        1e-7, bf16 within 2x a naive bf16 computation),
#                        the cross-entropy in chunks of tokens on the wgmma
#                        and the portable GEMMs, the attention forward over a
#                        batch of sequences
#  speed                 `nstf train --shape smollm2-135m` (random
#                        initialization) on the repository's docs at
#                        ${SPEED_B:-16} x ${SPEED_T:-1024}, ${SPEED_STEPS:-6}
#                        steps with --profile: the run ends and its last
#                        loss is finite
# Figures ("INFO" lines): the profile of the second step (time per op), and
# tokens/s and MFU of the last step (unprofiled). The last line is
# "train_speed: PASS" (exit 0) or "train_speed: FAIL" (exit 1); a skipped
# test (no GPU seen) counts as a failure.
set -u
B=${1:-${B:-build-cuda}}
nstf=$B/nstf
if [ ! -x "$nstf" ] || [ ! -x "$B/tests/test_train_gpu" ] || [ ! -x "$B/tests/test_backend_ops_gpu" ]; then
    echo "train_speed: no CUDA build with the training tests at $B (give B=DIR)" >&2
    exit 2
fi
logs=${LOGS:-$B/train_speed}
rm -rf "$logs"
mkdir -p "$logs" || exit 2
ok=1

. scripts/device/check_lib.sh # pass, fail, run

run test_train_gpu "$B/tests/test_train_gpu"
run test_backend_ops_gpu "$B/tests/test_backend_ops_gpu"

sb=${SPEED_B:-16}
st=${SPEED_T:-1024}
steps=${SPEED_STEPS:-6}
w=$logs/work
mkdir -p "$w"
cat docs/*.md README.md > "$w/text.txt"
if run speed "$nstf" train --shape smollm2-135m --data "$w/text.txt" --device gpu --steps "$steps" --batch "$sb" \
    --seq "$st" --ckpt-dir "$w/speed" --log "$logs/speed.jsonl" --profile --print-every 1; then
    awk '/^profile of step/ { p = 1; print "INFO " $0; next } p && /^  / { print "INFO " $0; next } { p = 0 }' \
        "$logs/speed.log"
    l=$(tail -n 1 "$logs/speed.jsonl")
    loss=$(echo "$l" | sed 's/.*"loss": \([^,]*\),.*/\1/')
    tps=$(echo "$l" | sed 's/.*"tokens_per_s": \([^,]*\),.*/\1/')
    mfu=$(echo "$l" | sed 's/.*"mfu": \([^,}]*\).*/\1/')
    echo "INFO nstf train smollm2-135m ${sb}x${st} (last of $steps steps): tokens/s $tps, MFU $mfu, loss $loss"
    if awk -v x="$loss" 'BEGIN { exit !(x == x + 0 && x > 0 && x < 100) }'; then
        pass "speed_loss_finite"
    else
        fail "speed_loss_finite" "last loss '$loss'; log $logs/speed.log"
    fi
fi

if [ $ok = 1 ]; then
    echo "train_speed: PASS"
    exit 0
fi
echo "train_speed: FAIL"
exit 1
