#!/usr/bin/env python3
"""bench_serve.py: N concurrent streams against an OpenAI-compatible server
(`nstf serve`, llama.cpp's `llama-server`, vLLM), the issue's serving
benchmark: aggregate generated tokens/s, and p50/p99 time to first token
and inter-token latency.

  python3 bench/serve/bench_serve.py --url http://127.0.0.1:8080 -n 32 \\
      --prompt-tokens 512 --gen-tokens 128 [--requests 64] [--api-key KEY]

Each request is POST /v1/completions with "stream": true, the prompt given
as token ids (the same ids for every server, so both see prompts of exactly
--prompt-tokens tokens; ids drawn from --id-range, by default 1000..20000,
away from special tokens), "max_tokens": --gen-tokens, "ignore_eos": true
(so every request generates exactly that many), "temperature": 0. A prompt
may share its first --shared-prefix tokens with every other (0: none), to
measure prefix caching.

Measured per request on the client: time to first token (send to the
first event carrying text), inter-token latency (gaps between events that
carry text; a server that packs several tokens into one event shows fewer,
longer gaps, never shorter ones), and the usage it reports. Aggregate
tokens/s = generated tokens of all requests / wall time from the first send
to the last [DONE]. Prints a table, and with --json one JSON line per run.
Only the standard library is used.
"""
import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(url, key, model, ids, gen, out, i, barrier):
    u = urllib.parse.urlparse(url)
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": gen, "temperature": 0, "stream": True,
                       "ignore_eos": True, "stream_options": {"include_usage": True}}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=3600)
    barrier.wait()
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers=headers)
    r = c.getresponse()
    rec = {"status": r.status, "t0": t0, "events": [], "usage": None, "error": None}
    if r.status != 200:
        rec["error"] = r.read()[:300].decode(errors="replace")
        out[i] = rec
        return
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        t = time.perf_counter()
        ev = json.loads(data)
        if "error" in ev:
            rec["error"] = str(ev["error"])
        if ev.get("usage"):
            rec["usage"] = ev["usage"]
        for ch in ev.get("choices") or []:
            if ch.get("text"):
                rec["events"].append(t)
    rec["t_end"] = time.perf_counter()
    c.close()
    out[i] = rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("-n", "--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=0, help="requests in all (default: one per stream)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--shared-prefix", type=int, default=0)
    ap.add_argument("--id-range", default="1000:20000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--model", default="bench")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    total = a.requests or a.concurrency
    lo, hi = (int(x) for x in a.id_range.split(":"))
    rng = random.Random(a.seed)
    prefix = [rng.randrange(lo, hi) for _ in range(a.shared_prefix)]
    prompts = [prefix + [rng.randrange(lo, hi) for _ in range(a.prompt_tokens - a.shared_prefix)] for _ in range(total)]
    out = [None] * total
    # waves of `concurrency` streams, each wave started together
    t_start = time.perf_counter()
    for w in range(0, total, a.concurrency):
        idx = list(range(w, min(total, w + a.concurrency)))
        barrier = threading.Barrier(len(idx))
        th = [threading.Thread(target=one_request, args=(a.url, a.api_key, a.model, prompts[i], a.gen_tokens, out, i,
                                                         barrier)) for i in idx]
        for t in th:
            t.start()
        for t in th:
            t.join()
    wall = time.perf_counter() - t_start
    bad = [r for r in out if r is None or r["error"] or r["status"] != 200]
    ok = [r for r in out if r and not r["error"] and r["status"] == 200]
    gen = sum((r["usage"] or {}).get("completion_tokens", len(r["events"])) for r in ok)
    ttft = [(r["events"][0] - r["t0"]) * 1e3 for r in ok if r["events"]]
    itl = [(b - x) * 1e3 for r in ok for x, b in zip(r["events"], r["events"][1:])]
    res = {
        "label": a.label, "url": a.url, "concurrency": a.concurrency, "requests": total, "failed": len(bad),
        "prompt_tokens": a.prompt_tokens, "gen_tokens": a.gen_tokens, "shared_prefix": a.shared_prefix,
        "wall_s": round(wall, 3), "generated": gen, "tokens_per_s": round(gen / wall, 2) if wall > 0 else 0,
        "ttft_ms_p50": round(percentile(ttft, 50), 2), "ttft_ms_p99": round(percentile(ttft, 99), 2),
        "itl_ms_p50": round(percentile(itl, 50), 2), "itl_ms_p99": round(percentile(itl, 99), 2),
        "itl_ms_mean": round(statistics.fmean(itl), 2) if itl else float("nan"),
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(f"| label | streams | requests | prompt | gen | tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | failed |")
        print(f"|---|---|---|---|---|---|---|---|---|")
        print(f"| {a.label or a.url} | {a.concurrency} | {total} | {a.prompt_tokens} | {a.gen_tokens} | "
              f"{res['tokens_per_s']} | {res['ttft_ms_p50']} / {res['ttft_ms_p99']} | "
              f"{res['itl_ms_p50']} / {res['itl_ms_p99']} | {len(bad)} |")
    for r in bad[:3]:
        print("failed:", r and (r["status"], r["error"]), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
