"""torch.py — NSTF's kernels as PyTorch custom ops (torch.library), in the
namespace nstf, registered when this module is imported:

    torch.ops.nstf.gemm(a, w, residual=None, out_f32=False)       a @ w.T (+ residual)
    torch.ops.nstf.gemm_swiglu(a, w_packed)                       silu(a Wg^T) * (a Wu^T), fused
    torch.ops.nstf.flash_attn(q, k, v, scale)                     causal GQA attention
      (flash_attn_infer, flash_attn_lse, flash_attn_bwd: the forward and backward it runs)
    torch.ops.nstf.rms_norm(x, weight, eps, residual=None)        (y, x + residual)
    torch.ops.nstf.rope(q, k, pos, base, neox)                    rotary embedding of q and k
    torch.ops.nstf.swiglu(gate, up)                               silu(gate) * up
    torch.ops.nstf.gemv_q(w, wtype, x)                            x @ dequant(w).T, w as stored
    torch.ops.nstf.dequant(w, wtype)                              the stored rows as float32
    torch.ops.nstf.conv2d(x, w, bias, stride, padding, dilation, groups, level)

On CUDA tensors (and HIP tensors of a ROCm build of torch, which torch also
calls "cuda") each op runs NSTF's kernel through its C launcher
(src/ops/gpu/gpu_api.h, in libnstf.so, through ctypes) on torch's current
stream: bf16 in, bf16 out (fp32 where stated), fp32 accumulation. On any
other device the op runs its reference in PyTorch (or in the library's C
reference for conv2d and the quantized blocks): the semantics the kernels
are tested against, so the ops run, trace and pass opcheck anywhere, and
accept float32/float64 there (gradcheck runs in float64 on the CPU).

Every op has a fake (meta) implementation, so torch.compile and
torch.export trace through them. Autograd: gemm, gemm_swiglu, rms_norm,
rope, swiglu and the activations of gemv_q have their backward formulas
here (the matrix products of a backward run on torch.matmul); conv2d's
backward is PyTorch's convolution_backward; flash_attn's is NSTF's
attention backward from the forward's saved log-sum-exp (nstf._attn_ops:
flash_attn is composite over flash_attn_lse / flash_attn_bwd for training
and flash_attn_infer for inference, ops of their own).

Under torch.autocast (CUDA, and the CPU alike), the ops that take bf16 on a
GPU (gemm, gemm_swiglu, the attention forwards, rope, swiglu, gemv_q,
conv2d) cast their floating inputs to bf16, as autocast does for torch's
matmuls (gemm's residual included); rms_norm takes float32 as it is."""

import ctypes
from typing import List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from . import _lib as L
from ._attn_ops import attention_reference
from ._ops_base import _BF16, _cuda_bf16, _dense, _launch, _need, _out_dtype, _p, _ref_dtype, available
from .model import _check

__all__ = ["pack_swiglu", "quantize", "dequantize", "type_id", "attention_reference", "available"]

# ---- gemm ---------------------------------------------------------------------

def _gemm_check(a, w, residual):
    _need(w.dim() == 2 and a.dim() >= 1 and a.shape[-1] == w.shape[1],
          f"gemm: a {tuple(a.shape)} and w {tuple(w.shape)} do not multiply (w is [N, K])")
    if residual is not None:
        _need(tuple(residual.shape) == (*a.shape[:-1], w.shape[0]),
              f"gemm: residual {tuple(residual.shape)} is not the output's shape")


@torch.library.custom_op("nstf::gemm", mutates_args=())
def gemm(a: Tensor, w: Tensor, residual: Optional[Tensor] = None, out_f32: bool = False) -> Tensor:
    """a @ w.T (+ residual): a [..., K], w [N, K] (an nn.Linear weight),
    residual [..., N] fp32 or bf16; out [..., N] bf16, fp32 with out_f32. On
    a GPU: NSTF's GEMM on the matrix units (wgmma on Hopper), or its GEMV for
    at most 8 rows without a residual; K % 8 == 0."""
    _gemm_check(a, w, residual)
    ct = _ref_dtype(a)
    c = torch.matmul(a.to(ct), w.to(ct).t())
    if residual is not None:
        c = c + residual.to(ct)
    return c.to(_out_dtype(a, out_f32)).contiguous()


