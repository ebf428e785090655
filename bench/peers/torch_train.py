"""torch_train.py — the PyTorch / HF transformers peer of `nstf train`'s
step: LlamaForCausalLM at a named shape with random weights (fp32 master
weights, bf16 autocast, fused AdamW), batches of random tokens, on the GPU.
Times --steps optimizer steps after --warmup untimed ones (CUDA synchronized
around the timed ones) and prints one line per variant:

  torch_train: SHAPE BxT VARIANT: T tokens/s, S ms/step, MFU M% (peak P TFLOP/s)

MFU counts the FLOPs `nstf train` counts (nstf_train_flops_per_token in
src/model/train.c): 6 per weight of the layer matrices and the logits, plus
the causal attention's 6 L T H D per token, over the dense bf16 peak of the
device (--peak, default by name: 989.4 TFLOP/s for an H100/H200).

Variants: eager (the model as transformers builds it, SDPA attention) and,
with --compile, torch.compile of the same model (the first steps compile;
they are among the untimed ones).

Usage: python3 torch_train.py [--shape smollm2-135m] [--batch 4] [--seq 512]
       [--steps 10] [--warmup 3] [--compile] [--peak TFLOPS]
"""
import argparse
import sys
import time

SHAPES = {  # layers, dim, heads, kv heads, ffn, vocab, rope base, tied (tools/cmd_gen_model.c)
    "tiny": (2, 128, 2, 1, 256, 512, 10000.0, False),
    "smollm2-135m": (30, 576, 9, 3, 1536, 49152, 100000.0, True),
    "llama32-1b": (16, 2048, 32, 8, 8192, 128256, 500000.0, True),
}
PEAKS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}


def flops_per_token(shape, seq):
    n_layers, dim, heads, kv, ffn, vocab, _, _ = SHAPES[shape]
    hd = dim // heads
    per_layer = dim * heads * hd + 2 * dim * kv * hd + heads * hd * dim + 3 * dim * ffn
    p = per_layer * n_layers + vocab * dim
    return 6.0 * p + 6.0 * n_layers * seq * heads * hd


def build(shape):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    n_layers, dim, heads, kv, ffn, vocab, base, tied = SHAPES[shape]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=n_layers,
                      num_attention_heads=heads, num_key_value_heads=kv, rope_theta=base,
                      tie_word_embeddings=tied, max_position_embeddings=8192, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).cuda()


def train_step(fwd, model, opt, x, y):
    """One optimizer step of model (fwd: the model or its compiled form) on
    tokens x [B, T] with targets y: the forward under bf16 autocast on x's
    device, fp32 logits, cross-entropy, backward, gradient clipping at 1.0,
    opt's step. Returns the loss (a tensor: no host sync)."""
    import torch

    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        logits = fwd(input_ids=x).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def run(shape, batch, seq, steps, warmup, compiled, peak):
    import torch

    model = build(shape)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compiled else model
    g = torch.Generator(device="cuda").manual_seed(1)
    vocab = SHAPES[shape][5]
    ids = torch.randint(0, vocab, (batch, seq + 1), device="cuda", generator=g)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step():
        return train_step(fwd, model, opt, x, y)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tps = batch * seq * steps / dt
    mfu = flops_per_token(shape, seq) * tps / peak if peak > 0 else float("nan")
    name = "compile" if compiled else "eager"
    print(f"torch_train: {shape} {batch}x{seq} {name}: {tps:.0f} tokens/s, {1e3 * dt / steps:.1f} ms/step, "
          f"MFU {100 * mfu:.1f}% (peak {peak / 1e12:.1f} TFLOP/s), last loss {loss.item():.3f}")
    del model, opt, fwd
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the model")
    ap.add_argument("--peak", type=float, default=0, help="dense bf16 TFLOP/s for MFU (default: by device name)")
    a = ap.parse_args()
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"torch_train: needs torch and transformers ({e})")
        return 77
    if not torch.cuda.is_available():
        print("torch_train: no CUDA device")
        return 77
    dev = torch.cuda.get_device_name()
    peak = a.peak * 1e12 if a.peak > 0 else next((v for k, v in PEAKS.items() if k in dev), 0.0)
    print(f"torch_train: {dev}, torch {torch.__version__}, transformers {transformers.__version__}")
    run(a.shape, a.batch, a.seq, a.steps, a.warmup, False, peak)
    if a.compile:
        run(a.shape, a.batch, a.seq, a.steps, a.warmup, True, peak)
    return 0


if __name__ == "__main__":
    sys.exit(main())
