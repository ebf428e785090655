#!/usr/bin/env python3
"""make_logits_ref.py — reference logits and greedy generations for SmolLM2.

An independent implementation for the end-to-end test: HF transformers
loads the same GGUF (dequantizing its Q4_1/Q8_0 weights to fp32 with the
`gguf` package) and runs the model in fp32 on the CPU.

Writes into OUTDIR:
  smollm2_logits_ref.bin           teacher-forced logits over a fixed prose
                                   text (>= 256 tokens)
  smollm2_logits_ref_code.bin      the same over a C snippet (>= 128 tokens)
  smollm2_logits_ref_dialogue.bin  the same over a dialogue (>= 128 tokens)
  smollm2_greedy_ref.txt           64 greedy tokens after each of three
                                   prompts; its header holds the versions
                                   and each logits file's sha256
The code and dialogue texts were written for this project's tests.

Binary layout of each smollm2_logits_ref*.bin (little-endian):
  char[8]  "NSTFREF1"
  int32    n_tok, n_vocab, n_full
  int32    ids[n_tok]          the token ids fed to the model
  int32    argmax[n_tok]       reference top-1 next token at every position
  float32  top1[n_tok]         its logit
  float32  lse[n_tok]          log-sum-exp of the logits at every position
  int32    full_pos[n_full]    positions whose whole logit row follows
  float32  logits[n_full][n_vocab]

usage: python3 make_logits_ref.py MODEL.gguf OUTDIR
"""
import hashlib
import os
import struct
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

TEXT = (
    "The history of computing is a story of abstraction. Early machines were programmed by "
    "rewiring panels of cables, and every new problem meant a new arrangement of hardware. "
    "The stored-program computer changed that: instructions became data, held in the same "
    "memory as the numbers they worked on. Assembly languages gave names to operations, and "
    "compilers let programmers write formulas instead of register transfers. In 1972 the C "
    "language appeared at Bell Labs, designed to write an operating system that could move "
    "from one machine to another. Its model of memory, a flat array of bytes addressed by "
    "pointers, matched the hardware closely enough to be fast and loosely enough to be "
    "portable. Decades later, graphics processors brought thousands of simple cores to a "
    "single chip. To use them, programmers learned to think in terms of grids of threads, "
    "shared memory tiles and warps that execute in lockstep. Matrix multiplication, the "
    "heart of neural networks, maps well onto this model: each block of threads computes a "
    "tile of the output, loading slices of the inputs into fast on-chip memory and reusing "
    "them many times. Today's accelerators add dedicated matrix units that multiply small "
    "tiles in a single instruction. Writing code that keeps those units busy requires care "
    "with data layout, memory bandwidth and the order of operations. The same ideas appear "
    "again and again: move data as little as possible, reuse what you have loaded, and keep "
    "every unit of the machine doing useful work. Here is a short table of results: 12 "
    "kernels, 3.5 milliseconds, 98.7 percent accuracy, and 1024 tokens per second.\n"
)

CODE = (
    "/* ring.c: a fixed-size ring buffer of bytes. */\n"
    "#include <stddef.h>\n"
    "#include <string.h>\n"
    "\n"
    "typedef struct {\n"
    "    unsigned char *data;\n"
    "    size_t cap, head, len;\n"
    "} ring;\n"
    "\n"
    "/* Appends up to n bytes; returns how many fit. */\n"
    "size_t ring_push(ring *r, const void *src, size_t n) {\n"
    "    const unsigned char *p = src;\n"
    "    size_t k = 0;\n"
    "    while (k < n && r->len < r->cap) {\n"
    "        r->data[(r->head + r->len) % r->cap] = p[k++];\n"
    "        r->len++;\n"
    "    }\n"
    "    return k;\n"
    "}\n"
    "\n"
    "/* Removes up to n bytes into dst; returns how many were read. */\n"
    "size_t ring_pop(ring *r, void *dst, size_t n) {\n"
    "    unsigned char *p = dst;\n"
    "    size_t k = 0;\n"
    "    for (; k < n && r->len > 0; k++, r->len--) {\n"
    "        p[k] = r->data[r->head];\n"
    "        r->head = (r->head + 1) % r->cap;\n"
    "    }\n"
    "    return k;\n"
    "}\n"
)

