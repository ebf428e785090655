"""test_torch_ops.py — the PyTorch ops of nstf.torch on the CPU (their
reference path; the GPU kernels are checked by test_torch_gpu.py, which
scripts/device/python_check.sh runs). NSTF_PY_FULL=1 runs the slow checks
that make test's quick run leaves out (stated where they are).

  - every op is registered under torch.ops.nstf and passes
    torch.library.opcheck (schema, fake tensors, autograd registration,
    AOT dispatch with dynamic shapes) on bf16 and float32 inputs;
  - gradcheck in float64 of every op with a backward of its own (conv2d's
    is PyTorch's convolution_backward);
  - the references agree with independent PyTorch formulations: attention
    with scaled_dot_product_attention / an explicit mask (max abs error
    <= 1e-12 in float64), RoPE with HF's rotate_half form, RMSNorm,
    SwiGLU, the packed SwiGLU GEMM with the unfused one (1e-12), conv2d
    (the library's C reference, through the descriptor) with F.conv2d in
    NCHW and channels_last (max abs error <= 1e-5 in float32), the
    quantized GEMV with a matmul over the dequantized weight, and Q8_0
    round trips within half a quantization step;
  - fake implementations give shapes, dtypes and memory formats on meta
    tensors, and torch.compile (aot_eager, fullgraph) traces a block of ops
    and gets eager's numbers;
  - nstf.hf.patch_llama on a tiny random float32 LlamaForCausalLM: logits
    within 1e-4 of the unpatched model (within 2^-6 of the largest logit
    with the norms patched too: their output is bf16), the same greedy generation with a
    KV cache, the same loss and gradients within 1e-4 after one training
    step, and unpatch_llama restores it."""

import os

import pytest
import torch
import torch.nn.functional as F

import nstf.torch as nt

ops = torch.ops.nstf
FULL = os.environ.get("NSTF_PY_FULL") == "1"
OPS = ["gemm", "gemm_swiglu", "flash_attn", "flash_attn_infer", "flash_attn_lse", "flash_attn_bwd", "rms_norm", "rope",
       "swiglu", "gemv_q", "dequant", "conv2d"]


def rnd(*shape, dtype=torch.float32, scale=1.0, grad=False, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % (1 << 31))
    t = (torch.randn(*shape, generator=g) * scale).to(dtype)
    return t.requires_grad_(grad)


def test_registered():
    for name in OPS:
        assert hasattr(ops, name), name


# ---- opcheck ------------------------------------------------------------------------

