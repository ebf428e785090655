"""test_model.py — nstf.Model on the default model (CPU, 2 threads).

  - generate() equals what `nstf run` prints for the same arguments and
    seed (sampled and greedy, plain and chat), byte for byte;
  - stream() pieces concatenate to generate()'s text, and leaving a stream
    early stops the generation;
  - tokenize/detokenize round trip and agree with the ids generation uses;
  - logits() rows equal the last-only call and are numpy float32 of the
    documented shape; the greedy continuation of generate() is the argmax
    chain of logits();
  - errors raise nstf.Error with the C message: a path that does not
    exist, a bad device, invalid UTF-8, an id out of range, n_predict < 0,
    a prompt too long for the context, a closed model;
  - the GIL is released while the engine runs: another thread makes
    progress during a logits() call;
  - bench() reports positive speeds."""

import os
import subprocess
import threading
import time

import numpy as np
import pytest

import nstf


def cli_text(cli, model_path, prompt, *args):
    r = subprocess.run([cli, "run", "-m", model_path, "-p", prompt, "-t", "2", "-c", "256", "--device", "cpu", *args],
                       capture_output=True, check=True)
    out = r.stdout
    assert out.endswith(b"\n"), out
    return out[:-1]  # the CLI ends the text with one newline


@pytest.mark.parametrize("prompt,args,kw", [
    ("Once upon a time", ["-n", "16", "--seed", "7", "--temp", "0.8"], dict(n_predict=16, seed=7, temperature=0.8)),
    ("The capital of France is", ["-n", "16", "--temp", "0"], dict(n_predict=16, temperature=0.0)),
    ("Name three colors.", ["-n", "12", "--chat", "--seed", "3", "--top-k", "20", "--top-p", "0.9", "--min-p",
                            "0.1", "--repeat-penalty", "1.2"],
     dict(n_predict=12, chat=True, seed=3, top_k=20, top_p=0.9, min_p=0.1, repeat_penalty=1.2)),
])
def test_generate_equals_cli(model, cli, model_path, prompt, args, kw):
    want = cli_text(cli, model_path, prompt, *args)
    got = model.generate_bytes(prompt, **kw)
    assert got == want
    assert model.generate(prompt, **kw) == want.decode("utf-8", "replace")
    st = model.last_stats
    assert st["n_prompt"] > 0 and 0 < st["n_gen"] <= kw["n_predict"]


def test_stream_equals_generate(model):
    kw = dict(n_predict=16, seed=11, temperature=0.9)
    pieces = list(model.stream("Write a haiku about the sea.", chat=True, **kw))
    assert len(pieces) > 1
    assert all(isinstance(p, str) and p for p in pieces)
    assert "".join(pieces) == model.generate("Write a haiku about the sea.", chat=True, **kw)


def test_stream_stops_early(model):
    it = model.stream("Count from one to one hundred:", n_predict=100, temperature=0.0, ignore_eos=True)
    first = [next(it) for _ in range(3)]
    it.close()  # leaving the loop stops the worker after its current token
    assert len(first) == 3
    assert model.last_stats["n_gen"] < 100
    # the model is free again
    assert model.generate("Hi", n_predict=2, temperature=0.0) is not None


def test_tokenize_roundtrip(model):
    text = "Hello, world! Ünïcödé ✓ 123"
    ids = model.tokenize(text, add_bos=False)
    assert ids.dtype == np.int32 and ids.ndim == 1 and ids.size > 0
    assert model.detokenize(ids) == text
    assert model.detokenize(list(ids)) == text
    assert model.tokenize(text.encode(), add_bos=False).tolist() == ids.tolist()
    special = model.tokenize("<|im_start|>user", add_bos=False, special=True)
    assert special.size == 2
    assert model.tokenize("<|im_start|>user", add_bos=False).size > 2
    assert model.tokenize("", add_bos=False).size == 0
    long = "word " * 3000  # more ids than the first buffer guess? no: fewer; still exercises a big buffer
    assert model.detokenize(model.tokenize(long, add_bos=False)) == long


def test_logits(model):
    ids = model.tokenize("The capital of France is", add_bos=False)
    all_rows = model.logits(ids)
    assert all_rows.dtype == np.float32 and all_rows.shape == (ids.size, model.n_vocab)
    assert np.isfinite(all_rows).all()
    last = model.logits(ids, all=False)
    assert last.shape == (model.n_vocab,)
    assert np.array_equal(last, all_rows[-1])
    # greedy generation is the argmax chain of the logits
    text = model.generate("The capital of France is", n_predict=4, temperature=0.0, ignore_eos=True)
    seq = list(ids)
    for _ in range(4):
        seq.append(int(np.argmax(model.logits(np.array(seq), all=False))))
    assert model.detokenize(seq[ids.size:]) == text


