#!/usr/bin/env python3
"""make_kquant_ref.py — reference K-quant quantization from ggml itself.

gguf-py quantizes no K-quant type (nor IQ4_NL, IQ4_XS), so the reference
quantizer is ggml's own C code: ggml_quantize_chunk (no importance matrix,
which runs quantize_row_q{2..6}_K_ref, quantize_iq4_nl and _xs), called through ctypes from the libggml-base
that scripts/build_llama_cpp.sh builds (llama.cpp as vendored by the pinned
llama-cpp-python sdist). gguf-py then dequantizes ggml's bytes, so the file
holds, per type, both directions: tests/test_dtype.c checks that
nstf_quantize_row gives ggml's bytes bit for bit and nstf_dequantize_row
gives gguf-py's floats of them bit for bit.

Inputs per type: Gaussian rows at several magnitudes, all-zero, constant,
exact-tie, huge (1e5), tiny (1e-30) and one-outlier super-blocks (the
inputs of make_dequant_ref.py's quantization sections, at 256 values).

Layout: make_dequant_ref.py's ("NSTFDQ01"); per type one kind-1 section
(f32 in, ggml's bytes) and one kind-0 section (those bytes, gguf-py's
floats).

usage: python3 scripts/ref/make_kquant_ref.py LIBGGML_BASE_SO tests/data/kquant_ref.bin
  LIBGGML_BASE_SO: third_party/llama.cpp-<ver>/build-cpu/bin/libggml-base.so
Made with llama-cpp-python 0.3.36's llama.cpp (ggml 0.25.3), gguf 0.19.0
and numpy 2.4 (the versions are also stored in the file).
"""
import ctypes
import sys
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES
from make_dequant_ref import write_sections

rng = np.random.default_rng(20261126)
TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]


def inputs():
    rows = []
    for scale in (1.0, 0.02, 300.0):
        rows.append((rng.standard_normal(256 * 16) * scale).astype(np.float32))
    rows.append(np.zeros(256, np.float32))
    rows.append(np.full(256, 0.75, np.float32))
    rows.append(np.full(256, -3.0, np.float32))
    rows.append((np.arange(256, dtype=np.float32) - 128) * 0.5)
    rows.append((rng.standard_normal(256) * 1e5).astype(np.float32))
    rows.append((rng.standard_normal(256) * 1e-30).astype(np.float32))
    x = rng.standard_normal(256).astype(np.float32)
    x[3] = 40.0
    rows.append(x)
    x = np.abs(rng.standard_normal(256)).astype(np.float32)  # all positive: min 0
    rows.append(x)
    return np.concatenate(rows)


def ggml_quantizer(so_path):
    """ggml_quantize_chunk of the library at so_path, as quantize(type, x, per_row, weights=None) -> uint8 array
    (weights: one per column, ggml's importance matrix, or None)."""
    lib = ctypes.CDLL(so_path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]

    def quantize(t, x, per_row, weights=None):
        block, tsize = GGML_QUANT_SIZES[t]
        q = np.zeros(x.size // block * tsize, np.uint8)
        n = lib.ggml_quantize_chunk(int(t), x.ctypes.data, q.ctypes.data, 0, x.size // per_row, per_row,
                                    None if weights is None else weights.ctypes.data)
        assert n == q.size, (t.name, n, q.size)
        return q
    return quantize


def main():
    quantize = ggml_quantizer(sys.argv[1])
    out_path = sys.argv[2]
    sections = []
    for t in TYPES:
        x = inputs()
        q = quantize(t, x, 256)
        y = quants.dequantize(q, t).astype(np.float32).reshape(-1)
        sections.append((int(t), 1, x.size, x.tobytes(), q.tobytes()))
        sections.append((int(t), 0, y.size, q.tobytes(), y.tobytes()))
    ver = ("ggml of llama-cpp-python 0.3.36, gguf " + version("gguf") + ", numpy " + np.__version__).encode()
    write_sections(out_path, ver, sections)
    print(f"{out_path}: {len(sections)} sections ({ver.decode()})")


if __name__ == "__main__":
    main()
