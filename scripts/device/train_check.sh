#!/bin/sh
# train_check.sh — training on the GPU, from an existing CUDA build; builds
# nothing and downloads nothing. Run it from the repository root on a
# machine with an NVIDIA GPU:
#
#   B=build-cuda sh scripts/device/train_check.sh      (or: sh ... BUILD_DIR)
#
# B is a CUDA build folder (make cuda): $B/nstf, $B/tests/test_op_table,
# $B/tests/test_backend_ops_gpu, $B/tests/test_train_gpu. The default model
# models/SmolLM2-135M-Instruct.Q4_1.gguf is used when present; without it
# the fine-tunes run on models this script makes (said in their lines).
# The speed lines need python3 with torch and transformers (else SKIP).
#
# One line per check: "PASS name", "FAIL name (why; log FILE)" or
# "SKIP name (why)"; "INFO" lines carry figures. Logs go to
# ${LOGS:-$B/train_check}/. The last line is "train_check: PASS" (exit 0)
# or "train_check: FAIL" (exit 1); on a GPU machine nothing may skip but the
# PyTorch peer, so a skipped test counts as a failure.
#
# Checks, and what passing means:
#  test_op_table         every row of the op table complete on this build
#  test_backend_ops_gpu  every op at every level and every training row in
#                        gradient mode against the references (fp32 NMSE <=
#                        1e-7, bf16 within 2x a naive bf16 computation)
#  test_train_gpu        the whole step on tests/data/hf_tiny against the
#                        CPU's fp32 step (loss and norm within 1%, gradients
#                        NMSE <= 1e-3, recompute modes bitwise, LoRA)
#  scratch               --shape smollm2-135m, 40 steps of 8 x 256 tokens of
#                        the repository's docs: the loss falls by > 1 nat
#                        (its export generates 16 tokens, below)
#  lora_q4_1             rank-16 LoRA on a Q4_1 base (SmolLM2, else a random
#                        Q4_1 model at its shape), 20 steps of 4 x 256: the
#                        loss falls by > 0.1; the adapters are written
#  full                  full fine-tune of the same base, 10 steps of 4 x 256
#                        (lr 1e-4 on SmolLM2, 1e-3 on the random model): the
#                        loss falls by > 0.1
#  *_run, *_generates    each exported GGUF generates 16 tokens with
#                        `nstf run --device gpu`
#  plan_llama32_1b       `--plan` at B16 x T1024 for each recompute mode
#                        (INFO lines; attn and full must fit an 80 GB card)
# Speed (printed, not asserted): `nstf train --shape smollm2-135m` at
# ${SPEED_B:-16} x ${SPEED_T:-1024}, the last of 5 steps (tokens/s, MFU), and
# bench/peers/torch_train.py at the same shape (HF eager, bf16 autocast,
# fused AdamW; TORCH_COMPILE=1 adds torch.compile, which takes minutes).
set -u
B=${1:-${B:-build-cuda}}
nstf=$B/nstf
if [ ! -x "$nstf" ] || [ ! -x "$B/tests/test_train_gpu" ]; then
    echo "train_check: no CUDA build with the training tests at $B (give B=DIR)" >&2
    exit 2
fi
logs=${LOGS:-$B/train_check}
rm -rf "$logs"
mkdir -p "$logs" || exit 2
ok=1
smol=models/SmolLM2-135M-Instruct.Q4_1.gguf

