#!/usr/bin/env python3
"""make_imatrix_quant_ref.py — reference importance-weighted quantization
from ggml itself.

ggml_quantize_chunk with an importance matrix (one weight per column: it
runs quantize_row_*_impl with quant_weights) on Q4_0, Q4_1, Q5_0, Q5_1,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, called through ctypes from the libggml-base
that scripts/build_llama_cpp.sh builds (llama.cpp as vendored by the pinned
llama-cpp-python sdist). tests/test_dtype.c checks that
nstf_quantize_row_w gives ggml's bytes bit for bit.

Inputs per type: 4 rows of 512 Gaussian values at three magnitudes (1, 0.02,
300) and one row with an outlier; weights: positive, log-normal per column
(spread like real mean squared activations), one set per type.

Layout (little-endian): "NSTFIM01", u32 version-string length, the string,
u32 section count; per section u32 ggml type, u32 values per row, u32 rows,
u32 bytes of the quantized rows, then f32 x [rows * per_row], f32 weights
[per_row], the quantized bytes.

usage: python3 scripts/ref/make_imatrix_quant_ref.py LIBGGML_BASE_SO tests/data/imatrix_quant_ref.bin
  LIBGGML_BASE_SO: third_party/llama.cpp-<ver>/build-cpu/bin/libggml-base.so
Made with llama-cpp-python 0.3.36's llama.cpp (ggml 0.25.3), gguf 0.19.0
and numpy 2.4 (the versions are also stored in the file).
"""
import struct
import sys
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from make_kquant_ref import ggml_quantizer

rng = np.random.default_rng(20261127)
TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]
PER_ROW = 512


def inputs():
    rows = [(rng.standard_normal(PER_ROW) * s).astype(np.float32) for s in (1.0, 0.02, 300.0)]
    x = rng.standard_normal(PER_ROW).astype(np.float32)
    x[37] = 25.0
    rows.append(x)
    return np.concatenate(rows)


def section(quantize, t):
    x = inputs()
    w = np.exp(rng.standard_normal(PER_ROW) * 1.5).astype(np.float32)
    q = quantize(t, x, PER_ROW, w)
    return struct.pack("<4I", int(t), PER_ROW, x.size // PER_ROW, q.size) + x.tobytes() + w.tobytes() + q.tobytes()


def main():
    quantize = ggml_quantizer(sys.argv[1])
    out_path = sys.argv[2]
    sections = [section(quantize, t) for t in TYPES]
    ver = ("ggml of llama-cpp-python 0.3.36, gguf " + version("gguf") + ", numpy " + np.__version__).encode()
    with open(out_path, "wb") as f:
        f.write(b"NSTFIM01" + struct.pack("<I", len(ver)) + ver + struct.pack("<I", len(sections)))
        for s in sections:
            f.write(s)
    print(f"{out_path}: {len(sections)} sections ({ver.decode()})")


if __name__ == "__main__":
    main()
