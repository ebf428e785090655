#!/bin/sh
# zero_check.sh — ZeRO-1 (nstf train --dp 2 --zero 1) on a machine with 2
# (or more) GPUs, from an existing CUDA build; builds and downloads
# nothing. Run it from the repository root:
#
#   B=BUILD_DIR sh scripts/device/zero_check.sh    (or: sh scripts/device/zero_check.sh BUILD_DIR)
#
# BUILD_DIR (default build-cuda) is a CUDA build of this tree (make cuda;
# NSTF_NCCL on, its default where nccl.h is installed); NCCL is loaded at
# run time (NSTF_NCCL_LIBRARY names the file when the loader does not find
# libnccl.so.2). One line per check, "PASS name", "FAIL name (why)" or
# "INFO name: ..." (figures, no verdict); logs in ${LOGS:-$B/zero_check}/;
# the last line "zero_check: PASS" (exit 0) or "zero_check: FAIL" (exit 1).
#
#   test_comm_gpu     the communicator on every GPU: the all-reduce (peer and
#                     NCCL), and ZeRO-1's reduce-scatter (bitwise the
#                     rank-order sum and the all-reduce on 2 GPUs) and
#                     all-gather (fp32 and 16-bit, bit for bit) in padded
#                     slots, the host all-gather, stalled ranks named
#   same_dp2          a random SmolLM2-135M-shaped bf16 model, 20 steps of
#                     4 x 128 tokens per GPU, --clip 0.5: --dp 2 --zero 1
#                     against --dp 2 --zero 0: every logged loss and norm
#                     equal and the final checkpoints byte-identical (two
#                     ranks' NCCL sums do not depend on the order, the
#                     norm's segments are the same, AdamW is elementwise;
#                     the GPU step is deterministic run to run)
#   resume_z1_to_z0   the --zero 1 run stopped at step 10 and resumed with
#                     --zero 0: the final checkpoint byte-identical to the
#                     uninterrupted --zero 0 run's
#   resume_z1_to_dp1  the same checkpoint resumed on one GPU (--batch 8):
#                     the last loss within 1e-3 relative of --dp 2's (one
#                     GPU sums the batch's gradients in another order)
#   plan              --plan of the 1B shape at --dp 2 with --zero 0 and 1
#                     (INFO: the optimizer line per rank)
#   speed             the 135M shape at 8 x 1024 tokens per GPU, 8 steps,
#                     --zero 0 and --zero 1 (INFO: median step time of steps
#                     3-8 and tokens/s; the figure behind --zero's GPU
#                     default, which stays 0 until it says 1 is no slower)
set -u
B=${1:-${B:-build-cuda}}
nstf=$B/nstf
if [ ! -x "$nstf" ] || [ ! -x "$B/tests/test_comm_gpu" ]; then
    echo "zero_check: no CUDA build with test_comm_gpu at $B (give B=DIR)" >&2
    exit 2
fi
logs=${LOGS:-$B/zero_check}
rm -rf "$logs"
mkdir -p "$logs" || exit 2
ok=1
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"

. scripts/device/check_lib.sh # pass, fail, run