. scripts/device/check_lib.sh # pass, fail, run
# loss of the first and of the last step of a --log file
first() { grep '"loss"' "$1" | head -n 1 | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
last() { grep '"loss"' "$1" | tail -n 1 | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
# falls NAME MIN_DROP: the run NAME's loss fell by more than MIN_DROP
falls() {
    a=$(first "$logs/$1.jsonl")
    z=$(last "$logs/$1.jsonl")
    if [ -n "$a" ] && [ -n "$z" ] && awk -v a="$a" -v z="$z" -v d="$2" 'BEGIN { exit !(z < a - d) }'; then
        pass "$1_loss (loss $a -> $z, by more than $2)"
    else
        fail "$1_loss" "loss ${a:-?} -> ${z:-?}, not by more than $2; log $logs/$1.log"
    fi
}
# generates NAME MODEL: 16 tokens from MODEL on the GPU (its speed line says so)
generates() {
    run "$1_run" "$nstf" run -m "$2" --device gpu -p "The memory plan" -n 16 --temp 0 || return 1
    if grep -q "generation 16 tokens" "$logs/$1_run.log"; then
        pass "$1_generates"
        echo "INFO $1_run: $(tr '\n' ' ' < "$logs/$1_run.log" | head -c 300)"
    else
        fail "$1_generates" "no 16 generated tokens; log $logs/$1_run.log"
    fi
}

run test_op_table "$B/tests/test_op_table"
run test_backend_ops_gpu "$B/tests/test_backend_ops_gpu"
run test_train_gpu "$B/tests/test_train_gpu" && grep -i "nmse\|loss" "$logs/test_train_gpu.log" | head -n 6 | sed 's/^/INFO test_train_gpu: /'

w=$logs/work
mkdir -p "$w"
cat docs/*.md README.md > "$w/text.txt"

# from scratch
if run scratch "$nstf" train --shape smollm2-135m --data "$w/text.txt" --device gpu --steps 40 --batch 8 --seq 256 \
    --lr 1e-3 --ckpt-dir "$w/scratch" --log "$logs/scratch.jsonl" --out "$w/scratch.gguf"; then
    falls scratch 1
    echo "INFO scratch last step: $(tail -n 1 "$logs/scratch.jsonl")"
    generates scratch "$w/scratch.gguf"
fi

# the bases of the fine-tunes
if [ -f "$smol" ]; then
    qbase=$smol
    flr=1e-4
    echo "INFO fine-tunes of $smol"
else
    qbase=$w/random_q4_1.gguf
    flr=1e-3
    echo "INFO $smol absent: the fine-tunes start from a random Q4_1 model at the SmolLM2-135M shape"
    run gen_q4_1 "$nstf" gen-model --shape smollm2-135m --type q4_1 -o "$qbase" || qbase=
fi
fbase=$qbase

if [ -n "$qbase" ] && run lora_q4_1 "$nstf" train -m "$qbase" --data "$w/text.txt" --device gpu --steps 20 \
    --batch 4 --seq 256 --lr 1e-3 --lora 16 --log "$logs/lora_q4_1.jsonl" --out "$w/lora.gguf" \
    --lora-out "$w/adapters.gguf"; then
    falls lora_q4_1 0.1
    if [ -s "$w/adapters.gguf" ]; then pass lora_adapters_written; else fail lora_adapters_written "no $w/adapters.gguf"; fi
    generates lora "$w/lora.gguf"
fi

if [ -n "$fbase" ] && run full "$nstf" train -m "$fbase" --data "$w/text.txt" --device gpu --steps 10 --batch 4 \
    --seq 256 --lr $flr --log "$logs/full.jsonl" --out "$w/full.gguf"; then
    falls full 0.1
    generates full "$w/full.gguf"
fi

# the memory plan of the 1B shape
for r in none attn full; do
    "$nstf" train --shape llama32-1b --ckpt-dir "$w/plan" --data "$w/text.txt" --device gpu --batch 16 --seq 1024 \
        --recompute $r --plan > "$logs/plan_$r.log" 2>&1
    rc=$?
    echo "INFO plan llama32-1b B16 x T1024 --recompute $r: $(grep -E '^ *total' "$logs/plan_$r.log" | tr -s ' ')"
    if [ $r != none ] && [ $rc -ne 0 ]; then fail "plan_llama32_1b_$r" "does not fit; log $logs/plan_$r.log"; fi
done

# speed, printed
sb=${SPEED_B:-16}
st=${SPEED_T:-1024}
if "$nstf" train --shape smollm2-135m --data "$w/text.txt" --device gpu --steps 5 --batch "$sb" --seq "$st" \
    --ckpt-dir "$w/speed" --log "$logs/speed.jsonl" -q > "$logs/speed.log" 2>&1; then
    l=$(tail -n 1 "$logs/speed.jsonl")
    echo "INFO nstf train smollm2-135m ${sb}x${st} (last of 5 steps): tokens/s $(echo "$l" |
        sed 's/.*"tokens_per_s": \([^,]*\),.*/\1/'), MFU $(echo "$l" | sed 's/.*"mfu": \([^,}]*\).*/\1/')"
else
    fail speed "nstf train exit; log $logs/speed.log"
fi
if command -v python3 > /dev/null; then
    c=
    [ "${TORCH_COMPILE:-0}" = 1 ] && c=--compile
    python3 bench/peers/torch_train.py --shape smollm2-135m --batch "$sb" --seq "$st" --steps 5 --warmup 2 $c \
        > "$logs/torch.log" 2>&1
    case $? in
    0) sed 's/^/INFO /' "$logs/torch.log" | grep 'INFO torch_train' ;;
    77) echo "SKIP torch_peer ($(tail -n 1 "$logs/torch.log"))" ;;
    *) echo "SKIP torch_peer (failed; log $logs/torch.log)"; tail -n 3 "$logs/torch.log" | sed 's/^/    /' ;;
    esac
else
    echo "SKIP torch_peer (no python3)"
fi

if [ $ok = 1 ]; then
    echo "train_check: PASS"
    exit 0
fi
echo "train_check: FAIL"
exit 1
