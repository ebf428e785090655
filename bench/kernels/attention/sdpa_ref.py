"""sdpa_ref.py - PyTorch scaled_dot_product_attention (flash and cuDNN backends) on the
shapes of bench_attention.cu, for the side-by-side table. Run on the same
card in the same session: python3 sdpa_ref.py"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn, reps=20, warm=5):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    H, HKV = 32, 8
    dev = "cuda"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    print("| kernel | head_dim | tokens / ctx | SDPA flash | metric | note |\n|---|---|---|---|---|---|")
    for D in (64, 128):
        for T in (512, 1024, 2048, 4096, 8192, 16384):
            q = torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16)
            ke, ve = k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1)
            for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                note = "enable_gqa"
                fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                try:
                    with sdpa_kernel(be):
                        fn()
                except Exception:
                    fn = lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True)
                    note = "kv expanded"
                try:
                    with sdpa_kernel(be):
                        ms = bench(fn)
                except Exception as e:
                    print(f"| prefill {name} | {D} | {T} | - | - | {type(e).__name__} |")
                    continue
                fl = 4.0 * D * H * T * (T + 1) / 2
                print(f"| prefill {name} | {D} | {T} | {ms*1e3:.1f} us | {fl/ms/1e9:.1f} TFLOP/s | {note} |")
        for T in (2048, 4096, 8192):
            q = torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
            v = torch.randn(1, HKV, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
            g = torch.randn(1, H, T, D, device=dev, dtype=torch.bfloat16)
            for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(be):
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                        fn = lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)
                        ms = bench(fn)
                except Exception as e:
                    print(f"| backward {name} | {D} | {T} | - | - | {type(e).__name__} |")
                    continue
                fl = 2.5 * 4.0 * D * H * T * (T + 1) / 2
                print(f"| backward {name} | {D} | {T} | {ms*1e3:.1f} us | {fl/ms/1e9:.1f} TFLOP/s | enable_gqa |")
        for ctx in (1024, 4096, 8192):
            q = torch.randn(1, H, 1, D, device=dev, dtype=torch.bfloat16)
            k = torch.randn(1, HKV, ctx, D, device=dev, dtype=torch.bfloat16)
            v = torch.randn(1, HKV, ctx, D, device=dev, dtype=torch.bfloat16)
            note = "enable_gqa"
            try:
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            except Exception:
                ke, ve = k.repeat_interleave(H // HKV, 1), v.repeat_interleave(H // HKV, 1)
                fn = lambda: F.scaled_dot_product_attention(q, ke, ve)
                note = "kv expanded"
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms = bench(fn)
            by = 2.0 * ctx * HKV * D * 2
            print(f"| decode | {D} | {ctx} | {ms*1e3:.1f} us | {by/ms/1e6:.0f} GB/s (KV) | {note} |")


if __name__ == "__main__":
    main()
