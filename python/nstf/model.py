"""model.py — nstf.Model, a session of the engine: generation (whole or as
a stream of pieces), tokens, logits and a quick benchmark, with numpy
arrays in and out and every C failure raised as nstf.Error with the
library's message.

One session runs one call at a time: a lock serializes calls from several
threads, and a call made from inside a generation's own callback (a stream
consumer calling back into the model on the generating thread) is refused
rather than corrupting the session."""

import codecs
import ctypes
import queue
import threading
import time

import numpy as np

from . import _lib as L


class Error(Exception):
    """A failure of the C library: `status` is its nstf_status code,
    `status_name` the short name, and str(e) the library's message."""

    def __init__(self, message, status=None, status_name=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


def _check(lib, status):
    if status != 0:
        msg = lib.nstf_last_error()
        name = lib.nstf_status_str(status)
        raise Error(msg.decode("utf-8", "replace") if msg else f"nstf status {status}", status,
                    name.decode() if name else None)


def _text_bytes(text):
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    if not isinstance(text, str):
        raise TypeError(f"expected str or bytes, got {type(text).__name__}")
    # lone surrogates pass through as the bytes they would be, so the
    # library's UTF-8 check reports them (with the byte offset)
    return text.encode("utf-8", "surrogatepass")


def _ids_array(tokens):
    a = np.ascontiguousarray(np.asarray(tokens).reshape(-1))
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"token ids must be integers, got {a.dtype}")
    if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
        raise Error("token id out of the int32 range", 6, "out of range")
    return np.ascontiguousarray(a, dtype=np.int32)


def _ptr(a, ctype):
    return a.ctypes.data_as(ctypes.POINTER(ctype))


