#!/bin/sh
# train_check.sh — training on the GPU. Builds nothing: run it from the
# repository root of a tree with a CUDA build (build-cuda/ by default) and
# the default model (models/SmolLM2-135M-Instruct.Q4_1.gguf) on a machine
# with an NVIDIA GPU.
#
#   sh scripts/device/train_check.sh [BUILD_DIR]
#
# Passing looks like this (each step stops the script on failure):
# 1. test_op_table: every row "all" (the GPU table has the training rows).
# 2. test_backend_ops_gpu: every op "ok" at every level, the training rows
#    included (its gradient mode: GPU gradients against the references, bf16
#    within 2x a naive bf16 computation, fp32 NMSE <= 1e-7), and
#    "test_backend_ops_gpu: N checks, N passed, 0 failed".
# 3. test_train_gpu: the whole step on tests/data/hf_tiny against the CPU's
#    fp32 step (loss and norm within 1%, gradients NMSE <= 1e-3, recompute
#    modes bitwise equal, LoRA), "0 failed". It prints the measured NMSE.
# 4. From scratch at the SmolLM2-135M shape (--shape smollm2-135m), 40 steps
#    of 8 x 256 tokens of the repository's docs: "train: loss A -> B" with
#    B < A - 1 (a byte-level model learns English bytes quickly), MFU printed.
# 5. SmolLM2-135M Q4_1: LoRA rank 16 and a full fine-tune, 10 steps of
#    4 x 256 tokens each; the loss falls; both exported models generate 16
#    tokens on the GPU (`nstf run --device gpu`).
# 6. The memory plan of the Llama-3.2-1B shape at B16 x T1024 with each
#    recompute mode (printed; "fits" expected for attn and full on 80 GB),
#    and one timed line: SmolLM2-135M shape, B16 x T1024, 5 steps (the
#    tokens/s and MFU of the last step, for docs/PERFORMANCE.md).
set -eu
b=${1:-build-cuda}
nstf=$b/nstf
smol=models/SmolLM2-135M-Instruct.Q4_1.gguf
out=$(mktemp -d /tmp/nstf_train_check.XXXXXX)
trap 'rm -rf "$out"' EXIT

# loss of the first and last JSON line of a log
first() { head -n 1 "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
last() { grep '"loss"' "$1" | tail -n 1 | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
falls() { # falls LOG MIN_DROP WHAT
    a=$(first "$1"); z=$(last "$1")
    echo "$3: loss $a -> $z"
    awk -v a="$a" -v z="$z" -v d="$2" 'BEGIN { exit !(z < a - d) }' || { echo "$3: the loss did not fall by $2"; exit 1; }
}

"$b/tests/test_op_table"
"$b/tests/test_backend_ops_gpu"
"$b/tests/test_train_gpu"

cat docs/*.md README.md > "$out/text.txt"
"$nstf" train --shape smollm2-135m --data "$out/text.txt" --device gpu --steps 40 --batch 8 --seq 256 --lr 1e-3 \
    --ckpt-dir "$out/scratch" --log "$out/scratch.jsonl"
falls "$out/scratch.jsonl" 1 "from scratch (smollm2-135m shape)"
tail -n 1 "$out/scratch.jsonl"

"$nstf" train -m "$smol" --data "$out/text.txt" --device gpu --steps 10 --batch 4 --seq 256 --lr 1e-3 --lora 16 \
    --log "$out/lora.jsonl" --out "$out/lora.gguf" --lora-out "$out/adapters.gguf"
falls "$out/lora.jsonl" 0.1 "LoRA rank 16 on SmolLM2-135M Q4_1"
"$nstf" run -m "$out/lora.gguf" --device gpu -p "The memory plan" -n 16 --temp 0

"$nstf" train -m "$smol" --data "$out/text.txt" --device gpu --steps 10 --batch 4 --seq 256 --lr 1e-4 \
    --log "$out/full.jsonl" --out "$out/full.gguf"
falls "$out/full.jsonl" 0.1 "full fine-tune of SmolLM2-135M"
"$nstf" run -m "$out/full.gguf" --device gpu -p "The memory plan" -n 16 --temp 0

for r in none attn full; do
    "$nstf" train --shape llama32-1b --ckpt-dir "$out/plan" --data "$out/text.txt" --device gpu --batch 16 \
        --seq 1024 --recompute $r --plan || true
done
"$nstf" train --shape smollm2-135m --data "$out/text.txt" --device gpu --steps 5 --batch 16 --seq 1024 \
    --ckpt-dir "$out/speed" --log "$out/speed.jsonl" -q
echo "SmolLM2-135M shape, B16 x T1024:"
tail -n 1 "$out/speed.jsonl"
echo "train_check: passed"
