"""torch_decode.py — PyTorch / HF transformers peers of bench_infer, at the
same shapes with random bf16 weights on the GPU, doing the work bench_infer
times (bench/gpu/bench_infer.c):

  prefill  one forward of --prompt tokens from position 0 that fills a fresh
           KV cache and computes the logits of the last position only
           (logits_to_keep=1; on a transformers without it, the decoder's
           last hidden row through lm_head, the same computation), then its
           argmax, read back to the host: 4 bytes, as ours does. Tokens/s,
           median of --reps after a warm-up.
  decode   one token per step at the depth bench_infer uses: after a prefill
           of --prompt tokens and an untimed warm-up step at position
           --prompt, --gen timed steps at positions prompt+1 .. prompt+gen.
           Each step's token goes up from the host and its argmax comes back
           (ours: "graph, device argmax"); the graph variants also time the
           step with the fp32 logits of the row copied to the host (ours:
           "graph, logits to host"). Median ms/token, CUDA events around each
           step, host round trip included, as ours.
    eager  LlamaForCausalLM with its default attention (SDPA) and a dynamic
           KV cache, one Python-driven forward per token;
    graph  the same model with a StaticCache, the decode step captured once
           in a CUDA graph (torch.cuda.graph) and replayed per token, when
           that capture works with the installed transformers.

To compare with `nstf bench` (llama-bench's tg128 at depth 0) instead, give
the same depth: --prompt is the context the decode steps start from.

Usage: python3 torch_decode.py [--shapes smollm2-135m,llama32-1b,llama3-8b]
       [--prompt 512] [--gen 64] [--reps 5]
"""
import argparse
import inspect
import statistics
import sys
import time

SHAPES = {  # layers, dim, heads, kv heads, ffn, vocab, rope base, tied (tools/cmd_gen_model.c)
    "smollm2-135m": (30, 576, 9, 3, 1536, 49152, 100000.0, True),
    "llama32-1b": (16, 2048, 32, 8, 8192, 128256, 500000.0, True),
    "llama3-8b": (32, 4096, 32, 8, 14336, 128256, 500000.0, False),
}
WARM_STEPS = 4  # untimed decode steps before the timed ones (bench_infer: 4)


def event_ms(fn):
    """Run fn between two CUDA events; fn's own host sync is inside."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    r = fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b), r


def last_logits_fn(model):
    """A function (ids, cache, **kw) -> (logits [1, 1, vocab] of the last
    position only, the KV cache), and the name of the way it does so.
    cache None: the model makes a fresh dynamic cache."""
    params = inspect.signature(model.forward).parameters
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            def f(ids, cache, _k=name, **kw):
                o = model(ids, past_key_values=cache, use_cache=True, **{_k: 1}, **kw)
                return o.logits, o.past_key_values
            return f, name + "=1"

    def f(ids, cache, **kw):  # older transformers: the same computation by hand
        o = model.model(ids, past_key_values=cache, use_cache=True, **kw)
        return model.lm_head(o.last_hidden_state[:, -1:]), o.past_key_values
    return f, "lm_head on the last hidden row"


def make_static_cache(cfg, max_len):
    import torch
    from transformers import StaticCache

    try:
        return StaticCache(config=cfg, max_cache_len=max_len)
    except TypeError:
        return StaticCache(config=cfg, max_batch_size=1, max_cache_len=max_len, device="cuda",
                           dtype=torch.bfloat16)


def bench(name, prompt, gen, reps):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    L, d, h, kv, ffn, V, base, tied = SHAPES[name]
    cfg = LlamaConfig(vocab_size=V, hidden_size=d, intermediate_size=ffn, num_hidden_layers=L,
                      num_attention_heads=h, num_key_value_heads=kv,
                      max_position_embeddings=max(4096, prompt + gen + 16), rope_theta=base,
                      tie_word_embeddings=tied, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    last_logits, how = last_logits_fn(model)
    print(f"{name}: built in {time.time() - t0:.1f} s, attention {model.config._attn_implementation}, "
          f"last-row logits by {how}", flush=True)
    ids = torch.randint(0, V, (1, prompt), device="cuda")
    res = {}
    with torch.no_grad():
        # prefill: fresh cache, last row's logits, argmax to the host
        def prefill():
            return int(last_logits(ids, None)[0][0, -1].argmax())

        times = [event_ms(prefill)[0] for _ in range(reps + 1)][1:]
        ms = statistics.median(times)
        res["prefill_tok_s"] = prompt / ms * 1e3
        print(f"  eager prefill {prompt} (last-row logits, argmax to host): {ms:.3f} ms (median of {reps}) "
              f"= {res['prefill_tok_s']:.0f} tokens/s", flush=True)

        # eager decode: warm-up on a throwaway cache, then the timed run
        def decode_run(n_warm, n_timed):
            lo, cache = last_logits(ids, None)
            tok = int(lo[0, -1].argmax())
            out = []
            for i in range(n_warm + n_timed):
                def step():
                    t = torch.tensor([[tok]], device="cuda")
                    return int(last_logits(t, cache)[0][0, -1].argmax())
                ms, tok = event_ms(step)
                if i >= n_warm:
                    out.append(ms)
            return out

        decode_run(WARM_STEPS, 0)
        # one untimed step at position `prompt`, then positions prompt+1 .. prompt+gen
        res["eager_ms"] = statistics.median(decode_run(1, gen))
        print(f"  eager decode at context {prompt + 1}-{prompt + gen}: {res['eager_ms']:.3f} ms/token "
              f"(median of {gen})", flush=True)

        try:
            cache = make_static_cache(cfg, prompt + gen + 16)
            cp = torch.arange(prompt, device="cuda")
            tok0 = int(last_logits(ids, cache, cache_position=cp)[0][0, -1].argmax())
            torch.cuda.synchronize()  # an error of the cache fill shows here, not inside a timed loop
            s_tok = torch.full((1, 1), tok0, dtype=torch.long, device="cuda")
            s_pos = torch.tensor([prompt], device="cuda")

            def step():
                lo = last_logits(s_tok, cache, cache_position=s_pos, position_ids=s_pos[None])[0][:, -1]
                return lo.argmax(-1), lo.float()

            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # at position `prompt`, rewritten each time
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                g_tok, g_logits = step()
            host_logits = torch.empty(V, dtype=torch.float32, pin_memory=True)

            def replay_at(pos, tok, to_host):
                s_pos.fill_(pos)
                s_tok.fill_(tok)
                graph.replay()
                if to_host:
                    host_logits.copy_(g_logits[0])
                return int(g_tok[0])

            for to_host, key, what in ((False, "graph_ms", "argmax to host"),
                                       (True, "graph_logits_ms", "fp32 logits to host")):
                tok = replay_at(prompt, tok0, to_host)  # warm-up at position `prompt`
                times = []
                for i in range(gen):
                    ms, tok = event_ms(lambda p=prompt + 1 + i, t=tok: replay_at(p, t, to_host))
                    times.append(ms)
                torch.cuda.synchronize()  # a device-side error of the replays voids their times
                res[key] = statistics.median(times)
                print(f"  static-cache CUDA-graph decode at context {prompt + 1}-{prompt + gen}, {what}: "
                      f"{res[key]:.3f} ms/token (median of {gen})", flush=True)
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
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.prompt < 1 or a.gen < 1 or a.reps < 1:
        ap.error("--prompt, --gen and --reps must be >= 1")
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"torch_decode: {e}; needs torch (CUDA) and transformers", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_decode: no CUDA device visible to torch", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name(0)}")
    for s in a.shapes.split(","):
        bench(s, a.prompt, a.gen, a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
