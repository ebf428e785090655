"""make_conv_ref.py — reference outputs of conv2d from PyTorch, in fp64, for
tests/test_conv_ref.c (tests/data/conv2d_ref.txt).

Ragged cases: odd sizes, stride 2, dilation 2, groups (and depthwise),
asymmetric padding and strides, a 1x1 filter, a 7x7 stem-like filter, with
and without bias. Inputs and filters are random normals rounded to bf16
(exact in bf16 and in fp32), stored in NCHW / [k][c/g][r][s]; y is
torch.nn.functional.conv2d in float64, printed with 17 significant digits.

Usage: python3 scripts/ref/make_conv_ref.py > tests/data/conv2d_ref.txt"""

import sys

import torch
import torch.nn.functional as F

# name, (n, c, h, w), (k, r, s), stride, padding, dilation, groups, bias
CASES = [
    ("basic3x3", (1, 3, 7, 9), (4, 3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ("stride2", (2, 5, 11, 10), (6, 3, 3), (2, 2), (1, 1), (1, 1), 1, True),
    ("dilation2", (1, 4, 13, 9), (3, 3, 2), (1, 1), (2, 1), (2, 2), 1, False),
    ("groups3", (2, 6, 8, 7), (9, 3, 3), (2, 1), (1, 1), (1, 2), 3, True),
    ("depthwise5x5", (1, 5, 9, 9), (5, 5, 5), (2, 2), (2, 2), (1, 1), 5, True),
    ("pointwise", (2, 8, 5, 3), (7, 1, 1), (1, 1), (0, 0), (1, 1), 1, True),
    ("stem7x7", (1, 3, 15, 13), (8, 7, 7), (2, 2), (3, 3), (1, 1), 1, False),
    ("mixed", (3, 4, 6, 11), (6, 2, 3), (1, 2), (0, 2), (2, 1), 2, True),
]


def fmt(t, digits):
    return " ".join(f"{v:.{digits}g}" for v in t.reshape(-1).tolist())


def main():
    torch.manual_seed(20240617)
    out = sys.stdout
    out.write(f"# conv2d_ref.txt — made by scripts/ref/make_conv_ref.py with torch {torch.__version__}, python "
              f"{sys.version.split()[0]}\n")
    out.write("# case NAME n c h w k r s stride_h stride_w pad_h pad_w dil_h dil_w groups has_bias\n")
    out.write("# then lines x (NCHW), w ([k][c/g][r][s]), b (when has_bias), y (NCHW, fp64)\n")
    for name, (n, c, h, w), (k, r, s), st, pad, dil, g, has_bias in CASES:
        x = torch.randn(n, c, h, w).bfloat16().double()
        wt = (torch.randn(k, c // g, r, s) / (c // g * r * s) ** 0.5).bfloat16().double()
        b = torch.randn(k).bfloat16().double() if has_bias else None
        y = F.conv2d(x, wt, b, stride=st, padding=pad, dilation=dil, groups=g)
        out.write(f"case {name} {n} {c} {h} {w} {k} {r} {s} {st[0]} {st[1]} {pad[0]} {pad[1]} {dil[0]} {dil[1]} {g} "
                  f"{int(has_bias)}\n")
        out.write("x " + fmt(x, 9) + "\n")
        out.write("w " + fmt(wt, 9) + "\n")
        if has_bias:
            out.write("b " + fmt(b, 9) + "\n")
        out.write("y " + fmt(y, 17) + "\n")


if __name__ == "__main__":
    main()