def cases(dtype):
    g = True
    q8 = nt.quantize(rnd(12, 64, seed=5), "q8_0")
    attn = [(rnd(2, 5, 4, 8, dtype=dtype, grad=g), rnd(2, 5, 2, 8, dtype=dtype, grad=g),
             rnd(2, 5, 2, 8, dtype=dtype, grad=g), 0.35),
            (rnd(1, 2, 4, 8, dtype=dtype, grad=g), rnd(1, 6, 1, 8, dtype=dtype, grad=g),
             rnd(1, 6, 1, 8, dtype=dtype, grad=g), 0.35)]

    def attn_bwd(q, k, v, scale):  # the backward's inputs: the forward's out and lse, an output gradient
        q, k, v = q.detach(), k.detach(), v.detach()
        out, lse = ops.flash_attn_lse(q, k, v, scale)
        return q, k, v, out, lse, rnd(*q.shape, dtype=dtype, seed=9), scale

    return {
        # flash_attn_infer has no backward (flash_attn takes flash_attn_lse for one)
        "flash_attn_infer": [tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in a) for a in attn],
        "flash_attn_lse": attn,
        "flash_attn_bwd": [attn_bwd(*a) for a in attn],
        "gemm": [(rnd(3, 5, 16, dtype=dtype, grad=g), rnd(24, 16, dtype=dtype, grad=g)),
                 (rnd(7, 16, dtype=dtype, grad=g), rnd(8, 16, dtype=dtype, grad=g), rnd(7, 8, grad=g), True)],
        "gemm_swiglu": [(rnd(6, 16, dtype=dtype, grad=g), rnd(64, 16, dtype=dtype, grad=g))],
        "flash_attn": attn,
        "rms_norm": [(rnd(4, 32, grad=g), rnd(32, grad=g), 1e-5),
                     (rnd(2, 3, 32, grad=g), rnd(32, grad=g), 1e-5, rnd(2, 3, 32, dtype=dtype, grad=g))],
        "rope": [(rnd(2, 3, 4, 8, dtype=dtype, grad=g), rnd(2, 3, 2, 8, dtype=dtype, grad=g),
                  torch.arange(6, dtype=torch.int32).reshape(2, 3), 10000.0, True),
                 (rnd(5, 2, 8, dtype=dtype, grad=g), rnd(5, 1, 8, dtype=dtype, grad=g),
                  torch.tensor([0, 3, 7, 100, 2], dtype=torch.int32), 500000.0, False)],
        "swiglu": [(rnd(3, 10, dtype=dtype, grad=g), rnd(3, 10, dtype=dtype, grad=g))],
        "gemv_q": [(q8, nt.type_id("q8_0"), rnd(3, 64, dtype=dtype, grad=g))],
        "dequant": [(q8, nt.type_id("q8_0"))],
        "conv2d": [(rnd(2, 4, 7, 9, dtype=dtype, grad=g), rnd(6, 2, 3, 3, dtype=dtype, grad=g), rnd(6, grad=g),
                    [2, 1], [1, 1], [1, 2], 2, -1),
                   (rnd(1, 8, 6, 5, dtype=dtype, grad=g).contiguous(memory_format=torch.channels_last),
                    rnd(4, 8, 3, 3, dtype=dtype, grad=g).contiguous(memory_format=torch.channels_last), None,
                    [1, 1], [0, 1], [1, 1], 1, -1)],
    }


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", OPS)
def test_opcheck(name, dtype):
    # With NSTF_PY_FULL=1, every check in bf16 (the GPU dtype); float32
    # without the AOT dispatch check, the slow one (a compile per case),
    # which bf16 already covered. make test's quick run leaves the AOT
    # dispatch check to test_compile (a traced block of the ops).
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    if FULL and dtype == torch.bfloat16:
        utils += ("test_aot_dispatch_dynamic",)
    for args in cases(dtype)[name]:
        torch.library.opcheck(getattr(ops, name).default, args, test_utils=utils)


# ---- gradcheck in float64 ------------------------------------------------------------------

def d64(*shape, seed=0):
    return rnd(*shape, dtype=torch.float64, grad=True, seed=seed)


def test_gradcheck():
    # the full Jacobians with NSTF_PY_FULL=1; make test's quick run checks
    # random projections of them (gradcheck's fast_mode)
    def gc(fn, args):
        return torch.autograd.gradcheck(fn, args, fast_mode=not FULL)

    assert gc(lambda a, w, r: ops.gemm(a, w, r), (d64(2, 3, 8), d64(5, 8, seed=1), d64(2, 3, 5, seed=2)))
    assert gc(lambda a, w: ops.gemm_swiglu(a, w), (d64(3, 8), d64(32, 8, seed=1)))
    assert gc(lambda q, k, v: ops.flash_attn(q, k, v, 0.4), (d64(1, 3, 4, 4), d64(1, 5, 2, 4, seed=1),
                                                            d64(1, 5, 2, 4, seed=2)))
    assert gc(lambda x, w, r: ops.rms_norm(x, w, 1e-6, r), (d64(3, 8), d64(8, seed=1), d64(3, 8, seed=2)))
    pos = torch.tensor([[0, 5, 9]], dtype=torch.int32)
    for neox in (True, False):
        assert gc(lambda q, k: ops.rope(q, k, pos, 10000.0, neox), (d64(1, 3, 2, 6), d64(1, 3, 1, 6, seed=1)))
    assert gc(lambda g, u: ops.swiglu(g, u), (d64(4, 5), d64(4, 5, seed=1)))
    q4 = nt.quantize(rnd(6, 32, seed=3), "q4_1")
    assert gc(lambda x: ops.gemv_q(q4, nt.type_id("q4_1"), x), (d64(2, 32),))


# ---- references against independent formulations --------------------------------------------