# the "loss grad_norm" of each step of a --log file
losses() { sed 's/.*"loss": \([^,]*\),.*"grad_norm": \([^,]*\),.*/\1 \2/' "$1"; }
last() { tail -n 1 "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
# median step_ms of steps 3.. of a --log file
median_ms() {
    sed -n '3,$p' "$1" | sed 's/.*"step_ms": \([^,]*\),.*/\1/' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
}

run test_comm_gpu "$B/tests/test_comm_gpu" && grep -E "sharded|reduce-scatter" "$logs/test_comm_gpu.log" | sed 's/^/INFO test_comm_gpu: /'

w=$logs/work
mkdir -p "$w"
cat docs/*.md README.md > "$w/text.txt"
model=$w/smol.gguf
if run gen_model "$nstf" gen-model --shape smollm2-135m --type bf16 -o "$model"; then
    T="train -m $model --data $w/text.txt --device gpu --seq 128 --steps 20 --lr 1e-3 --warmup 2 --clip 0.5 -q"
    # shellcheck disable=SC2086
    run dp2_zero0 "$nstf" $T --dp 2 --batch 4 --zero 0 --log "$logs/z0.jsonl" --ckpt-dir "$w/z0"
    # shellcheck disable=SC2086
    run dp2_zero1 "$nstf" $T --dp 2 --batch 4 --zero 1 --log "$logs/z1.jsonl" --ckpt-dir "$w/z1"
    if [ -s "$logs/z0.jsonl" ] && [ -s "$logs/z1.jsonl" ] && [ "$(losses "$logs/z0.jsonl")" = "$(losses "$logs/z1.jsonl")" ] &&
        cmp -s "$w/z0/checkpoint.nstf" "$w/z1/checkpoint.nstf"; then
        pass "same_dp2 (20 steps: losses and norms equal, checkpoints byte-identical; last loss $(last "$logs/z1.jsonl"))"
    else
        fail same_dp2 "--zero 1 and --zero 0 differ: $logs/z0.jsonl, $logs/z1.jsonl, $w/z0, $w/z1"
        paste -d '|' "$logs/z0.jsonl" "$logs/z1.jsonl" 2> /dev/null | head -n 3 | sed 's/^/    /'
    fi
    # shellcheck disable=SC2086
    if run resume_z1_stop "$nstf" $T --dp 2 --batch 4 --zero 1 --ckpt-dir "$w/r" --stop-at 10 &&
        cp -r "$w/r" "$w/r1" &&
        run resume_z1_to_z0_run "$nstf" $T --dp 2 --batch 4 --zero 0 --resume "$w/r" --ckpt-dir "$w/r"; then
        if cmp -s "$w/r/checkpoint.nstf" "$w/z0/checkpoint.nstf"; then pass resume_z1_to_z0
        else fail resume_z1_to_z0 "the resumed run's checkpoint differs from the uninterrupted --zero 0 run's"; fi
    fi
    # shellcheck disable=SC2086
    if [ -d "$w/r1" ] && run resume_z1_to_dp1_run "$nstf" $T --batch 8 --resume "$w/r1" --log "$logs/r1.jsonl"; then
        a=$(last "$logs/r1.jsonl")
        z=$(last "$logs/z0.jsonl")
        if awk -v a="$a" -v z="$z" 'BEGIN { d = a - z; if (d < 0) d = -d; exit !(d <= 1e-3 * (z < 0 ? -z : z)) }'; then
            pass "resume_z1_to_dp1 (last loss $a vs $z)"
        else
            fail resume_z1_to_dp1 "last loss $a vs --dp 2's $z"
        fi
    fi
fi

for z in 0 1; do
    "$nstf" train --shape llama32-1b --data "$w/text.txt" --ckpt-dir "$w/plan" --device gpu --dp 2 --zero $z \
        --batch 8 --seq 1024 --recompute attn --plan > "$logs/plan_$z.log" 2>&1
    echo "INFO plan llama32-1b --dp 2 --zero $z: $(grep -E '^ *optimizer' "$logs/plan_$z.log" | tr -s ' ');" \
        "$(grep -E '^ *total' "$logs/plan_$z.log" | tr -s ' ')"
done

if [ -f "$model" ]; then
    for z in 0 1; do
        if "$nstf" train -m "$model" --data "$w/text.txt" --device gpu --dp 2 --zero $z --batch 8 --seq 1024 \
            --steps 8 --lr 1e-3 -q --log "$logs/speed_$z.jsonl" > "$logs/speed_$z.log" 2>&1; then
            echo "INFO speed --dp 2 --zero $z, 135M shape, 8 x 1024 per GPU: median step $(median_ms "$logs/speed_$z.jsonl") ms" \
                "(steps 3-8), last $(tail -n 1 "$logs/speed_$z.jsonl" | sed 's/.*"tokens_per_s": \([^,]*\),.*/\1/') tokens/s"
        else
            fail "speed_$z" "exit; log $logs/speed_$z.log"
        fi
    done
fi

if [ $ok = 1 ]; then
    echo "zero_check: PASS"
    exit 0
fi
echo "zero_check: FAIL"
exit 1
