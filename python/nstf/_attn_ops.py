"""_attn_ops.py — causal grouped-query flash attention as PyTorch ops
(registered by nstf.torch), forward and backward on NSTF's kernels:

    torch.ops.nstf.flash_attn(q, k, v, scale) -> out          the op to call
    torch.ops.nstf.flash_attn_infer(q, k, v, scale) -> out    inference forward
    torch.ops.nstf.flash_attn_lse(q, k, v, scale) -> (out, lse)   training forward
    torch.ops.nstf.flash_attn_bwd(q, k, v, out, lse, dout, scale) -> (dq, dk, dv)

q [B, Tq, H, D], k, v [B, Tk, Hkv, D]; query i sits at position Tk - Tq + i
and sees keys 0 .. Tk - Tq + i; query head h uses kv head h // (H / Hkv).

flash_attn is composite (CompositeImplicitAutograd), as PyTorch's own
scaled_dot_product_attention is over its flash kernels: when grad mode is on
and q, k or v requires grad it runs flash_attn_lse, which also returns the
log-sum-exp of each row's scaled scores (fp32, [B, Tq, H]; not
differentiable) and saves it, and whose backward is flash_attn_bwd;
otherwise flash_attn_infer (no lse; split-KV flash decoding for a few
queries). On CUDA tensors (bf16, head_dim 64 or 128; other shapes and dtypes
raise ValueError, as the forward always has) they run NSTF's launchers
through the library (src/ops/gpu/gpu_api.h): nstf_gpu_flash_attn /
nstf_gpu_flash_decode, nstf_gpu_flash_attn_lse and nstf_gpu_flash_attn_bwd
(FA2-style, the probabilities recomputed from the saved lse; dk, dv summed
over the query heads of each kv head). On other devices they run the
references here in PyTorch (float32 math for bf16 / float32 inputs, float64
for float64: gradcheck runs there), the backward from the formulas the
kernel computes (nstf_ref_attention_bwd), not from PyTorch's autograd."""

from typing import Tuple

import torch
from torch import Tensor

from ._ops_base import _BF16, _cuda_bf16, _dense, _launch, _need, _out_dtype, _p, _ref_dtype
from .model import _check


def _attn_check(q, k, v):
    _need(q.dim() == 4 and k.dim() == 4 and v.shape == k.shape and q.shape[0] == k.shape[0] and
          q.shape[3] == k.shape[3], f"flash_attn: q [B, Tq, H, D], k and v [B, Tk, Hkv, D]; got {tuple(q.shape)}, "
          f"{tuple(k.shape)}, {tuple(v.shape)}")
    _need(q.shape[2] % k.shape[2] == 0, f"flash_attn: {q.shape[2]} heads over {k.shape[2]} kv heads")
    _need(k.shape[1] >= q.shape[1], f"flash_attn: {q.shape[1]} queries after only {k.shape[1]} keys")


def _attn_grad_check(q, k, v, out, lse, dout):
    _attn_check(q, k, v)
    _need(out.shape == q.shape and dout.shape == q.shape and tuple(lse.shape) == tuple(q.shape[:3]),
          f"flash_attn_bwd: out {tuple(out.shape)} and dout {tuple(dout.shape)} of q's shape {tuple(q.shape)}, lse "
          f"{tuple(lse.shape)} [B, Tq, H]")


def _scores(q, k, v, scale):
    """(masked scaled scores [B, H, Tq, Tk], q, k, v [B, H, T, D] with the kv
    heads repeated over their query heads) in the reference precision."""
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    ct = _ref_dtype(q)
    qf = q.to(ct).transpose(1, 2)
    kf = k.to(ct).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    vf = v.to(ct).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    pos = torch.arange(Tq, device=q.device) + (Tk - Tq)
    mask = torch.arange(Tk, device=q.device)[None, :] > pos[:, None]
    return s.masked_fill(mask, float("-inf")), qf, kf, vf


def attention_reference(q, k, v, scale):
    """Causal grouped-query attention in PyTorch (the ops' reference): q [B,
    Tq, H, D], k, v [B, Tk, Hkv, D]; query i sits at position Tk - Tq + i
    and sees keys 0 .. Tk - Tq + i; query head h uses kv head h // (H / Hkv)."""
    _attn_check(q, k, v)
    s, _, _, vf = _scores(q, k, v, scale)
    return torch.matmul(torch.softmax(s, dim=-1), vf).transpose(1, 2)