def test_attention_reference():
    q, k, v = rnd(2, 7, 6, 16, dtype=torch.float64), rnd(2, 7, 2, 16, dtype=torch.float64, seed=1), \
        rnd(2, 7, 2, 16, dtype=torch.float64, seed=2)
    got = ops.flash_attn(q, k, v, 0.25)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(3, 1),
                                          v.transpose(1, 2).repeat_interleave(3, 1), is_causal=True,
                                          scale=0.25).transpose(1, 2)
    assert (got - want).abs().max() <= 1e-12
    # queries after a cache: the last 3 rows of a full causal attention
    kc, vc = rnd(2, 9, 2, 16, dtype=torch.float64, seed=3), rnd(2, 9, 2, 16, dtype=torch.float64, seed=4)
    qf = rnd(2, 9, 6, 16, dtype=torch.float64, seed=5)
    full = ops.flash_attn(qf, kc, vc, 0.25)
    part = ops.flash_attn(qf[:, 6:].contiguous(), kc, vc, 0.25)
    assert (full[:, 6:] - part).abs().max() <= 1e-12


def _sdpa_grads(q, k, v, dout, scale):
    """q's, k's and v's gradients through torch's scaled_dot_product_attention
    (queries at the end of the keys, kv heads repeated over their groups)."""
    H, Hkv, Tq, Tk = q.shape[2], k.shape[2], q.shape[1], k.shape[1]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    mask = torch.arange(Tk)[None, :] <= (torch.arange(Tq) + Tk - Tq)[:, None]
    o = F.scaled_dot_product_attention(leaves[0].transpose(1, 2),
                                       leaves[1].transpose(1, 2).repeat_interleave(H // Hkv, 1),
                                       leaves[2].transpose(1, 2).repeat_interleave(H // Hkv, 1), attn_mask=mask,
                                       scale=scale).transpose(1, 2)
    return torch.autograd.grad(o, leaves, dout)


@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,D", [(2, 7, 7, 6, 2, 16), (1, 3, 9, 4, 4, 8), (2, 1, 6, 4, 1, 8)])
def test_attention_backward_reference(B, Tq, Tk, H, Hkv, D):
    """flash_attn_lse and flash_attn_bwd (the backward's formulas from the
    saved lse, not autograd) against torch's SDPA and its autograd in
    float64: max abs error <= 1e-12."""
    q, k, v = rnd(B, Tq, H, D, dtype=torch.float64, seed=1), rnd(B, Tk, Hkv, D, dtype=torch.float64, seed=2), \
        rnd(B, Tk, Hkv, D, dtype=torch.float64, seed=3)
    dout = rnd(B, Tq, H, D, dtype=torch.float64, seed=4)
    scale = D ** -0.5
    out, lse = ops.flash_attn_lse(q, k, v, scale)
    assert lse.shape == (B, Tq, H) and lse.dtype == torch.float64
    s = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(H // Hkv, 2)) * scale
    s = s.masked_fill(torch.arange(Tk)[None, :] > (torch.arange(Tq) + Tk - Tq)[:, None], float("-inf"))
    assert (lse - torch.logsumexp(s, -1).transpose(1, 2)).abs().max() <= 1e-12
    assert (out - ops.flash_attn_infer(q, k, v, scale)).abs().max() <= 1e-12
    got = ops.flash_attn_bwd(q, k, v, out, lse, dout, scale)
    for name, g, w in zip("qkv", got, _sdpa_grads(q, k, v, dout, scale)):
        assert g.shape == w.shape and (g - w).abs().max() <= 1e-12, name
    # float32 and bf16 inputs: fp32 lse, gradients in the inputs' dtype
    for dt in (torch.float32, torch.bfloat16):
        o32, l32 = ops.flash_attn_lse(q.to(dt), k.to(dt), v.to(dt), scale)
        assert o32.dtype == dt and l32.dtype == torch.float32
        g32 = ops.flash_attn_bwd(q.to(dt), k.to(dt), v.to(dt), o32, l32, dout.to(dt), scale)
        assert [t.dtype for t in g32] == [dt] * 3


def test_attention_dispatch(record_ops):
    """flash_attn runs flash_attn_lse when a gradient is wanted and its
    backward is flash_attn_bwd (the kernel's on a GPU); flash_attn_infer
    otherwise; the lse is not differentiable."""
    q, k, v = rnd(1, 4, 2, 8, grad=True, seed=1), rnd(1, 4, 1, 8, grad=True, seed=2), rnd(1, 4, 1, 8, grad=True, seed=3)
    with record_ops() as fwd:
        o = ops.flash_attn(q, k, v, 0.3)
    with record_ops() as bwd:
        o.sum().backward()
    assert "nstf.flash_attn_lse.default" in fwd.ops and "nstf.flash_attn_infer.default" not in fwd.ops
    assert "nstf.flash_attn_bwd.default" in bwd.ops
    assert all(t.grad is not None for t in (q, k, v))
    with torch.no_grad(), record_ops() as inf:
        ops.flash_attn(q, k, v, 0.3)
    assert "nstf.flash_attn_infer.default" in inf.ops and "nstf.flash_attn_lse.default" not in inf.ops
    with record_ops() as nograd:
        ops.flash_attn(q.detach(), k.detach(), v.detach(), 0.3)
    assert "nstf.flash_attn_infer.default" in nograd.ops
    out, lse = ops.flash_attn_lse(q, k, v, 0.3)
    assert out.requires_grad and not lse.requires_grad


def test_autocast():
    """Under autocast the ops take float32 in as bf16 (as on a GPU) and the
    gradients reach the float32 leaves in float32."""
    x, w = rnd(3, 16, seed=1, grad=True), rnd(8, 16, seed=2, grad=True)
    q, k, v = rnd(1, 4, 2, 8, grad=True, seed=3), rnd(1, 4, 1, 8, grad=True, seed=4), rnd(1, 4, 1, 8, grad=True, seed=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ops.gemm(x, w)
        o = ops.flash_attn(q, k, v, 0.3)
    assert y.dtype == torch.bfloat16 and o.dtype == torch.bfloat16
    (y.float().sum() + o.float().sum()).backward()
    for t in (x, w, q, k, v):
        assert t.grad is not None and t.grad.dtype == torch.float32
    # a backward inside the autocast region: the attention backward takes
    # the saved lse in fp32 as it is, so the same gradients
    want = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ops.flash_attn(q, k, v, 0.3).float().sum().backward()
    for t, g in zip((q, k, v), want):
        assert torch.equal(t.grad, g)
    # the float32 product of the bf16-rounded inputs, rounded to bf16 (half an ulp: at most 2^-8 relative)
    ref = x.detach().to(torch.bfloat16).float() @ w.detach().to(torch.bfloat16).float().t()
    assert ((y.float() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-30).all()

def test_rope_reference():
    q, k = rnd(2, 5, 4, 8, dtype=torch.float64), rnd(2, 5, 2, 8, dtype=torch.float64, seed=1)
    pos = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    rq, rk = ops.rope(q, k, pos.to(torch.int32), 10000.0, True)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    emb = torch.cat([pos[..., None] * inv, pos[..., None] * inv], -1)[:, :, None, :]
    rh = lambda t: torch.cat([-t[..., 4:], t[..., :4]], -1)  # noqa: E731 - HF's rotate_half
    assert (rq - (q * emb.cos() + rh(q) * emb.sin())).abs().max() <= 1e-12
    assert (rk - (k * emb.cos() + rh(k) * emb.sin())).abs().max() <= 1e-12
    # adjacent pairs: the same rotation on the de-interleaved halves
    nq, _ = ops.rope(q, k, pos.to(torch.int32), 10000.0, False)
    perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])
    nq2, _ = ops.rope(q[..., perm], k[..., perm], pos.to(torch.int32), 10000.0, True)
    assert (nq[..., perm] - nq2).abs().max() <= 1e-12


def test_norm_swiglu_reference():
    x, w, r = rnd(3, 16, dtype=torch.float64), rnd(16, dtype=torch.float64, seed=1), rnd(3, 16, dtype=torch.float64,
                                                                                          seed=2)
    y, s = ops.rms_norm(x, w, 1e-6, r)
    assert (s - (x + r)).abs().max() == 0
    assert (y - (x + r) * torch.rsqrt(((x + r) ** 2).mean(-1, keepdim=True) + 1e-6) * w).abs().max() <= 1e-12
    y32, s32 = ops.rms_norm(x.float(), w.float(), 1e-6)
    assert y32.dtype == torch.bfloat16 and s32.dtype == torch.float32
    g, u = rnd(4, 6, dtype=torch.float64), rnd(4, 6, dtype=torch.float64, seed=1)
    assert (ops.swiglu(g, u) - F.silu(g) * u).abs().max() <= 1e-12
    a, wg, wu = rnd(5, 8, dtype=torch.float64), rnd(32, 8, dtype=torch.float64, seed=1), \
        rnd(32, 8, dtype=torch.float64, seed=2)
    fused = ops.gemm_swiglu(a, nt.pack_swiglu(wg, wu))
    assert (fused - F.silu(a @ wg.t()) * (a @ wu.t())).abs().max() <= 1e-12


def test_pack_swiglu_layout():
    n_ff, k = 48, 4
    gate = torch.arange(n_ff * k, dtype=torch.float32).reshape(n_ff, k)
    up = -gate - 1
    packed = nt.pack_swiglu(gate, up)
    stacked = torch.cat([gate, up])
    # gpu_api.h: packed row p holds stacked row (p/32)*16 + p%32 for p%32 < 16, else n_ff + (p/32)*16 + p%32 - 16
    for p in range(2 * n_ff):
        grp, r = divmod(p, 32)
        src = grp * 16 + r if r < 16 else n_ff + grp * 16 + r - 16
        assert torch.equal(packed[p], stacked[src]), p
    if nt.available():
        from nstf import _lib
        lib = _lib.gpu()
        for p in range(2 * n_ff):
            assert torch.equal(packed[p], stacked[lib.nstf_gpu_swiglu_packed_row(p, n_ff)])


@pytest.mark.parametrize("nhwc", [False, True])
def test_conv2d_reference(nhwc):
    mf = torch.channels_last if nhwc else torch.contiguous_format
    for (n, c, h, w, k, r, s, st, pad, dil, g) in [(2, 6, 9, 11, 4, 3, 3, (2, 1), (1, 0), (1, 2), 2),
                                                    (1, 3, 13, 12, 5, 7, 7, (2, 2), (3, 3), (1, 1), 1),
                                                    (2, 8, 7, 7, 8, 3, 3, (1, 1), (2, 2), (2, 2), 8)]:
        x = rnd(n, c, h, w, seed=1).contiguous(memory_format=mf)
        wt = rnd(k, c // g, r, s, seed=2, scale=0.3).contiguous(memory_format=mf)
        b = rnd(k, seed=3)
        y = ops.conv2d(x, wt, b, list(st), list(pad), list(dil), g)
        want = F.conv2d(x.double(), wt.double(), b.double(), st, pad, dil, g)
        assert y.shape == want.shape and y.dtype == torch.float32
        assert y.is_contiguous(memory_format=mf)
        assert (y.double() - want).abs().max() <= 1e-5
    with pytest.raises(Exception, match="groups"):
        ops.conv2d(rnd(1, 6, 5, 5), rnd(4, 3, 3, 3), None, [1, 1], [0, 0], [1, 1], 3)


def test_quantized():
    w = rnd(16, 64, seed=7)
    # per-element bound, in units of the block's largest magnitude: half a
    # step (Q4_0: a whole step, where +max clips to 7), plus the fp16
    # rounding of the scale (and Q4_1's minimum) times the largest code
    for name, bound in (("q8_0", 0.5 / 127 + 2 ** -10), ("q4_0", 1 / 8 + 2 ** -9), ("q4_1", 1 / 15 + 2 ** -9)):
        q = nt.quantize(w, name)
        bb = {"q8_0": 34, "q4_0": 18, "q4_1": 20}[name]
        assert q.dtype == torch.uint8 and q.shape == (16, 64 // 32 * bb)
        dq = nt.dequantize(q, name)
        amax = w.reshape(16, 2, 32).abs().amax(-1, keepdim=True)
        err = (dq.reshape(16, 2, 32) - w.reshape(16, 2, 32)).abs()
        assert (err <= bound * amax).all(), (name, (err / amax).max())
        x = rnd(3, 64, seed=8)
        assert (ops.gemv_q(q, nt.type_id(name), x) - x @ dq.t()).abs().max() <= 1e-5
    with pytest.raises(Exception):
        nt.quantize(rnd(2, 33), "q8_0")


# ---- fake tensors and torch.compile ---------------------------------------------------------------

def test_meta_shapes():
    m = torch.device("meta")
    a = torch.empty(4, 7, 32, device=m, dtype=torch.bfloat16)
    assert ops.gemm(a, torch.empty(48, 32, device=m, dtype=torch.bfloat16)).shape == (4, 7, 48)
    assert ops.gemm(a, torch.empty(48, 32, device=m, dtype=torch.bfloat16), None, True).dtype == torch.float32
    assert ops.gemm_swiglu(a, torch.empty(64, 32, device=m, dtype=torch.bfloat16)).shape == (4, 7, 32)
    q = torch.empty(2, 3, 8, 64, device=m, dtype=torch.bfloat16)
    kv = torch.empty(2, 10, 2, 64, device=m, dtype=torch.bfloat16)
    assert ops.flash_attn(q, kv, kv, 0.125).shape == q.shape
    out, lse = ops.flash_attn_lse(q, kv, kv, 0.125)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and lse.shape == (2, 3, 8) and lse.dtype == torch.float32
    dq, dk, dv = ops.flash_attn_bwd(q, kv, kv, out, lse, out, 0.125)
    assert dq.shape == q.shape and dk.shape == kv.shape and dv.shape == kv.shape and dk.dtype == torch.bfloat16
    y, s = ops.rms_norm(torch.empty(5, 64, device=m), torch.empty(64, device=m), 1e-5)
    assert y.dtype == torch.bfloat16 and s.dtype == torch.float32 and y.shape == (5, 64)
    x = torch.empty(2, 16, 56, 56, device=m, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    w = torch.empty(32, 16, 3, 3, device=m, dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    y = ops.conv2d(x, w, None, [2, 2], [1, 1], [1, 1], 1)
    assert y.shape == (2, 32, 28, 28) and y.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError):
        ops.gemm(a, torch.empty(48, 31, device=m, dtype=torch.bfloat16))


def test_compile():
    def block(x, w_qkv, w_o, wn, pos):
        h, s = ops.rms_norm(x, wn, 1e-5)
        qkv = ops.gemm(h.float(), w_qkv)
        q, k, v = qkv.split([64, 32, 32], -1)
        q, k = ops.rope(q.reshape(1, -1, 4, 16), k.reshape(1, -1, 2, 16), pos, 10000.0, True)
        o = ops.flash_attn(q, k, v.reshape(1, -1, 2, 16), 0.25)
        return ops.gemm(o.reshape(-1, 64), w_o, s)

    x, wq, wo, wn = rnd(6, 32), rnd(128, 32, seed=1), rnd(32, 64, seed=2), rnd(32, seed=3)
    pos = torch.arange(6, dtype=torch.int32)[None]
    eager = block(x, wq, wo, wn, pos)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)
    assert torch.equal(compiled(x, wq, wo, wn, pos), eager)
    # and its backward: the joint graph traced through the ops' autograd
    # (flash_attn_lse and flash_attn_bwd for the attention), eager's gradients
    leaves = [t.clone().requires_grad_() for t in (x, wq, wo, wn)]
    block(*leaves, pos).square().sum().backward()
    cleaves = [t.clone().requires_grad_() for t in (x, wq, wo, wn)]
    torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)(*cleaves, pos).square().sum().backward()
    for a, b in zip(leaves, cleaves):
        assert torch.equal(a.grad, b.grad)


# ---- HF Llama with NSTF's blocks ---------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama(make_llama):
    return make_llama(97, 64, 96, 4, 2, 16).eval()


def test_hf_llama_patch(tiny_llama):
    from nstf.hf import patch_llama, unpatch_llama

    m = tiny_llama
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m(ids).logits
        gen_ref = m.generate(ids[:1], max_new_tokens=6, do_sample=False)
    # nstf::rms_norm gives y in bf16 (the kernels' activation type): with
    # the norms patched too, the logits move by the bf16 rounding of the
    # normed activations, a relative 2^-9 per element; bound: 2^-6 of the
    # largest logit
    patch_llama(m, norms=True)
    try:
        with torch.no_grad():
            got = m(ids).logits
        assert (got - ref).abs().max() <= 2 ** -6 * ref.abs().max()
    finally:
        unpatch_llama(m)
    patch_llama(m)
    try:
        with torch.no_grad():
            got = m(ids).logits
            gen = m.generate(ids[:1], max_new_tokens=6, do_sample=False)
        assert (got - ref).abs().max() <= 1e-4
        assert torch.equal(gen, gen_ref)
        # one training step: loss and gradients
        m.train()
        m.zero_grad()
        loss = m(ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    finally:
        unpatch_llama(m)
    m.zero_grad()
    loss_ref = m(ids, labels=ids).loss
    loss_ref.backward()
    m.eval()
    assert abs(loss.item() - loss_ref.item()) <= 1e-5
    for n, p in m.named_parameters():
        assert (grads[n] - p.grad).abs().max() <= 1e-4, n
    with torch.no_grad():
        assert torch.equal(m(ids).logits, ref)  # unpatched: HF's own path again