@gemm.register_kernel("cuda")
def _gemm_cuda(a, w, residual=None, out_f32=False):
    _gemm_check(a, w, residual)
    _cuda_bf16("gemm", a, w)
    lib, stream = _launch(a)
    K, N = a.shape[-1], w.shape[0]
    a2, w2 = _dense(a.reshape(-1, K)), _dense(w)
    M = a2.shape[0]
    out = torch.empty((*a.shape[:-1], N), dtype=torch.float32 if out_f32 else _BF16, device=a.device)
    if M == 0 or N == 0:
        return out
    ct = L.TYPE_F32 if out_f32 else L.TYPE_BF16
    if residual is None and M <= 8:
        st = lib.nstf_gpu_gemv(L.TYPE_BF16, _p(w2), _p(a2), _p(out), ct, M, K, N, stream)
    else:
        _need(K % 8 == 0, f"gemm on a GPU needs K % 8 == 0 (K = {K})")
        r = None
        if residual is not None:
            _need(residual.dtype in (torch.float32, _BF16), "gemm: the residual is fp32 or bf16")
            r = _dense(residual.reshape(-1, N), 4)
        rt = L.TYPE_BF16 if r is not None and r.dtype == _BF16 else L.TYPE_F32
        st = lib.nstf_gpu_gemm_bf16(_p(a2), _p(w2), _p(out), ct, _p(r), rt, M, N, K, 1 if r is not None else 0, stream)
    _check(lib, st)
    return out


@gemm.register_fake
def _gemm_fake(a, w, residual=None, out_f32=False):
    _gemm_check(a, w, residual)
    return a.new_empty((*a.shape[:-1], w.shape[0]), dtype=_out_dtype(a, out_f32))


def _gemm_setup(ctx, inputs, output):
    a, w, residual, _ = inputs
    ctx.save_for_backward(a, w)
    ctx.res_dtype = None if residual is None else residual.dtype


def _gemm_backward(ctx, grad):
    a, w = ctx.saved_tensors
    g = grad.to(a.dtype)
    da = dw = dres = None
    if ctx.needs_input_grad[0]:
        da = torch.matmul(g, w.to(a.dtype))
    if ctx.needs_input_grad[1]:
        dw = torch.matmul(g.reshape(-1, g.shape[-1]).t(), a.reshape(-1, a.shape[-1])).to(w.dtype)
    if ctx.res_dtype is not None and ctx.needs_input_grad[2]:
        dres = grad.to(ctx.res_dtype)
    return da, dw, dres, None


gemm.register_autograd(_gemm_backward, setup_context=_gemm_setup)


# ---- gemm with the SwiGLU epilogue ---------------------------------------------------