def _gpu_attn(name, q, k, v, scale, with_lse):
    """NSTF's flash attention on CUDA tensors, one launch per sequence:
    (out, lse) with with_lse (nstf_gpu_flash_attn_lse), else (out, None)
    (nstf_gpu_flash_attn, or split-KV nstf_gpu_flash_decode for at most 16
    query rows per kv head)."""
    _attn_check(q, k, v)
    _cuda_bf16(name, q, k, v)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    _need(D in (64, 128), f"{name} on a GPU takes head_dim 64 or 128 (got {D})")
    out = torch.empty((B, Tq, H, D), dtype=_BF16, device=q.device)
    lse = torch.empty((B, Tq, H), dtype=torch.float32, device=q.device) if with_lse else None
    if B == 0 or Tq == 0:
        return out, lse
    lib, stream = _launch(q)
    q2, k2, v2 = _dense(q), _dense(k), _dense(v)
    pos0 = Tk - Tq
    decode = not with_lse and Tq * (H // Hkv) <= 16
    scratch, nbytes = None, 0
    if decode:
        nbytes = lib.nstf_gpu_flash_decode_scratch_bytes(Tq, pos0, H, Hkv, D)
        scratch = torch.empty(max(nbytes, 16), dtype=torch.uint8, device=q.device)
    # the cache the kernel attends over: rows [0, pos0) are the earlier keys;
    # the call writes this chunk's rows [pos0, Tk) itself. One pair serves
    # every sequence: the copies and launches are ordered on one stream.
    kc = torch.empty((Tk, Hkv, D), dtype=_BF16, device=q.device)
    vc = torch.empty((Tk, Hkv, D), dtype=_BF16, device=q.device)
    for b in range(B):
        if pos0:
            kc[:pos0].copy_(k2[b, :pos0])
            vc[:pos0].copy_(v2[b, :pos0])
        head = (_p(q2[b]), H * D, _p(k2[b, pos0:]), Hkv * D, _p(v2[b, pos0:]), Hkv * D, _p(kc), _p(vc), _p(out[b]),
                H * D)
        dims = (Tq, pos0, Tk, H, Hkv, D, float(scale))
        if with_lse:
            st = lib.nstf_gpu_flash_attn_lse(*head, _p(lse[b]), *dims, stream)
        elif decode:
            st = lib.nstf_gpu_flash_decode(*head, *dims, _p(scratch), nbytes, stream)
        else:
            st = lib.nstf_gpu_flash_attn(*head, *dims, stream)
        _check(lib, st)
    return out, lse


# ---- inference forward ---------------------------------------------------------------

@torch.library.custom_op("nstf::flash_attn_infer", mutates_args=())
def flash_attn_infer(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """The attention out [B, Tq, H, D] (bf16 for bf16 inputs) without the
    lse, not differentiable: what nstf::flash_attn runs when no gradient is
    wanted. On a GPU: NSTF's flash attention (online softmax, no score
    matrix), split-KV flash decoding for at most 16 query rows per kv head."""
    return attention_reference(q, k, v, scale).to(_out_dtype(q)).contiguous()


@flash_attn_infer.register_kernel("cuda")
def _flash_attn_infer_cuda(q, k, v, scale):
    return _gpu_attn("flash_attn", q, k, v, scale, False)[0]


@flash_attn_infer.register_fake
def _flash_attn_infer_fake(q, k, v, scale):
    _attn_check(q, k, v)
    return q.new_empty(q.shape, dtype=_out_dtype(q))


# ---- training forward: out and the log-sum-exp -------------------------------------------

@torch.library.custom_op("nstf::flash_attn_lse", mutates_args=())
def flash_attn_lse(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tuple[Tensor, Tensor]:
    """(out, lse): the attention and the natural log-sum-exp of each row's
    scaled, masked scores, lse [B, Tq, H] fp32 (float64 for float64 inputs
    on the reference path). Differentiable in q, k, v through out (lse is
    not): the backward is nstf::flash_attn_bwd from the saved lse. On a GPU:
    nstf_gpu_flash_attn_lse."""
    _attn_check(q, k, v)
    s, _, _, vf = _scores(q, k, v, scale)
    lse = torch.logsumexp(s, dim=-1)  # [B, H, Tq]
    out = torch.matmul(torch.softmax(s, dim=-1), vf).transpose(1, 2)  # as flash_attn_infer's, bit for bit
    return out.to(_out_dtype(q)).contiguous(), lse.transpose(1, 2).contiguous()


@flash_attn_lse.register_kernel("cuda")
def _flash_attn_lse_cuda(q, k, v, scale):
    return _gpu_attn("flash_attn", q, k, v, scale, True)


@flash_attn_lse.register_fake
def _flash_attn_lse_fake(q, k, v, scale):
    _attn_check(q, k, v)
    return q.new_empty(q.shape, dtype=_out_dtype(q)), q.new_empty(q.shape[:3], dtype=_ref_dtype(q))


def _flash_attn_lse_setup(ctx, inputs, output):
    q, k, v, scale = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale = scale


def _flash_attn_lse_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.nstf.flash_attn_bwd(q, k, v, out, lse, dout, ctx.scale)
    return dq, dk, dv, None


flash_attn_lse.register_autograd(_flash_attn_lse_backward, setup_context=_flash_attn_lse_setup)


# ---- backward ---------------------------------------------------------------------------------

@torch.library.custom_op("nstf::flash_attn_bwd", mutates_args=())
def flash_attn_bwd(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor,
                   scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv) of the attention from the forward's out and lse
    (nstf::flash_attn_lse) and the output gradient dout [B, Tq, H, D]; dk,
    dv [B, Tk, Hkv, D] summed over the query heads of each kv head; in the
    dtypes of q, k, v. Not differentiable itself. On a GPU:
    nstf_gpu_flash_attn_bwd."""
    with torch.autocast("cpu", enabled=False):  # a backward run inside an autocast region: fp32 math still
        return _attn_bwd_reference(q, k, v, out, lse, dout, scale)


def _attn_bwd_reference(q, k, v, out, lse, dout, scale):
    """flash_attn_bwd's reference: the kernel's formulas (attn_bwd.cu)"""
    _attn_grad_check(q, k, v, out, lse, dout)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    s, qf, kf, vf = _scores(q, k, v, scale)
    ct = qf.dtype
    do = dout.to(ct).transpose(1, 2)  # [B, H, Tq, D]
    p = torch.exp(s - lse.to(ct).transpose(1, 2)[..., None])  # P_tj from the saved lse; masked: exp(-inf) = 0
    dsum = (do * out.to(ct).transpose(1, 2)).sum(-1, keepdim=True)  # D_t = dO_t . O_t
    ds = p * (torch.matmul(do, vf.transpose(-1, -2)) - dsum)  # dS_tj = P_tj (dO_t . v_j - D_t)
    dq = torch.matmul(ds, kf) * scale
    g = H // Hkv
    dk = (torch.matmul(ds.transpose(-1, -2), qf) * scale).reshape(B, Hkv, g, Tk, D).sum(2)
    dv = torch.matmul(p.transpose(-1, -2), do).reshape(B, Hkv, g, Tk, D).sum(2)
    return (dq.transpose(1, 2).to(q.dtype).contiguous(), dk.transpose(1, 2).to(k.dtype).contiguous(),
            dv.transpose(1, 2).to(v.dtype).contiguous())


@flash_attn_bwd.register_kernel("cuda")
def _flash_attn_bwd_cuda(q, k, v, out, lse, dout, scale):
    _attn_grad_check(q, k, v, out, lse, dout)
    _cuda_bf16("flash_attn_bwd", q, k, v, out, dout)
    _need(lse.dtype == torch.float32, f"flash_attn_bwd on a GPU takes an fp32 lse, got {lse.dtype}")
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    _need(D in (64, 128), f"flash_attn_bwd on a GPU takes head_dim 64 or 128 (got {D})")
    dq = torch.empty((B, Tq, H, D), dtype=_BF16, device=q.device)
    dk = torch.empty((B, Tk, Hkv, D), dtype=_BF16, device=q.device)
    dv = torch.empty((B, Tk, Hkv, D), dtype=_BF16, device=q.device)
    if B == 0 or Tq == 0:
        return dq, dk.zero_(), dv.zero_()
    lib, stream = _launch(q)
    q2, k2, v2, o2, do2 = _dense(q), _dense(k), _dense(v), _dense(out), _dense(dout)
    l2 = _dense(lse, 4)
    nbytes = lib.nstf_gpu_flash_attn_bwd_scratch_bytes(Tq, H)
    scratch = torch.empty(max(nbytes, 16), dtype=torch.uint8, device=q.device)  # reused in stream order
    qd, kvd = H * D, Hkv * D
    for b in range(B):
        _check(lib, lib.nstf_gpu_flash_attn_bwd(_p(q2[b]), qd, _p(k2[b]), kvd, _p(v2[b]), kvd, _p(o2[b]), qd,
                                                _p(do2[b]), qd, _p(l2[b]), _p(dq[b]), qd, _p(dk[b]), kvd, _p(dv[b]),
                                                kvd, Tq, Tk - Tq, H, Hkv, D, float(scale), _p(scratch), nbytes,
                                                stream))
    return dq, dk, dv


@flash_attn_bwd.register_fake
def _flash_attn_bwd_fake(q, k, v, out, lse, dout, scale):
    _attn_grad_check(q, k, v, out, lse, dout)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---- the op to call ---------------------------------------------------------------------------

torch.library.define("nstf::flash_attn", "(Tensor q, Tensor k, Tensor v, float scale) -> Tensor")


@torch.library.impl("nstf::flash_attn", "CompositeImplicitAutograd")
def flash_attn(q, k, v, scale):
    """Causal grouped-query attention, out [B, Tq, H, D] (bf16 for bf16
    inputs): q [B, Tq, H, D], k, v [B, Tk, Hkv, D], query i at position
    Tk - Tq + i (Tk > Tq: keys of earlier tokens, e.g. a KV cache).
    Differentiable: flash_attn_lse when a gradient is wanted (its backward
    is NSTF's attention backward), else flash_attn_infer. On a GPU: bf16,
    head_dim 64 or 128."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return torch.ops.nstf.flash_attn_lse(q, k, v, scale)[0]
    return torch.ops.nstf.flash_attn_infer(q, k, v, scale)