def test_info(model):
    assert model.n_vocab == 49152 and model.n_ctx == 256 and model.backend == "CPU"
    assert model.dim == 576 and model.n_layers == 30 and model.head_dim == 64
    assert model.eos is not None and "closed" not in repr(model)


def test_errors(model, tmp_path):
    missing = str(tmp_path / "no-such-model.gguf")
    with pytest.raises(nstf.Error) as e:
        nstf.Model(missing, device="cpu")
    assert "no-such-model.gguf" in str(e.value) and e.value.status != 0 and e.value.status_name
    with pytest.raises(nstf.Error, match="unknown device"):
        nstf.Model(missing, device="tpu")
    with pytest.raises(nstf.Error, match="(?i)utf-8"):
        model.tokenize("bad \ud800 surrogate")
    with pytest.raises(nstf.Error, match="outside"):
        model.detokenize([1, model.n_vocab])
    with pytest.raises(nstf.Error, match="outside"):
        model.logits([0, -1])
    with pytest.raises(nstf.Error):
        model.logits([])
    with pytest.raises(nstf.Error, match="must be >= 0"):
        model.generate("x", n_predict=-1)
    with pytest.raises(nstf.Error, match="context"):
        model.generate("word " * 400, n_predict=1)
    with pytest.raises(TypeError):
        model.tokenize(12)
    # a failing call leaves the model usable
    assert model.generate("Hi", n_predict=1, temperature=0.0) is not None


def test_cache_type(model_path):
    m = nstf.Model(model_path, device="cpu", n_ctx=64, cache_type="q8_0")
    try:
        text = m.generate("The capital of France is", n_predict=4, temperature=0.0, ignore_eos=True)
        assert isinstance(text, str) and text
    finally:
        m.close()
    with pytest.raises(nstf.Error, match="cache-type"):
        nstf.Model(model_path, device="cpu", n_ctx=64, cache_type="q4_0")


def test_closed_model(model_path):
    m = nstf.Model(model_path, device="cpu", n_ctx=32, threads=1)
    assert not m.closed
    m.close()
    m.close()  # idempotent
    assert m.closed and "closed" in repr(m)
    for call in (lambda: m.generate("x", n_predict=1), lambda: m.tokenize("x"), lambda: m.detokenize([1]),
                 lambda: m.logits([1]), lambda: list(m.stream("x", n_predict=1))):
        with pytest.raises(nstf.Error, match="closed"):
            call()
    with nstf.Model(model_path, device="cpu", n_ctx=32, threads=1) as m2:
        assert m2.tokenize("x").size >= 1
    assert m2.closed


def test_callback_reentry_refused(model):
    it = model.stream("Hello", n_predict=4, temperature=0.0, ignore_eos=True)
    next(it)
    # the consumer runs on another thread than the generation: it waits for the model, then gets it
    it.close()
    errors = []

    def piece(b):
        try:
            model.tokenize("x")
        except nstf.Error as e:
            errors.append(str(e))
        return True

    model._run("Hello", 2, False, None, model._sampler(0.0, None, None, None, None, None, 0), True, piece)
    assert errors and "in use" in errors[0]


def test_gil_released(model):
    ids = np.arange(100, 196, dtype=np.int32)  # 96 tokens: a call of well over 20 ms on 2 threads
    span = {}
    started = threading.Event()

    def work():
        started.set()
        span["t0"] = time.perf_counter()
        model.logits(ids, all=False)
        span["t1"] = time.perf_counter()

    t = threading.Thread(target=work)
    t.start()
    started.wait()
    stamps = []
    while t.is_alive():
        stamps.append(time.perf_counter())
    t.join()
    t0, t1 = span["t0"], span["t1"]
    assert t1 - t0 > 0.03, f"the call took only {t1 - t0:.3f} s: too short to tell"
    inside = sum(1 for s in stamps if t0 + 0.01 < s < t1 - 0.01)
    # with the GIL held for the call, this thread could not run inside it at all
    assert inside > 100, f"{inside} iterations of this thread ran during a {t1 - t0:.3f} s call"


def test_bench(model):
    r = model.bench(n_prompt=16, n_gen=4, reps=1)
    assert r["pp_tokens_per_s"] > 0 and r["tg_tokens_per_s"] > 0 and r["backend"] == "CPU"
    with pytest.raises(nstf.Error):
        model.bench(n_prompt=0)


def test_gpu_queries():
    assert nstf.gpu_runtime() in (None, "CUDA", "HIP")
    assert nstf.gpu_count() >= 0
    assert os.path.exists(nstf.library_path())