class Model:
    """A model loaded into a session.

    path: a GGUF file or an HF model folder. device: "auto" (the GPU when
    the build has one and a device answers), "cpu" or "gpu". n_ctx: KV
    cache positions (0: min(trained context, 4096)). threads: CPU threads
    (0: every core). cache_type: the KV cache's, "auto" (f32 on the CPU,
    bf16 on a GPU) or "q8_0" (keys and values). The other keywords are
    nstf_session_params' fields."""

    def __init__(self, path, device="auto", n_ctx=0, threads=0, n_batch=0, precise=False, deterministic=False,
                 n_gpu_layers=0, verbose=False, sparse_attn=0, sparse_topk=0, sparse_window=0, sparse_block=0,
                 cache_type="auto"):
        self._lib = L.load()
        self._s = None
        self._lock = threading.Lock()
        self._owner = None
        p = self._lib.nstf_session_default_params()
        p.n_ctx = int(n_ctx)
        p.n_batch = int(n_batch)
        p.n_threads = int(threads)
        self._device = str(device).encode()
        p.device = self._device
        p.verbose = bool(verbose)
        p.precise = bool(precise)
        p.deterministic = bool(deterministic)
        p.n_gpu_layers = int(n_gpu_layers)
        p.sparse_attn = int(sparse_attn)
        p.sparse_topk = int(sparse_topk)
        p.sparse_window = int(sparse_window)
        p.sparse_block = int(sparse_block)
        self._cache_type = str(cache_type).encode()
        p.cache_type_k = p.cache_type_v = self._cache_type
        out = ctypes.c_void_p()
        _check(self._lib, self._lib.nstf_session_open(_text_bytes(str(path)), ctypes.byref(p), ctypes.byref(out)))
        self._s = out
        info = L.ModelInfo()
        _check(self._lib, self._lib.nstf_session_info(self._s, ctypes.byref(info)))
        self.n_vocab = info.n_vocab
        self.n_ctx = info.n_ctx
        self.n_ctx_train = info.n_ctx_train
        self.n_layers = info.n_layers
        self.dim = info.dim
        self.n_heads = info.n_heads
        self.n_kv_heads = info.n_kv_heads
        self.head_dim = info.head_dim
        self.ffn_dim = info.ffn_dim
        self.bos = info.bos if info.bos >= 0 else None
        self.eos = info.eos if info.eos >= 0 else None
        self.add_bos = bool(info.add_bos)
        self.n_batch = info.n_batch
        self.backend = info.backend.decode()
        self.device = info.device.decode("utf-8", "replace")
        self.path = str(path)
        self.last_stats = None

    # ---- lifetime -------------------------------------------------------------

    def close(self):
        """Free the session (idempotent). Later calls raise nstf.Error."""
        if self._s is None:
            return
        with self._use():
            s, self._s = self._s, None
            self._lib.nstf_session_close(s)

    @property
    def closed(self):
        return self._s is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_s", None) is not None and getattr(self, "_lock", None) is not None:
            try:
                self.close()
            except Error:
                pass

    def __repr__(self):
        state = "closed" if self.closed else f"{self.backend}, n_ctx {self.n_ctx}"
        return f"nstf.Model({self.path!r}, {state})"

    class _Use:
        def __init__(self, m):
            self.m = m

        def __enter__(self):
            m = self.m
            if m._owner == threading.get_ident():
                raise Error("the model is in use by a generation on this thread (a call from inside its callback "
                            "or stream)", 1, "invalid argument")
            m._lock.acquire()
            if m._s is None:
                m._lock.release()
                raise Error("the model is closed", 1, "invalid argument")
            m._owner = threading.get_ident()
            return m._s

        def __exit__(self, *exc):
            self.m._owner = None
            self.m._lock.release()

    def _use(self):
        return Model._Use(self)

    # ---- tokens ----------------------------------------------------------------

    def tokenize(self, text, add_bos=None, special=False):
        """Token ids (int32 numpy array) of text (str or UTF-8 bytes), as a
        prompt is encoded. add_bos None: as the model wants; special: parse
        control tokens written in the text."""
        b = _text_bytes(text)
        ab = -1 if add_bos is None else int(bool(add_bos))
        n = ctypes.c_int64(0)
        cap = len(b) + 8
        with self._use() as s:
            while True:
                out = np.empty(cap, dtype=np.int32)
                st = self._lib.nstf_session_tokenize(s, b, len(b), ab, bool(special), _ptr(out, ctypes.c_int32), cap,
                                                     ctypes.byref(n))
                if st == 6 and n.value > cap:  # NSTF_ERR_RANGE: buffer too small, n says how many
                    cap = n.value
                    continue
                _check(self._lib, st)
                return out[:n.value].copy()

    def detokenize_bytes(self, ids):
        """The bytes of a sequence of token ids."""
        a = _ids_array(ids)
        n = ctypes.c_size_t(0)
        cap = max(64, 16 * a.size)
        with self._use() as s:
            while True:
                buf = ctypes.create_string_buffer(cap)
                st = self._lib.nstf_session_detokenize(s, _ptr(a, ctypes.c_int32), a.size, buf, cap, ctypes.byref(n))
                if st == 6 and n.value > cap:
                    cap = n.value
                    continue
                _check(self._lib, st)
                return buf.raw[:n.value]

    def detokenize(self, ids):
        """The text of a sequence of token ids (invalid UTF-8 replaced)."""
        return self.detokenize_bytes(ids).decode("utf-8", "replace")

    # ---- logits ----------------------------------------------------------------

    def logits(self, tokens, all=True):
        """Teacher-forced logits of tokens at positions 0..n-1: float32
        [n, n_vocab] (row t predicts token t+1), or [n_vocab] of the last
        position with all=False."""
        a = _ids_array(tokens)
        out = np.empty((a.size, self.n_vocab) if all else (self.n_vocab,), dtype=np.float32)
        with self._use() as s:
            _check(self._lib, self._lib.nstf_session_eval(s, _ptr(a, ctypes.c_int32), a.size, bool(all),
                                                          _ptr(out, ctypes.c_float)))
        return out

    # ---- generation --------------------------------------------------------------

    def _sampler(self, temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed):
        sp = self._lib.nstf_sampler_default_params()
        if temperature is not None:
            sp.temp = float(temperature)
        if top_k is not None:
            sp.top_k = int(top_k)
        if top_p is not None:
            sp.top_p = float(top_p)
        if min_p is not None:
            sp.min_p = float(min_p)
        if repeat_penalty is not None:
            sp.repeat_penalty = float(repeat_penalty)
        if repeat_last_n is not None:
            sp.repeat_last_n = int(repeat_last_n)
        sp.seed = self._lib.nstf_time_seed() if seed is None else int(seed) & 0xFFFFFFFFFFFFFFFF
        return sp

    def _run(self, prompt, n_predict, chat, system, sp, ignore_eos, on_piece):
        """nstf_session_generate; on_piece(bytes) -> bool (False stops)."""
        if int(n_predict) < 0:
            raise Error(f"n_predict {n_predict} must be >= 0", 1, "invalid argument")
        pb = _text_bytes(prompt)
        if b"\0" in pb:
            raise Error("the prompt contains a NUL byte", 1, "invalid argument")
        sysb = None if system is None else _text_bytes(system)
        failure = []

        def cb(user, token, piece, length):
            try:
                return bool(on_piece(ctypes.string_at(piece, length) if length else b""))
            except BaseException as e:  # noqa: BLE001 - handed back to the caller after the C call returns
                failure.append(e)
                return False

        fn = L.PieceFn(cb)
        stats = L.GenStats()
        with self._use() as s:
            st = self._lib.nstf_session_generate(s, pb, bool(chat), sysb, ctypes.byref(sp), int(n_predict),
                                                 bool(ignore_eos), fn, None, ctypes.byref(stats))
        self.last_stats = {f: getattr(stats, f) for f, _ in L.GenStats._fields_}
        if failure:
            raise failure[0]
        _check(self._lib, st)

    def generate_bytes(self, prompt, n_predict=128, temperature=None, top_k=None, top_p=None, min_p=None,
                       repeat_penalty=None, repeat_last_n=None, seed=None, chat=False, system=None, ignore_eos=False):
        """generate(), as the bytes `nstf run` writes (no trailing newline)."""
        sp = self._sampler(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)
        parts = []
        self._run(prompt, n_predict, chat, system, sp, ignore_eos, lambda b: parts.append(b) or True)
        return b"".join(parts)

    def generate(self, prompt, n_predict=128, temperature=None, top_k=None, top_p=None, min_p=None,
                 repeat_penalty=None, repeat_last_n=None, seed=None, chat=False, system=None, ignore_eos=False):
        """Generate up to n_predict tokens after prompt and return the text
        exactly as `nstf run` prints it (without its final newline; bytes
        that are not UTF-8 become U+FFFD). Sampling as `nstf run`:
        temperature 0.8 (0: greedy), top_k 40, top_p 0.95, min_p 0.05,
        repeat_penalty 1.0 over repeat_last_n 64 when left as None; seed
        None draws one from the clock. chat: the prompt is one user turn in
        the model's chat template (system: its system message). Statistics
        of the run are in last_stats."""
        return self.generate_bytes(prompt, n_predict, temperature, top_k, top_p, min_p, repeat_penalty,
                                   repeat_last_n, seed, chat, system, ignore_eos).decode("utf-8", "replace")

    def stream(self, prompt, n_predict=128, temperature=None, top_k=None, top_p=None, min_p=None,
               repeat_penalty=None, repeat_last_n=None, seed=None, chat=False, system=None, ignore_eos=False):
        """An iterator over the generated text as it is produced: str pieces
        whose concatenation is generate()'s text for the same arguments (a
        token that ends inside a UTF-8 sequence is held back until the
        sequence completes). Generation runs on a worker thread with the GIL
        released; leaving the loop early stops it after the current token."""
        sp = self._sampler(temperature, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed)
        q = queue.SimpleQueue()
        stop = threading.Event()
        done = object()

        def on_piece(b):
            q.put(b)
            return not stop.is_set()

        def work():
            try:
                self._run(prompt, n_predict, chat, system, sp, ignore_eos, on_piece)
                q.put(done)
            except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
                q.put(e)

        t = threading.Thread(target=work, name="nstf-stream", daemon=True)
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        t.start()
        try:
            while True:
                item = q.get()
                if item is done:
                    tail = dec.decode(b"", final=True)
                    if tail:
                        yield tail
                    return
                if isinstance(item, BaseException):
                    raise item
                text = dec.decode(item)
                if text:
                    yield text
        finally:
            stop.set()
            t.join()

    # ---- benchmark ----------------------------------------------------------------

    def bench(self, n_prompt=512, n_gen=128, reps=3, seed=0):
        """Prompt processing and generation speed, llama-bench style: pp =
        n_prompt random tokens evaluated as one prompt (wall time of the
        call, best and mean of reps), tg = n_gen tokens generated greedily
        past end-of-generation (the engine's own generation timer, decode
        steps only). Returns a dict with tokens/s figures."""
        if n_prompt < 1 or n_gen < 1 or reps < 1:
            raise Error("bench: n_prompt, n_gen and reps must be >= 1", 1, "invalid argument")
        rng = np.random.default_rng(seed)
        toks = rng.integers(0, self.n_vocab, size=n_prompt, dtype=np.int32)
        self.logits(toks[:min(8, n_prompt)], all=False)  # warm-up
        pp = []
        for _ in range(reps):
            t0 = time.perf_counter()
            self.logits(toks, all=False)
            pp.append(time.perf_counter() - t0)
        tg = []
        for _ in range(reps):
            self.generate_bytes("Once upon a time", n_predict=n_gen, temperature=0.0, ignore_eos=True)
            st = self.last_stats
            if st["n_decode"] > 0 and st["gen_ms"] > 0:
                tg.append(st["n_decode"] * 1e3 / st["gen_ms"])
        return {
            "backend": self.backend,
            "device": self.device,
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "reps": reps,
            "pp_tokens_per_s": n_prompt / (sum(pp) / len(pp)),
            "pp_best_tokens_per_s": n_prompt / min(pp),
            "tg_tokens_per_s": sum(tg) / len(tg) if tg else float("nan"),
        }
