#!/usr/bin/env python3
"""make_dequant_ref.py — reference (de)quantization data from gguf-py.

gguf-py (the PyPI package `gguf`, numpy (de)quantizers maintained with
ggml) is the independent implementation: tests/test_dtype.c checks that
nstf_dequantize_row gives gguf-py's floats bit for bit for every tensor type,
and that nstf_quantize_row gives gguf-py's bytes bit for bit for every type
gguf-py can quantize.

Dequantization blocks per type: random bytes (fp16 scale fields drawn from
finite halves only, so no NaN/Inf reaches the output) and adversarial
blocks: all-zero, all-0xFF codes, the largest and smallest (subnormal)
normal fp16 scales of both signs, a zero scale with non-zero codes, and
every code at its minimum and maximum. Quantization inputs: Gaussian rows
at several magnitudes plus all-zero, constant, exact-tie (x * id lands on
k + 0.5), huge (1e5) and tiny (1e-30) blocks.

Binary layout of OUT (little-endian):
  char[8]  "NSTFDQ01"
  u32      n_version_bytes, char[...] gguf-py version
  u32      n_sections
  per section:
    u32 type_id (ggml type), u32 kind (0 = dequantize, 1 = quantize)
    u32 n_elems, u32 n_bytes
    kind 0: u8 data[n_bytes], f32 out[n_elems]   (gguf-py dequantize(data))
    kind 1: f32 in[n_elems], u8 data[n_bytes]    (gguf-py quantize(in))

usage: python3 scripts/ref/make_dequant_ref.py tests/data/dequant_ref.bin
Made with gguf 0.19.0 and numpy 2.4 (the version is also stored in the file).
"""
import struct
import sys
from importlib.metadata import version

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

rng = np.random.default_rng(20240611)

# byte offsets of the fp16 scale fields inside one block, per type
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0],
}
DEQUANT_TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q2_K, T.Q3_K, T.Q4_K,
                 T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS]
QUANT_TYPES = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.BF16]


def finite_halves(n):
    h = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bad = (h & 0x7C00) == 0x7C00
    h[bad] &= 0xBFFF  # clear the top exponent bit: finite
    return h


def set_half(block, off, value_bits):
    block[off:off + 2] = np.frombuffer(struct.pack("<H", value_bits), dtype=np.uint8)


def dequant_blocks(t):
    bsize, tsize = GGML_QUANT_SIZES[t]
    fields = FP16_FIELDS[t]
    blocks = []
    for _ in range(24):  # random
        b = rng.integers(0, 256, size=tsize, dtype=np.uint8)
        for off in fields:
            set_half(b, off, int(finite_halves(1)[0]))
        blocks.append(b)
    specials = [0x7BFF, 0xFBFF, 0x0400, 0x8400, 0x0001, 0x8001, 0x3C00, 0x0000]
    for code in (0x00, 0xFF, 0x55, 0xAA):
        for s in specials:
            b = np.full(tsize, code, dtype=np.uint8)
            for off in fields:
                set_half(b, off, s)
            blocks.append(b)
    # random codes with each extreme scale, and mixed-sign scale pairs
    for s in specials[:6]:
        b = rng.integers(0, 256, size=tsize, dtype=np.uint8)
        for i, off in enumerate(fields):
            set_half(b, off, s ^ (0x8000 if i else 0))
        blocks.append(b)
    data = np.concatenate(blocks)
    out = quants.dequantize(data, t).astype(np.float32).reshape(-1)
    assert np.isfinite(out).all(), t.name
    return data, out


def quant_inputs(bsize):
    rows = []
    for scale in (1.0, 0.02, 300.0):
        rows.append((rng.standard_normal(bsize * 16) * scale).astype(np.float32))
    rows.append(np.zeros(bsize, np.float32))
    rows.append(np.full(bsize, 0.75, np.float32))
    rows.append(np.full(bsize, -3.0, np.float32))
    ties = np.arange(bsize, dtype=np.float32) - bsize / 2  # integers and halves against id
    rows.append(ties * 0.5)
    rows.append((rng.standard_normal(bsize) * 1e5).astype(np.float32))
    rows.append((rng.standard_normal(bsize) * 1e-30).astype(np.float32))
    x = rng.standard_normal(bsize).astype(np.float32)
    x[3] = 40.0  # one outlier
    rows.append(x)
    return np.concatenate(rows)


def write_sections(out_path, ver, sections):
    """The file of the layout above; sections: (type_id, kind, n_elems, a, b)
    with a, b the section's two arrays as bytes, in file order."""
    with open(out_path, "wb") as fo:
        fo.write(b"NSTFDQ01")
        fo.write(struct.pack("<I", len(ver)))
        fo.write(ver)
        fo.write(struct.pack("<I", len(sections)))
        for tid, kind, n, a, b in sections:
            fo.write(struct.pack("<IIII", tid, kind, n, len(b) if kind else len(a)))
            fo.write(a)
            fo.write(b)


def main():
    out_path = sys.argv[1]
    sections = []
    for t in DEQUANT_TYPES:
        data, out = dequant_blocks(t)
        sections.append((int(t), 0, out.size, data.tobytes(), out.tobytes()))
    # F16 and BF16 dequantization: spread over every exponent, plus specials
    h = np.arange(0, 1 << 16, 7, dtype=np.uint32).astype(np.uint16)
    h = h[(h & 0x7C00) != 0x7C00]
    h = np.concatenate([h, np.array([0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF], np.uint16)])
    f = quants.dequantize(h.view(np.uint8), T.F16).astype(np.float32)
    sections.append((int(T.F16), 0, f.size, h.tobytes(), f.tobytes()))
    bf = finite_halves(4096)  # as bf16 bit patterns: finite exponents only for bf16 too
    bf = bf[(bf & 0x7F80) != 0x7F80]
    fb = quants.dequantize(bf.view(np.uint8), T.BF16).astype(np.float32)
    sections.append((int(T.BF16), 0, fb.size, bf.tobytes(), fb.tobytes()))
    for t in QUANT_TYPES:
        bsize = GGML_QUANT_SIZES[t][0]
        x = quant_inputs(max(bsize, 32))
        q = quants.quantize(x.reshape(1, -1), t).reshape(-1)
        q = q.view(np.uint8)
        sections.append((int(t), 1, x.size, x.tobytes(), q.tobytes()))
    x = quant_inputs(32)
    with np.errstate(over="ignore"):
        q = x.astype(np.float16)
    sections.append((int(T.F16), 1, x.size, x.tobytes(), q.tobytes()))

    ver = ("gguf " + version("gguf") + ", numpy " + np.__version__).encode()
    write_sections(out_path, ver, sections)
    print(f"{out_path}: {len(sections)} sections ({ver.decode()})")


if __name__ == "__main__":
    main()