DIALOGUE = (
    "Mara: Did you water the tomatoes this morning?\n"
    "Jonas: I did, but the leaves on the left row are turning yellow again.\n"
    "Mara: Too much water, probably. The soil there never dries out after rain.\n"
    "Jonas: Should we move them next spring, closer to the fence?\n"
    "Mara: The fence gets the afternoon sun, so yes. We could plant beans where they are now.\n"
    "Jonas: Beans like wet feet even less. What about mint? It grows anywhere.\n"
    "Mara: It grows everywhere, that is the trouble. Last year it took over half the herb bed.\n"
    "Jonas: Then a pot. A big clay pot by the shed, and the tomatoes by the fence.\n"
    "Mara: Fine. Write it in the notebook before we forget, with the date.\n"
    "Jonas: Done. Tuesday, second of May: tomatoes to the fence, mint in a pot, no beans.\n"
)

# (name, file, text, minimum length in tokens)
TEXTS = [
    ("prose", "smollm2_logits_ref.bin", TEXT, 256),
    ("code", "smollm2_logits_ref_code.bin", CODE, 128),
    ("dialogue", "smollm2_logits_ref_dialogue.bin", DIALOGUE, 128),
]

PROMPTS = [
    ("plain", "The capital of France is"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("chat", None),  # chat-templated user turn, below
]
CHAT_USER = "Explain in two sentences why the sky is blue."
N_GEN = 64
FULL_EVERY = 17  # whole logit rows stored every FULL_EVERY positions


def write_logits(model, ids, min_len, path):
    """Teacher-forced logits over ids, summarised into path (layout above)."""
    assert len(ids) >= min_len, (path, len(ids))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    n, v = logits.shape
    argmax = logits.argmax(-1).to(torch.int32).numpy()
    top1 = logits.max(-1).values.float().numpy()
    lse = torch.logsumexp(logits, -1).float().numpy()
    full_pos = np.arange(0, n, FULL_EVERY, dtype=np.int32)
    with open(path, "wb") as fo:
        fo.write(b"NSTFREF1")
        fo.write(struct.pack("<iii", n, v, len(full_pos)))
        fo.write(np.asarray(ids, dtype="<i4").tobytes())
        fo.write(argmax.astype("<i4").tobytes())
        fo.write(top1.astype("<f4").tobytes())
        fo.write(lse.astype("<f4").tobytes())
        fo.write(full_pos.astype("<i4").tobytes())
        fo.write(logits[full_pos].float().numpy().astype("<f4").tobytes())
    return n, v


def main():
    model_path, outdir = sys.argv[1], sys.argv[2]
    d, f = os.path.split(os.path.abspath(model_path))
    sha = hashlib.sha256(open(model_path, "rb").read()).hexdigest()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()

    sums = []
    for name, fname, text, min_len in TEXTS:
        path = os.path.join(outdir, fname)
        n, v = write_logits(model, tok(text, add_special_tokens=False)["input_ids"], min_len, path)
        sums.append(f"# logits {fname}: {name} text, {n} tokens, sha256 {hashlib.sha256(open(path, 'rb').read()).hexdigest()}")
        print(f"{fname}: {n} tokens, vocab {v}")

    lines = [
        "# greedy generations of SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to fp32) by HF transformers",
        f"# model sha256 {sha}",
        f"# torch {torch.__version__}, transformers {transformers.__version__}, made by scripts/ref/make_logits_ref.py",
        f"# each case: name, prompt ids, then {N_GEN} greedy ids (end-of-generation tokens not special-cased)",
    ] + sums
    for name, text in PROMPTS:
        if text is None:
            text = tok.apply_chat_template([{"role": "user", "content": CHAT_USER}], tokenize=False,
                                           add_generation_prompt=True)
        p = tok(text, add_special_tokens=False)["input_ids"]
        seq = list(p)
        with torch.no_grad():
            out = model(torch.tensor([seq]), use_cache=True)
            past = out.past_key_values
            for _ in range(N_GEN):
                nxt = int(out.logits[0, -1].argmax())
                seq.append(nxt)
                out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
        lines.append(f"case {name}")
        lines.append("prompt " + " ".join(map(str, p)))
        lines.append("greedy " + " ".join(map(str, seq[len(p):])))
        print(name, repr(tok.decode(seq[len(p):])))
    with open(os.path.join(outdir, "smollm2_greedy_ref.txt"), "w") as fo:
        fo.write("\n".join(lines) + "\n")
    print(f"wrote {outdir}")


if __name__ == "__main__":
    main()
