#!/usr/bin/env python3
"""compare_llama_cpp_convert.py — `nstf convert` against llama.cpp's own
converter (convert_hf_to_gguf.py) on the same HF folder.

For each output type (f32, f16, bf16) both converters write a GGUF; gguf-py
then compares them: every tensor (name, type, shape, bytes: the Q/K
permutation included) and every key/value. Keys that only one side writes
and values that differ are listed; the tensors must be byte-identical.

llama.cpp's converter identifies a BPE pre-tokenizer by hashing the
tokenizer's output on a fixed text, which only works for tokenizers it was
updated for; for a tokenizer trained for a test (tests/data/hf_tiny) the
name is given with --pre (smollm for hf_tiny), patched into the converter.

usage: python3 compare_llama_cpp_convert.py LLAMA_CPP_SRC HF_FOLDER NSTF_BIN OUT_DIR [--pre NAME]
  LLAMA_CPP_SRC: a llama.cpp source tree (scripts/build_llama_cpp.sh puts
  one in third_party/); needs torch, transformers, sentencepiece, numpy.
Exit status 0 when every tensor is identical for every type.
"""
import os
import subprocess
import sys


def main():
    args = sys.argv[1:]
    pre = None
    if "--pre" in args:
        i = args.index("--pre")
        pre = args[i + 1]
        del args[i:i + 2]
    src, folder, nstf, out = args
    sys.path.insert(0, os.path.join(src, "gguf-py"))
    sys.path.insert(0, src)
    import gguf
    import convert_hf_to_gguf as conv
    if pre:
        import conversion.base as base
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    os.makedirs(out, exist_ok=True)
    ok = True
    for t in ("f32", "f16", "bf16"):
        ref, mine = os.path.join(out, f"llama_cpp_{t}.gguf"), os.path.join(out, f"nstf_{t}.gguf")
        sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", ref, "--outtype", t]
        conv.main()
        subprocess.run([nstf, "convert", folder, "-o", mine, "--type", t], check=True)
        a, b = gguf.GGUFReader(ref), gguf.GGUFReader(mine)
        ta, tb = {x.name: x for x in a.tensors}, {x.name: x for x in b.tensors}
        same = [n for n in ta if n in tb and ta[n].tensor_type == tb[n].tensor_type
                and list(ta[n].shape) == list(tb[n].shape) and bytes(ta[n].data) == bytes(tb[n].data)]
        fa = {k: f for k, f in a.fields.items() if not k.startswith("GGUF.")}
        fb = {k: f for k, f in b.fields.items() if not k.startswith("GGUF.")}
        differ = [k for k in set(fa) & set(fb) if [bytes(fa[k].parts[i]) for i in fa[k].data] !=
                  [bytes(fb[k].parts[i]) for i in fb[k].data] or fa[k].types != fb[k].types]
        print(f"{t}: tensors identical {len(same)} of {len(ta)} (nstf has {len(tb)}); "
              f"keys only llama.cpp {sorted(set(fa) - set(fb))}, only nstf {sorted(set(fb) - set(fa))}, "
              f"values differ {sorted(differ)}")
        ok &= len(same) == len(ta) == len(tb)
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
