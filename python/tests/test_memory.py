"""test_memory.py — the binding releases what it takes: 1000 calls of each
kind on a tiny random model (nstf gen-model --shape tiny) leave the
process's resident memory and Python's traced allocations where they were
after a warm-up.

Metric: growth over the 1000 calls after 50 warm-up calls, of the resident
set (/proc/self/statm) at most 1 MiB (a leak of 1 KiB per call would show
as 1 MiB) and of tracemalloc's traced Python memory at most 64 KiB (64
bytes per call). Kinds: open + close a model; generate; stream; tokenize +
detokenize; logits."""

import gc
import os
import tracemalloc

import numpy as np
import pytest

import nstf

N = 1000
WARM = 50
RSS_MAX = 1 << 20
PY_MAX = 64 << 10


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure(fn):
    for i in range(WARM):
        fn(i)
    gc.collect()
    tracemalloc.start()
    py0 = tracemalloc.get_traced_memory()[0]
    rss0 = rss_bytes()
    for i in range(N):
        fn(i)
    gc.collect()
    py1 = tracemalloc.get_traced_memory()[0]
    rss1 = rss_bytes()
    tracemalloc.stop()
    return rss1 - rss0, py1 - py0


@pytest.fixture(scope="module")
def tiny(tiny_model):
    m = nstf.Model(tiny_model, device="cpu", n_ctx=64, threads=1)
    yield m
    m.close()


def check(fn):
    if os.environ.get("NSTF_PY_SANITIZED"):
        pytest.skip("resident memory under AddressSanitizer is its own (quarantine)")
    rss, py = measure(fn)
    assert rss <= RSS_MAX, f"resident memory grew by {rss} bytes over {N} calls"
    assert py <= PY_MAX, f"traced Python memory grew by {py} bytes over {N} calls"


def test_open_close(tiny_model):
    check(lambda i: nstf.Model(tiny_model, device="cpu", n_ctx=16, threads=1).close())


def test_generate(tiny):
    check(lambda i: tiny.generate("hello", n_predict=4, seed=i, temperature=0.8))


def test_stream(tiny):
    check(lambda i: "".join(tiny.stream("hello", n_predict=3, seed=i)))


def test_tokens(tiny):
    check(lambda i: tiny.detokenize(tiny.tokenize(f"some text {i}")))


def test_logits(tiny):
    ids = np.arange(1, 9, dtype=np.int32)
    check(lambda i: tiny.logits(ids))


def test_errors(tiny, tmp_path):
    missing = str(tmp_path / "missing.gguf")

    def fail(i):
        with pytest.raises(nstf.Error):
            nstf.Model(missing, device="cpu")
        with pytest.raises(nstf.Error):
            tiny.logits([tiny.n_vocab])

    check(fail)
