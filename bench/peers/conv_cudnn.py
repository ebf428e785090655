"""conv_cudnn.py — the cuDNN peer of `nstf bench conv`: the same conv2d
layers through PyTorch (F.conv2d on CUDA tensors, bf16 in and out, cuDNN
with torch.backends.cudnn.benchmark on, so cuDNN picks its fastest
algorithm for each shape), timed as ours: CUDA events around --reps
back-to-back calls after the warm-up, ms per call.

    nstf bench conv --list -o json [--batch N] > layers.json
    python3 conv_cudnn.py --layers layers.json --layout nhwc --json peer.json
    nstf bench conv --peer peer.json

nhwc is channels_last in PyTorch (x and w), nchw contiguous. The JSON:
{"peer": "cuDNN <version> (PyTorch <version>)", "layers": [{"name",
"layout", "out", "batch", "ms", "tflops"}, ...]}, what `nstf bench conv
--peer` reads. Exits 77 without torch or a GPU."""

import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", required=True, help="nstf bench conv --list -o json output")
    ap.add_argument("--layout", default="nhwc", choices=["nhwc", "nchw", "both"])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls first (cuDNN's algorithm search)")
    ap.add_argument("--json", required=True, help="where to write the figures")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("conv_cudnn.py: no torch module, skipped")
        return 77
    if not torch.cuda.is_available():
        print("conv_cudnn.py: torch sees no GPU, skipped")
        return 77
    torch.backends.cudnn.benchmark = True
    with open(a.layers) as f:
        layers = json.load(f)
    dev = torch.device("cuda")
    out = []
    for layout in (["nhwc", "nchw"] if a.layout == "both" else [a.layout]):
        mf = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        for L in layers:
            n, c, h, w, k, r, s = (L[x] for x in ("n", "c", "h", "w", "k", "r", "s"))
            g = L.get("groups", 1)
            x = torch.randn(n, c, h, w, device=dev).to(torch.bfloat16).contiguous(memory_format=mf)
            wt = (torch.randn(k, c // g, r, s, device=dev) * (c // g * r * s) ** -0.5).to(torch.bfloat16)
            wt = wt.contiguous(memory_format=mf)

            def call():
                return F.conv2d(x, wt, None, L["stride"], L["pad"], L.get("dil", 1), g)

            with torch.no_grad():
                for _ in range(max(a.warmup, 1)):
                    call()
                t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                t0.record()
                for _ in range(a.reps):
                    y = call()
                t1.record()
                torch.cuda.synchronize()
            ms = t0.elapsed_time(t1) / a.reps
            p, q = y.shape[2], y.shape[3]
            flops = 2.0 * n * k * p * q * (c // g) * r * s
            out.append({"name": L["name"], "layout": layout, "out": "bf16", "batch": n, "ms": ms,
                        "tflops": flops / (ms * 1e-3) / 1e12})
            print(f"{L['name']:12s} {layout} batch {n}: {ms:.4f} ms, {out[-1]['tflops']:.2f} TFLOP/s")
    peer = f"cuDNN {torch.backends.cudnn.version()} (PyTorch {torch.__version__})"
    with open(a.json, "w") as f:
        json.dump({"peer": peer, "layers": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
