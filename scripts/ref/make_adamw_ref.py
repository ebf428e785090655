#!/usr/bin/env python3
"""make_adamw_ref.py — reference AdamW steps from torch.optim.AdamW.

Four optimizer steps on two parameter tensors (a 3x5 matrix with weight
decay, a 7-vector without, as for norm weights), each step:
gradient clipping by global norm (torch.nn.utils.clip_grad_norm_), the
learning rate of a cosine schedule with linear warm-up (the formula of
nstf_lr_cosine, written again here), then AdamW.step(). The test
(tests/test_backward_cpu.c) runs nstf_cpu_grad_norm, nstf_clip_scale,
nstf_lr_cosine and nstf_cpu_adamw on the same numbers and compares.

Inputs are seeded numpy draws rounded to float32; every value is written
with 9 significant digits, which gives the float32 back exactly.

Text format, one record per line:
  # comment
  key count v1 v2 ...
keys: hparams (lr_max lr_min warmup total beta1 beta2 eps weight_decay
max_norm), w0.{mat,vec}, then per step s (1-based): grad.s.{mat,vec},
lr.s, norm.s, w.s.{mat,vec}, m.s.{mat,vec}, v.s.{mat,vec}.

usage: python3 make_adamw_ref.py OUT.txt
"""
import math
import sys

import numpy as np
import torch

LR_MAX, LR_MIN, WARMUP, TOTAL = 1e-2, 1e-3, 2, 5
BETA1, BETA2, EPS, WD, MAX_NORM = 0.9, 0.95, 1e-8, 0.1, 1.0
N_STEPS = 4
# gradient scale per step: step 2 stays under max_norm, the others are clipped
GRAD_SCALE = [3.0, 0.1, 2.0, 0.5]


def lr_cosine(step):  # nstf_lr_cosine, step from 0
    if step < WARMUP:
        return LR_MAX * (step + 1) / WARMUP
    if step >= TOTAL:
        return LR_MIN
    r = (step - WARMUP) / (TOTAL - WARMUP)
    return LR_MIN + (LR_MAX - LR_MIN) * 0.5 * (1.0 + math.cos(math.pi * r))


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(20240611)
    mat = torch.tensor(rng.standard_normal((3, 5)).astype(np.float32))
    vec = torch.tensor((1.0 + 0.1 * rng.standard_normal(7)).astype(np.float32))
    pm, pv = torch.nn.Parameter(mat.clone()), torch.nn.Parameter(vec.clone())
    opt = torch.optim.AdamW(
        [{"params": [pm], "weight_decay": WD}, {"params": [pv], "weight_decay": 0.0}],
        lr=LR_MAX, betas=(BETA1, BETA2), eps=EPS, foreach=False, fused=False)
    lines = [
        "# torch.optim.AdamW reference, written by scripts/ref/make_adamw_ref.py",
        f"# torch {torch.__version__}, numpy {np.__version__}",
    ]

    def put(key, t):
        vals = t.detach().reshape(-1).tolist() if torch.is_tensor(t) else list(t)
        lines.append(f"{key} {len(vals)} " + " ".join(f"{v:.9g}" for v in vals))

    put("hparams", [LR_MAX, LR_MIN, WARMUP, TOTAL, BETA1, BETA2, EPS, WD, MAX_NORM])
    put("w0.mat", pm)
    put("w0.vec", pv)
    for s in range(1, N_STEPS + 1):
        gm = torch.tensor((GRAD_SCALE[s - 1] * rng.standard_normal((3, 5))).astype(np.float32))
        gv = torch.tensor((GRAD_SCALE[s - 1] * rng.standard_normal(7)).astype(np.float32))
        put(f"grad.{s}.mat", gm)
        put(f"grad.{s}.vec", gv)
        pm.grad, pv.grad = gm.clone(), gv.clone()
        norm = torch.nn.utils.clip_grad_norm_([pm, pv], MAX_NORM, error_if_nonfinite=True)
        lr = lr_cosine(s - 1)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        put(f"lr.{s}", [lr])
        put(f"norm.{s}", [float(norm)])
        put(f"w.{s}.mat", pm)
        put(f"w.{s}.vec", pv)
        for name, p in (("mat", pm), ("vec", pv)):
            st = opt.state[p]
            put(f"m.{s}.{name}", st["exp_avg"])
            put(f"v.{s}.{name}", st["exp_avg_sq"])
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
