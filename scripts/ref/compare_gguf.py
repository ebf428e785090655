#!/usr/bin/env python3
"""compare_gguf.py — tensor by tensor comparison of two GGUF files.

Used to hold `nstf quantize` against llama.cpp's llama-quantize on the same
input: per tensor, whether the types agree, whether the bytes are identical,
and (when not) how far the dequantized values are apart relative to the
tensor's RMS. Also prints each file's size. Needs the PyPI package `gguf`.

usage: python3 scripts/ref/compare_gguf.py A.gguf B.gguf [--ref F16.gguf]
  --ref: the unquantized input; then each side's error against it is shown
         (RMS of the difference / RMS of the reference), summed over tensors.
"""
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def tensors(path):
    r = GGUFReader(path)
    return {t.name: t for t in r.tensors}


def deq(t):
    return dequantize(np.asarray(t.data), t.tensor_type).astype(np.float64).reshape(-1)


def main():
    args = sys.argv[1:]
    ref = None
    if "--ref" in args:
        i = args.index("--ref")
        ref = tensors(args[i + 1])
        del args[i:i + 2]
    a_path, b_path = args
    a, b = tensors(a_path), tensors(b_path)
    print(f"{a_path}: {os.path.getsize(a_path)} bytes")
    print(f"{b_path}: {os.path.getsize(b_path)} bytes")
    same_type = same_bytes = 0
    err_a = err_b = den = 0.0
    by_type = {}
    for name in a:
        ta, tb = a[name], b.get(name)
        if tb is None:
            print(f"  {name}: missing in B")
            continue
        if ta.tensor_type != tb.tensor_type:
            print(f"  {name}: type {ta.tensor_type.name} vs {tb.tensor_type.name}")
            continue
        same_type += 1
        identical = np.array_equal(np.asarray(ta.data).view(np.uint8), np.asarray(tb.data).view(np.uint8))
        same_bytes += identical
        k = by_type.setdefault(ta.tensor_type.name, [0, 0])
        k[0] += 1
        k[1] += identical
        if not identical:
            da, db = deq(ta), deq(tb)
            rms = np.sqrt(np.mean(da * da)) or 1.0
            diff = np.sqrt(np.mean((da - db) ** 2)) / rms
            print(f"  {name} ({ta.tensor_type.name}): bytes differ, RMS(A-B)/RMS(A) = {diff:.3g}")
        if ref is not None and name in ref:
            r = deq(ref[name])
            da, db = deq(ta), deq(tb)
            err_a += np.sum((da - r) ** 2)
            err_b += np.sum((db - r) ** 2)
            den += np.sum(r * r)
    print(f"{same_type}/{len(a)} tensors of the same type, {same_bytes} byte-identical")
    for t, (n, ident) in sorted(by_type.items()):
        print(f"  {t}: {ident}/{n} identical")
    if ref is not None and den > 0:
        print(f"NMSE against the reference: A {err_a / den:.4g}, B {err_b / den:.4g}")


if __name__ == "__main__":
    main()
