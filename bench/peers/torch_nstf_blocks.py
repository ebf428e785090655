"""torch_nstf_blocks.py — HF transformers' LlamaForCausalLM with NSTF's
blocks as PyTorch ops (nstf.hf.patch_llama: attention and MLP on
torch.ops.nstf, the attention's backward NSTF's kernel) against the stock
model (transformers' own modules, its default attention), in the same
process on the same weights, on the GPU:

  train   one training step: forward, loss (fp32 logits, cross-entropy),
          backward, gradient clipping and AdamW (fused on CUDA), fp32 master
          weights under bf16 autocast, a --batch x --seq batch of random
          tokens; tokens/s over --steps timed steps after --warmup untimed
          ones, as bench/peers/torch_train.py times the stock model. Each
          variant starts from the same initial weights and batch; its first
          loss is printed beside the other's (they differ by bf16 rounding
          only).
  decode  eager greedy decoding with the model in bf16 and a dynamic KV
          cache: a --prompt-token prefill, untimed warm-up steps, then --gen
          timed steps of one token (last-row logits, argmax read back to the
          host); median ms/token, tokens/s.

The shape is a named one (torch_train.py's table; llama32-1b: Llama-3.2-1B's
layers, widths, heads and vocabulary) with random weights from a config:
nothing is downloaded. Its RoPE is the plain one (rope_theta, no llama3
frequency scaling), which nstf::rope runs. One line per measurement and a
last line with the speed-ups:

  torch_nstf_blocks: train BxT stock|nstf: T tokens/s, S ms/step, first loss L
  torch_nstf_blocks: decode at context P+1..P+G stock|nstf: M ms/token, T tokens/s
  torch_nstf_blocks: speed-up nstf/stock: train X.XXx, decode Y.YYx

--json FILE writes the figures. --device cpu runs the same steps on the
ops' CPU reference path (a smoke run of the script at --shape tiny; its
times mean nothing). Exits 77 without torch and transformers, or without a
GPU for --device cuda; 1 when the nstf library has no GPU backend.

Usage: python3 torch_nstf_blocks.py [--shape llama32-1b] [--batch 4]
       [--seq 512] [--steps 10] [--warmup 3] [--prompt 512] [--gen 64]
       [--norms] [--device cuda] [--json FILE]
(PYTHONPATH=BUILD_DIR/python: the nstf package of a GPU build.)"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_decode import last_logits_fn  # noqa: E402
from torch_train import SHAPES, train_step  # noqa: E402

WARM_STEPS = 4  # untimed decode steps before the timed ones (torch_decode.py's)


def build(shape, seq, dev):
    """LlamaForCausalLM at the shape, float32 weights (seed 0) on dev"""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    n_layers, dim, heads, kv, ffn, vocab, base, tied = SHAPES[shape]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=ffn, num_hidden_layers=n_layers,
                      num_attention_heads=heads, num_key_value_heads=kv, rope_theta=base, tie_word_embeddings=tied,
                      max_position_embeddings=max(8192, seq + 16), rms_norm_eps=1e-5)
    torch.manual_seed(0)
    with torch.device(dev):  # initialized where it runs: no 5 GB host round trip at llama32-1b
        return LlamaForCausalLM(cfg)


def sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def train(model, init, x, y, steps, warmup, dev):
    """(tokens/s, ms/step, first loss) of the training step from the weights init"""
    import torch

    model.load_state_dict(init)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=dev.type == "cuda")

    def step():
        return train_step(model, model, opt, x, y)

    first = step().item()
    for _ in range(warmup - 1):
        step()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(dev)
    dt = time.perf_counter() - t0
    return x.numel() * steps / dt, 1e3 * dt / steps, first


def decode(model, ids, gen, dev):
    """(median ms/token, the greedy tokens) of eager decoding after ids"""
    import torch

    last_logits, _ = last_logits_fn(model)
    with torch.no_grad():
        def run(n_warm, n_timed):
            lo, cache = last_logits(ids, None)
            tok = int(lo[0, -1].argmax())
            times, toks = [], []
            for i in range(n_warm + n_timed):
                t0 = time.perf_counter()
                t = torch.tensor([[tok]], device=dev)
                tok = int(last_logits(t, cache)[0][0, -1].argmax())  # the read-back synchronizes
                if i >= n_warm:
                    times.append(1e3 * (time.perf_counter() - t0))
                    toks.append(tok)
            return times, toks

        run(WARM_STEPS, 0)
        times, toks = run(1, gen)  # one untimed step at position `prompt`, then prompt+1 .. prompt+gen
    return statistics.median(times), toks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama32-1b", choices=sorted(SHAPES))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--norms", action="store_true", help="patch the RMSNorms too (nstf::rms_norm, bf16 out)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    if min(a.batch, a.seq, a.steps, a.warmup, a.prompt, a.gen) < 1:
        ap.error("--batch, --seq, --steps, --warmup, --prompt and --gen must be >= 1")
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"torch_nstf_blocks: needs torch and transformers ({e}), skipped")
        return 77
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_nstf_blocks: torch sees no GPU, skipped")
        return 77
    import nstf.torch as nt
    from nstf.hf import patch_llama, unpatch_llama

    if a.device == "cuda" and not nt.available():
        print("torch_nstf_blocks: this nstf library has no GPU backend (a CUDA build's python/ on PYTHONPATH)",
              file=sys.stderr)
        return 1
    dev = torch.device(a.device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU (reference path: times mean nothing)"
    model = build(a.shape, max(a.seq, a.prompt + a.gen + WARM_STEPS + 2), dev)
    print(f"torch_nstf_blocks: {name}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"shape {a.shape} (random weights), stock attention {model.config._attn_implementation}", flush=True)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (a.batch, a.seq + 1), generator=g).to(dev)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    prompt = torch.randint(0, vocab, (1, a.prompt), generator=g).to(dev)
    res = {"device": name, "shape": a.shape, "torch": torch.__version__, "transformers": transformers.__version__,
           "batch": a.batch, "seq": a.seq, "prompt": a.prompt, "gen": a.gen, "norms": a.norms}
    variants = (("stock", False), ("nstf", True))
    for var, patched in variants:
        if patched:
            patch_llama(model, norms=a.norms)
        try:
            tps, ms, loss = train(model, init, x, y, a.steps, a.warmup, dev)
        finally:
            if patched:
                unpatch_llama(model)
        res[f"train_{var}_tok_s"], res[f"train_{var}_ms"], res[f"train_{var}_loss0"] = tps, ms, loss
        print(f"torch_nstf_blocks: train {a.batch}x{a.seq} {var}: {tps:.0f} tokens/s, {ms:.1f} ms/step, "
              f"first loss {loss:.4f}", flush=True)
    model.load_state_dict(init)
    del init
    model.to(torch.bfloat16).eval()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    toks = {}
    for var, patched in variants:
        if patched:
            patch_llama(model, norms=a.norms)
        try:
            ms, toks[var] = decode(model, prompt, a.gen, dev)
        finally:
            if patched:
                unpatch_llama(model)
        res[f"decode_{var}_ms"] = ms
        print(f"torch_nstf_blocks: decode at context {a.prompt + 1}..{a.prompt + a.gen} {var}: {ms:.3f} ms/token, "
              f"{1e3 / ms:.1f} tokens/s", flush=True)
    same = sum(p == q for p, q in zip(toks["stock"], toks["nstf"]))
    res["decode_same_tokens"] = same
    res["train_speedup"] = res["train_nstf_tok_s"] / res["train_stock_tok_s"]
    res["decode_speedup"] = res["decode_stock_ms"] / res["decode_nstf_ms"]
    print(f"torch_nstf_blocks: greedy tokens equal in {same} of {a.gen} decode steps (random weights: near ties "
          f"can flip)")
    print(f"torch_nstf_blocks: speed-up nstf/stock: train {res['train_speedup']:.2f}x, decode "
          f"{res['decode_speedup']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
