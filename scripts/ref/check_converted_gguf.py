#!/usr/bin/env python3
"""check_converted_gguf.py — an independent check of `nstf convert`.

Loads the HF folder and the GGUF file that `nstf convert` wrote from it in
HF transformers (whose GGUF loader undoes llama.cpp's Q/K permutation and
reads llama.cpp's tokenizer.ggml.* keys) and in gguf-py, and compares:
  - the GGUF parses with gguf-py (the reference reader of the format);
  - token ids of a few strings: the folder's tokenizer vs the GGUF's;
  - fp32 logits of a prompt: the folder's model vs the GGUF's.
Exit status 0 when the ids are equal and the logits agree to max |diff|
<= 1e-4 (an F32 or as-stored conversion gives 0), 1 otherwise.

usage: python3 check_converted_gguf.py HF_FOLDER FILE.gguf
needs: torch, transformers, accelerate, gguf
"""
import importlib.metadata
import os
import sys

import gguf
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

STRINGS = [
    "The history of computing is a story of abstraction.",
    "12 kernels, 3.5 ms; don't panic. Le café 東京 🙂",
    "<|im_start|>user\nHi<|im_end|>",
]


def main():
    folder, path = sys.argv[1], sys.argv[2]
    d, f = os.path.split(os.path.abspath(path))
    r = gguf.GGUFReader(path)
    print(f"gguf-py {importlib.metadata.version('gguf')}: {len(r.tensors)} tensors, "
          f"{len(r.fields)} fields; transformers {transformers.__version__}, torch {torch.__version__}")
    ok = True
    htok = AutoTokenizer.from_pretrained(folder)
    gtok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    for s in STRINGS:
        a, b = htok(s)["input_ids"], gtok(s)["input_ids"]
        print(f"ids {'equal' if a == b else 'DIFFER'}: {s!r}")
        ok &= a == b
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    gm = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    ids = torch.tensor([htok(STRINGS[0])["input_ids"]])
    with torch.no_grad():
        diff = (hf(ids).logits - gm(ids).logits).abs().max().item()
    print(f"logits max |diff| {diff:.3g} over {ids.shape[1]} positions")
    ok &= diff <= 1e-4
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