def pack_swiglu(gate_w, up_w):
    """The weight nstf::gemm_swiglu takes: rows of [gate; up] interleaved in
    groups of 16 (gpu_api.h, NSTF_GEMM_EPI_SWIGLU: packed rows [32j, 32j+16)
    are gate rows [16j, 16j+16), rows [32j+16, 32j+32) the up rows of the
    same outputs). gate_w, up_w [n_ff, K] with n_ff % 16 == 0."""
    _need(gate_w.shape == up_w.shape and gate_w.dim() == 2 and gate_w.shape[0] % 16 == 0,
          f"pack_swiglu: gate {tuple(gate_w.shape)} and up {tuple(up_w.shape)} must be equal [n_ff, K], n_ff % 16 == 0")
    n_ff, k = gate_w.shape
    return torch.stack([gate_w.reshape(n_ff // 16, 16, k), up_w.reshape(n_ff // 16, 16, k)], 1).reshape(2 * n_ff, k)


def _unpack_swiglu_rows(h):
    """[..., 2 n_ff] rows of a packed product -> (gate, up), each [..., n_ff]."""
    n = h.shape[-1]
    v = h.reshape(*h.shape[:-1], n // 32, 2, 16)
    return v[..., 0, :].reshape(*h.shape[:-1], n // 2), v[..., 1, :].reshape(*h.shape[:-1], n // 2)


def _silu(x):
    return x * torch.sigmoid(x)


@torch.library.custom_op("nstf::gemm_swiglu", mutates_args=())
def gemm_swiglu(a: Tensor, w_packed: Tensor) -> Tensor:
    """silu(a Wg^T) * (a Wu^T) in one GEMM: w_packed = pack_swiglu(Wg, Wu)
    [2 n_ff, K], out [..., n_ff] (bf16 for bf16 inputs). On a GPU the SwiGLU
    is the GEMM's epilogue (nstf_gpu_gemm_bf16, NSTF_GEMM_EPI_SWIGLU)."""
    _need(w_packed.dim() == 2 and w_packed.shape[0] % 32 == 0 and a.shape[-1] == w_packed.shape[1],
          f"gemm_swiglu: a {tuple(a.shape)}, w_packed {tuple(w_packed.shape)} (rows % 32 == 0)")
    ct = _ref_dtype(a)
    gate, up = _unpack_swiglu_rows(torch.matmul(a.to(ct), w_packed.to(ct).t()))
    return (_silu(gate) * up).to(_out_dtype(a)).contiguous()


@gemm_swiglu.register_kernel("cuda")
def _gemm_swiglu_cuda(a, w_packed):
    _need(w_packed.dim() == 2 and w_packed.shape[0] % 32 == 0 and a.shape[-1] == w_packed.shape[1],
          f"gemm_swiglu: a {tuple(a.shape)}, w_packed {tuple(w_packed.shape)} (rows % 32 == 0)")
    _cuda_bf16("gemm_swiglu", a, w_packed)
    lib, stream = _launch(a)
    K, N = a.shape[-1], w_packed.shape[0]
    _need(K % 8 == 0, f"gemm_swiglu on a GPU needs K % 8 == 0 (K = {K})")
    a2, w2 = _dense(a.reshape(-1, K)), _dense(w_packed)
    out = torch.empty((*a.shape[:-1], N // 2), dtype=_BF16, device=a.device)
    if a2.shape[0]:
        _check(lib, lib.nstf_gpu_gemm_bf16(_p(a2), _p(w2), _p(out), L.TYPE_BF16, None, L.TYPE_F32, a2.shape[0], N, K,
                                           2, stream))
    return out


@gemm_swiglu.register_fake
def _gemm_swiglu_fake(a, w_packed):
    return a.new_empty((*a.shape[:-1], w_packed.shape[0] // 2), dtype=_out_dtype(a))


def _gemm_swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gemm_swiglu_backward(ctx, grad):
    a, w = ctx.saved_tensors
    ct = _ref_dtype(a)
    h = torch.matmul(a.to(ct), w.to(ct).t())  # recomputed: the fused forward keeps no pre-activations
    gate, up = _unpack_swiglu_rows(h)
    sg = torch.sigmoid(gate)
    g = grad.to(ct)
    dgate = g * up * sg * (1 + gate * (1 - sg))
    dup = g * gate * sg
    lead = h.shape[:-1]
    dh = torch.stack([dgate.reshape(*lead, -1, 16), dup.reshape(*lead, -1, 16)], -2).reshape(h.shape)
    da = torch.matmul(dh, w.to(ct)).to(a.dtype) if ctx.needs_input_grad[0] else None
    dw = (torch.matmul(dh.reshape(-1, dh.shape[-1]).t(), a.reshape(-1, a.shape[-1]).to(ct)).to(w.dtype)
          if ctx.needs_input_grad[1] else None)
    return da, dw


gemm_swiglu.register_autograd(_gemm_swiglu_backward, setup_context=_gemm_swiglu_setup)


# ---- RMSNorm with the residual add ------------------------------------------------------

def _norm_check(x, weight, residual):
    _need(weight.dim() == 1 and x.shape[-1] == weight.shape[0],
          f"rms_norm: x {tuple(x.shape)} and weight {tuple(weight.shape)}")
    if residual is not None:
        _need(residual.shape == x.shape, f"rms_norm: residual {tuple(residual.shape)} is not x's shape")


def _norm_dtypes(x):
    """(y, x_sum) dtypes: bf16 and fp32 (the residual stream), or float64
    for float64 inputs on the reference path."""
    return (torch.float64, torch.float64) if x.dtype == torch.float64 else (_BF16, torch.float32)


@torch.library.custom_op("nstf::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """The residual add fused into RMSNorm: s = x + residual (fp32, the
    residual stream), y = s * rsqrt(mean(s^2) + eps) * weight (bf16).
    Returns (y, s). x fp32 or bf16 [..., dim]; weight [dim]; residual fp32
    or bf16 or None. On a GPU: nstf_gpu_rmsnorm."""
    _norm_check(x, weight, residual)
    yd, sd = _norm_dtypes(x)
    s = x.to(sd) + (residual.to(sd) if residual is not None else 0)
    r = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    return (s * r * weight.to(sd)).to(yd).contiguous(), s.contiguous()


@rms_norm.register_kernel("cuda")
def _rms_norm_cuda(x, weight, eps, residual=None):
    _norm_check(x, weight, residual)
    lib, stream = _launch(x)
    dim = x.shape[-1]
    s = x.reshape(-1, dim).to(torch.float32).clone()  # the kernel adds the residual into it in place
    w = _dense(weight.to(torch.float32), 4)
    r, rt = None, L.TYPE_F32
    if residual is not None:
        _need(residual.dtype in (torch.float32, _BF16), "rms_norm: the residual is fp32 or bf16")
        r = _dense(residual.reshape(-1, dim), 4)
        rt = L.TYPE_BF16 if r.dtype == _BF16 else L.TYPE_F32
    y = torch.empty(x.shape, dtype=_BF16, device=x.device)
    if s.shape[0]:
        _check(lib, lib.nstf_gpu_rmsnorm(_p(s), _p(r), rt, _p(w), _p(y), s.shape[0], dim, float(eps), stream))
    return y, s.reshape(x.shape)


@rms_norm.register_fake
def _rms_norm_fake(x, weight, eps, residual=None):
    _norm_check(x, weight, residual)
    yd, sd = _norm_dtypes(x)
    return x.new_empty(x.shape, dtype=yd), x.new_empty(x.shape, dtype=sd)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, eps, residual = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps
    ctx.x_dtype = x.dtype
    ctx.res_dtype = None if residual is None else residual.dtype


def _rms_norm_backward(ctx, dy, ds):
    s, weight = ctx.saved_tensors
    ct = s.dtype
    w = weight.to(ct)
    r = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + ctx.eps)
    g = dy.to(ct) if dy is not None else torch.zeros_like(s)
    gw = g * w
    dsum = r * (gw - s * r * r * (gw * s).mean(-1, keepdim=True))
    if ds is not None:
        dsum = dsum + ds.to(ct)
    dweight = (g * s * r).reshape(-1, s.shape[-1]).sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
    dres = dsum.to(ctx.res_dtype) if ctx.res_dtype is not None and ctx.needs_input_grad[3] else None
    return dsum.to(ctx.x_dtype), dweight, None, dres


rms_norm.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


# ---- RoPE ---------------------------------------------------------------------------------

def _rope_check(q, k, pos):
    _need(q.dim() >= 2 and k.dim() == q.dim() and q.shape[:-2] == k.shape[:-2] and q.shape[-1] == k.shape[-1]
          and q.shape[-1] % 2 == 0, f"rope: q [..., H, D] and k [..., Hkv, D] (D even); got {tuple(q.shape)}, "
          f"{tuple(k.shape)}")
    _need(tuple(pos.shape) == tuple(q.shape[:-2]) and not pos.is_floating_point(),
          f"rope: pos {tuple(pos.shape)} must be integer positions of the tokens {tuple(q.shape[:-2])}")


def _rope_ref(x, pos, base, neox):
    D = x.shape[-1]
    half = D // 2
    inv = base ** (-torch.arange(0, half, dtype=torch.float64, device=x.device) * 2.0 / D)
    ang = pos.to(torch.float64)[..., None, None] * inv  # [..., 1, half]
    c, s = torch.cos(ang), torch.sin(ang)
    ct = _ref_dtype(x)
    xf = x.to(torch.float64)
    if neox:
        x0, x1 = xf[..., :half], xf[..., half:]
        y = torch.cat([x0 * c - x1 * s, x0 * s + x1 * c], -1)
    else:
        x0, x1 = xf[..., 0::2], xf[..., 1::2]
        y = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(xf.shape)
    return y.to(ct).to(x.dtype).contiguous()


@torch.library.custom_op("nstf::rope", mutates_args=())
def rope(q: Tensor, k: Tensor, pos: Tensor, base: float, neox: bool) -> Tuple[Tensor, Tensor]:
    """Rotary position embedding of q [..., H, D] and k [..., Hkv, D] at
    integer positions pos [...]: theta_i = pos * base^(-2i/D), rotating
    (x[i], x[i + D/2]) with neox (HF's rotate-half layout) or (x[2i], x[2i+1])
    (GGUF "llama"). Returns new tensors. On a GPU: nstf_gpu_rope_strided."""
    _rope_check(q, k, pos)
    return _rope_ref(q, pos, base, neox), _rope_ref(k, pos, base, neox)


@rope.register_kernel("cuda")
def _rope_cuda(q, k, pos, base, neox):
    _rope_check(q, k, pos)
    _cuda_bf16("rope", q, k)
    lib, stream = _launch(q)
    H, Hkv, D = q.shape[-2], k.shape[-2], q.shape[-1]
    qo, ko = q.contiguous().clone(), k.contiguous().clone()
    p = _dense(pos.reshape(-1).to(torch.int32), 4)
    n = p.shape[0]
    if n:
        _check(lib, lib.nstf_gpu_rope_strided(_p(qo), H * D, _p(ko), Hkv * D, _p(p), n, H, Hkv, D, float(base),
                                              None, 2 if neox else 0, stream))
    return qo, ko


@rope.register_fake
def _rope_fake(q, k, pos, base, neox):
    _rope_check(q, k, pos)
    return torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(
        k, memory_format=torch.contiguous_format)


def _rope_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])
    ctx.base, ctx.neox = inputs[3], inputs[4]


def _rope_backward(ctx, dq, dk):
    (pos,) = ctx.saved_tensors
    # a rotation's transpose is the rotation by -theta: the op at -pos
    gq, gk = torch.ops.nstf.rope(dq.contiguous(), dk.contiguous(), -pos, ctx.base, ctx.neox)
    return gq, gk, None, None, None


rope.register_autograd(_rope_backward, setup_context=_rope_setup)


# ---- SwiGLU -------------------------------------------------------------------------------

@torch.library.custom_op("nstf::swiglu", mutates_args=())
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, fp32 math, out in the inputs' dtype. On a GPU:
    nstf_gpu_swiglu."""
    _need(gate.shape == up.shape and gate.dtype == up.dtype, "swiglu: gate and up of one shape and dtype")
    ct = _ref_dtype(gate)
    return (_silu(gate.to(ct)) * up.to(ct)).to(gate.dtype).contiguous()


@swiglu.register_kernel("cuda")
def _swiglu_cuda(gate, up):
    _need(gate.shape == up.shape, "swiglu: gate and up of one shape")
    _cuda_bf16("swiglu", gate, up)
    lib, stream = _launch(gate)
    g, u = gate.contiguous(), up.contiguous()
    y = torch.empty(gate.shape, dtype=_BF16, device=gate.device)
    if y.numel():
        _check(lib, lib.nstf_gpu_swiglu(_p(g), _p(u), _p(y), y.numel(), stream))
    return y


@swiglu.register_fake
def _swiglu_fake(gate, up):
    _need(gate.shape == up.shape and gate.dtype == up.dtype, "swiglu: gate and up of one shape and dtype")
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, dy):
    gate, up = ctx.saved_tensors
    ct = _ref_dtype(gate)
    g, u, d = gate.to(ct), up.to(ct), dy.to(ct)
    sg = torch.sigmoid(g)
    return (d * u * sg * (1 + g * (1 - sg))).to(gate.dtype), (d * g * sg).to(up.dtype)


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


# ---- quantized GEMV -------------------------------------------------------------------------

# nstf_type -> (bytes per block, elements per block)
_BLOCKS = {L.TYPE_Q8_0: (34, 32), L.TYPE_Q4_0: (18, 32), L.TYPE_Q4_1: (20, 32), L.TYPE_BF16: (2, 1),
           L.TYPE_F16: (2, 1), L.TYPE_F32: (4, 1)}
_TYPE_NAMES = {"q8_0": L.TYPE_Q8_0, "q4_0": L.TYPE_Q4_0, "q4_1": L.TYPE_Q4_1, "bf16": L.TYPE_BF16,
               "f16": L.TYPE_F16, "f32": L.TYPE_F32}


def type_id(t):
    """The nstf_type id of a weight type name ("q8_0", "q4_0", "q4_1",
    "bf16", "f16", "f32"), as nstf::gemv_q takes it."""
    return _wtype(t)


def _wtype(t):
    if isinstance(t, str):
        _need(t.lower() in _TYPE_NAMES, f"unknown weight type {t!r} ({', '.join(_TYPE_NAMES)})")
        return _TYPE_NAMES[t.lower()]
    _need(int(t) in _BLOCKS, f"unknown weight type id {t}")
    return int(t)


def _n_in(w, wtype):
    bb, be = _BLOCKS[wtype]
    _need(w.dim() == 2 and w.dtype == torch.uint8 and w.shape[1] % bb == 0,
          f"gemv_q: w must be uint8 [n_out, row bytes] of whole {bb}-byte blocks; got {tuple(w.shape)} {w.dtype}")
    return w.shape[1] // bb * be


def quantize(w, wtype="q8_0"):
    """A float matrix [n_out, n_in] as the blocks nstf::gemv_q reads (uint8
    [n_out, row bytes], on w's device), by the library's own quantizer
    (core/dtype.h: GGUF's Q8_0 / Q4_0 / Q4_1 layouts)."""
    t = _wtype(wtype)
    lib = L.load()
    src = np.ascontiguousarray(w.detach().to("cpu", torch.float32).numpy())
    _need(src.ndim == 2, "quantize: a 2-D matrix")
    rb = L.c_uint64(0)
    _need(lib.nstf_type_row_bytes(t, src.shape[1], ctypes.byref(rb)),
          f"quantize: rows of {src.shape[1]} are not whole blocks of this type")
    out = np.empty((src.shape[0], rb.value), dtype=np.uint8)
    for i in range(src.shape[0]):
        lib.nstf_quantize_row(t, src[i].ctypes.data, out[i].ctypes.data, src.shape[1])
    return torch.from_numpy(out).to(w.device)


def dequantize(w, wtype):
    """The float32 matrix [n_out, n_in] of quantized blocks (the library's
    reference dequantization), on w's device."""
    t = _wtype(wtype)
    n_in = _n_in(w, t)
    lib = L.load()
    src = np.ascontiguousarray(w.detach().cpu().numpy())
    out = np.empty((src.shape[0], n_in), dtype=np.float32)
    for i in range(src.shape[0]):
        lib.nstf_dequantize_row(t, src[i].ctypes.data, out[i].ctypes.data, n_in)
    return torch.from_numpy(out).to(w.device)


@torch.library.custom_op("nstf::dequant", mutates_args=())
def dequant(w: Tensor, wtype: int) -> Tensor:
    """The float32 matrix [n_out, n_in] of stored rows w (uint8 [n_out, row
    bytes] of wtype), as dequantize() but an op, so a traced backward can
    use it. On a GPU: the embedding gather (nstf_gpu_get_rows) of every row."""
    return dequantize(w, wtype)


@dequant.register_kernel("cuda")
def _dequant_cuda(w, wtype):
    t = _wtype(wtype)
    n_in = _n_in(w, t)
    lib, stream = _launch(w)
    w2 = _dense(w)
    ids = torch.arange(w.shape[0], dtype=torch.int32, device=w.device)
    out = torch.empty((w.shape[0], n_in), dtype=torch.float32, device=w.device)
    if out.numel():
        _check(lib, lib.nstf_gpu_get_rows(t, _p(w2), w.shape[0], _p(ids), _p(out), L.TYPE_F32, w.shape[0], n_in,
                                          stream))
    return out


@dequant.register_fake
def _dequant_fake(w, wtype):
    return w.new_empty((w.shape[0], _n_in(w, _wtype(wtype))), dtype=torch.float32)


@torch.library.custom_op("nstf::gemv_q", mutates_args=())
def gemv_q(w: Tensor, wtype: int, x: Tensor) -> Tensor:
    """y = x @ dequant(w).T with the weight kept as stored: w uint8 [n_out,
    row bytes] of wtype (an nstf_type id: Q8_0 8, Q4_0 2, Q4_1 3, BF16 30,
    F16 1, F32 0; quantize() makes them), x [T, n_in] bf16, y [T, n_out] bf16.
    On a GPU: the decode GEMV with fused dequantization (nstf_gpu_gemv)."""
    t = _wtype(wtype)
    n_in = _n_in(w, t)
    _need(x.dim() == 2 and x.shape[1] == n_in, f"gemv_q: x {tuple(x.shape)} for rows of {n_in}")
    ct = _ref_dtype(x)
    return torch.matmul(x.to(ct), dequantize(w, t).to(ct).t()).to(_out_dtype(x)).contiguous()


@gemv_q.register_kernel("cuda")
def _gemv_q_cuda(w, wtype, x):
    t = _wtype(wtype)
    n_in = _n_in(w, t)
    _need(x.dim() == 2 and x.shape[1] == n_in, f"gemv_q: x {tuple(x.shape)} for rows of {n_in}")
    _cuda_bf16("gemv_q", x)
    lib, stream = _launch(x)
    w2, x2 = _dense(w), _dense(x)
    y = torch.empty((x.shape[0], w.shape[0]), dtype=_BF16, device=x.device)
    if y.numel():
        _check(lib, lib.nstf_gpu_gemv(t, _p(w2), _p(x2), _p(y), L.TYPE_BF16, x.shape[0], n_in, w.shape[0], stream))
    return y


@gemv_q.register_fake
def _gemv_q_fake(w, wtype, x):
    return x.new_empty((x.shape[0], w.shape[0]), dtype=_out_dtype(x))


def _gemv_q_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.wtype = inputs[1]
    ctx.x_dtype = inputs[2].dtype


def _gemv_q_backward(ctx, dy):
    (w,) = ctx.saved_tensors
    ct = _ref_dtype(dy)
    dx = torch.matmul(dy.to(ct), torch.ops.nstf.dequant(w, ctx.wtype).to(ct)).to(ctx.x_dtype)
    return None, None, dx  # the stored blocks are not trained


gemv_q.register_autograd(_gemv_q_backward, setup_context=_gemv_q_setup)


# ---- conv2d ---------------------------------------------------------------------------------

def _is_nhwc(x):
    """channels_last (and not also plain contiguous, as a 1-channel or 1x1 tensor is)"""
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def _conv_desc(x, w, stride, padding, dilation, groups):
    _need(x.dim() == 4 and w.dim() == 4 and len(stride) == 2 and len(padding) == 2 and len(dilation) == 2,
          "conv2d: x [N, C, H, W], w [K, C/groups, R, S], stride, padding and dilation of 2")
    _need(w.shape[1] * groups == x.shape[1], f"conv2d: w {tuple(w.shape)} with {groups} groups for x {tuple(x.shape)}")
    nhwc = _is_nhwc(x)
    d = L.ConvDesc(x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0], w.shape[2], w.shape[3], stride[0],
                   stride[1], padding[0], padding[1], dilation[0], dilation[1], groups, 1 if nhwc else 0)
    P, Q = L.c_int64(0), L.c_int64(0)
    lib = L.load()
    _check(lib, lib.nstf_conv2d_out_size(ctypes.byref(d), ctypes.byref(P), ctypes.byref(Q)))
    return d, nhwc, P.value, Q.value


def _conv_out(x, K, P, Q, nhwc, dtype):
    return torch.empty((x.shape[0], K, P, Q), dtype=dtype, device=x.device,
                       memory_format=torch.channels_last if nhwc else torch.contiguous_format)


def _mf(nhwc):
    return torch.channels_last if nhwc else torch.contiguous_format


@torch.library.custom_op("nstf::conv2d", mutates_args=())
def conv2d(x: Tensor, w: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
           dilation: List[int], groups: int, level: int = -1) -> Tensor:
    """F.conv2d(x, w, bias, stride, padding, dilation, groups): x [N, C, H, W]
    contiguous (NCHW) or channels_last (NHWC; w then laid out channels_last
    too), bf16 or fp32; out in x's memory format and dtype. On a GPU (bf16):
    level 0-4 of NSTF's convolution ladder (nstf_gpu_conv2d; -1 the fastest,
    the implicit GEMM on the matrix units). Elsewhere the library's fp64
    reference (nstf_ref_conv2d)."""
    d, nhwc, P, Q = _conv_desc(x, w, stride, padding, dilation, groups)
    _need(x.dtype in (_BF16, torch.float32) and w.dtype == x.dtype, "conv2d: bf16 or fp32 x and w of one dtype")
    xs = x.detach().to("cpu", torch.float32).contiguous(memory_format=_mf(nhwc))
    ws = w.detach().to("cpu", torch.float32).contiguous(memory_format=_mf(nhwc))
    b = None if bias is None else bias.detach().to("cpu", torch.float32).contiguous()
    y = torch.empty((x.shape[0], w.shape[0], P, Q), dtype=torch.float64, memory_format=_mf(nhwc))
    lib = L.load()
    _check(lib, lib.nstf_ref_conv2d(ctypes.byref(d), _p(xs), _p(ws), _p(b), _p(y)))
    return y.to(device=x.device, dtype=x.dtype).contiguous(memory_format=_mf(nhwc))


@conv2d.register_kernel("cuda")
def _conv2d_cuda(x, w, bias, stride, padding, dilation, groups, level=-1):
    d, nhwc, P, Q = _conv_desc(x, w, stride, padding, dilation, groups)
    _cuda_bf16("conv2d", x, w)
    lib, stream = _launch(x)
    xs, ws = x.contiguous(memory_format=_mf(nhwc)), w.contiguous(memory_format=_mf(nhwc))
    b = None if bias is None else bias.to(torch.float32).contiguous()
    y = _conv_out(x, w.shape[0], P, Q, nhwc, _BF16)
    _check(lib, lib.nstf_gpu_conv2d(ctypes.byref(d), int(level), _p(xs), _p(ws), _p(b), _p(y), L.TYPE_BF16, stream))
    return y


@conv2d.register_fake
def _conv2d_fake(x, w, bias, stride, padding, dilation, groups, level=-1):
    _need(x.dim() == 4 and w.dim() == 4, "conv2d: x [N, C, H, W], w [K, C/groups, R, S]")
    nhwc = _is_nhwc(x)
    P = (x.shape[2] + 2 * padding[0] - dilation[0] * (w.shape[2] - 1) - 1) // stride[0] + 1
    Q = (x.shape[3] + 2 * padding[1] - dilation[1] * (w.shape[3] - 1) - 1) // stride[1] + 1
    return _conv_out(x, w.shape[0], P, Q, nhwc, x.dtype)


def _conv2d_setup(ctx, inputs, output):
    x, w, bias, stride, padding, dilation, groups, _ = inputs
    ctx.save_for_backward(x, w)
    ctx.conf = (stride, padding, dilation, groups)
    ctx.has_bias = bias is not None


def _conv2d_backward(ctx, grad):
    x, w = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.conf
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    dx, dw, db = torch.ops.aten.convolution_backward(grad, x, w, [w.shape[0]] if ctx.has_bias else None, stride,
                                                     padding, dilation, False, [0, 0], groups, mask)
    return dx, dw, db, None, None, None, None, None


conv2d.register_autograd(_conv2d_backward, setup_context=_conv2d_setup)


# ---- autocast ---------------------------------------------------------------------------------

# Under torch.autocast the ops that take bf16 on a GPU cast their floating
# inputs to bf16 (on the CPU too, so that a model runs the same there); the
# gradients flow back through the casts to the float32 leaves. Not
# flash_attn_bwd: it takes the forward's saved bf16 tensors and fp32 lse as
# they are, also when a backward runs inside an autocast region.
for _name in ("gemm", "gemm_swiglu", "flash_attn_infer", "flash_attn_lse", "rope", "swiglu", "gemv_q", "conv2d"):
    for _dev in ("cuda", "cpu"):
        try:
            torch.library.register_autocast("nstf::" + _name, _dev, _BF16)
        except ValueError:  # a torch without autocast on that device
            pass
