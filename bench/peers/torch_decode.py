"""torch_decode.py — PyTorch / HF transformers peers of bench_infer, at the
same shapes with random bf16 weights on the GPU.

For each shape: prefill of --prompt tokens (one forward, tokens/s) and
decode ms/token at that context, timed with CUDA events (median after
warm-up):
  eager   LlamaForCausalLM with its default attention (SDPA) and a dynamic
          KV cache, one Python-driven forward per token;
  graph   the same model with a StaticCache, the decode step captured once
          in a CUDA graph (torch.cuda.graph) and replayed per token, when
          that capture works with the installed transformers.
Usage: python3 torch_decode.py [--shapes smollm2-135m,llama32-1b,llama3-8b]
       [--prompt 512] [--gen 64]
"""
import argparse
import statistics
import sys
import time

import torch

SHAPES = {  # layers, dim, heads, kv heads, ffn, vocab, rope base, tied
    "smollm2-135m": (30, 576, 9, 3, 1536, 49152, 100000.0, True),
    "llama32-1b": (16, 2048, 32, 8, 8192, 128256, 500000.0, True),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 500000.0, False),
}


def timed(fn, reps, warm=2):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def bench(name, prompt, gen):
    from transformers import LlamaConfig, LlamaForCausalLM

    L, d, h, kv, ffn, V, base, tied = SHAPES[name]
    cfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=ffn, num_hidden_layers=L,
                      num_attention_heads=h, num_key_value_heads=kv, max_position_embeddings=4096,
                      rope_theta=base, tie_word_embeddings=tied, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    print(f"{name}: built in {time.time() - t0:.1f} s, attention {model.config._attn_implementation}", flush=True)
    ids = torch.randint(0, V, (1, prompt), device="cuda")
    res = {}
    with torch.no_grad():
        ms = timed(lambda: model(ids, use_cache=False), 5)
        res["prefill_tok_s"] = prompt / ms * 1e3
        print(f"  eager prefill {prompt}: {ms:.3f} ms = {prompt / ms * 1e3:.0f} tokens/s", flush=True)
        out = model(ids, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        times = []
        for i in range(gen + 4):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            o = model(tok, past_key_values=past, use_cache=True)
            tok = o.logits[:, -1:].argmax(-1)
            b.record()
            b.synchronize()
            if i >= 4:
                times.append(a.elapsed_time(b))
        res["eager_ms"] = statistics.median(times)
        print(f"  eager decode at context {prompt}: {res['eager_ms']:.3f} ms/token", flush=True)
        del past, out, o
        try:
            from transformers import StaticCache
            try:
                cache = StaticCache(config=cfg, max_cache_len=prompt + gen + 16)
            except TypeError:
                cache = StaticCache(config=cfg, max_batch_size=1, max_cache_len=prompt + gen + 16,
                                    device="cuda", dtype=torch.bfloat16)
            cp = torch.arange(prompt, device="cuda")
            o = model(ids, past_key_values=cache, cache_position=cp, use_cache=True)
            s_tok = o.logits[:, -1:].argmax(-1).clone()
            s_pos = torch.tensor([prompt], device="cuda")

            def step():
                lo = model(s_tok, past_key_values=cache, cache_position=s_pos, position_ids=s_pos[None],
                           use_cache=True).logits
                return lo[:, -1:].argmax(-1)

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                g_out = step()
            times = []
            for i in range(gen + 4):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                s_pos.fill_(prompt + 1 + i)
                graph.replay()
                s_tok.copy_(g_out)
                b.record()
                b.synchronize()
                if i >= 4:
                    times.append(a.elapsed_time(b))
            res["graph_ms"] = statistics.median(times)
            print(f"  static-cache CUDA-graph decode at context ~{prompt}: {res['graph_ms']:.3f} ms/token", flush=True)
        except Exception as e:  # report, do not fail the run
            print(f"  static-cache CUDA-graph decode: not measured ({type(e).__name__}: {str(e)[:200]})", flush=True)
    del model
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="smollm2-135m,llama32-1b,llama3-8b")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    a = ap.parse_args()
    import transformers
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name(0)}")
    for s in a.shapes.split(","):
        bench(s, a.prompt, a.gen)
    return 0


if __name__ == "__main__":
    sys.exit(main())
