"""hf.py — NSTF's kernels in place of HF transformers' Llama blocks:
patch_llama(model) swaps the forward of every LlamaAttention and LlamaMLP
(and, with norms=True, LlamaRMSNorm) of a LlamaForCausalLM for one built on
the torch.ops.nstf ops; unpatch_llama(model) puts the originals back.

  attention: Q, K, V and O projections on nstf::gemm (inference: one GEMM
    or GEMV over the stacked [Wq; Wk; Wv]), RoPE on nstf::rope (the model's
    rotary type must be "default"; other types keep HF's cos/sin), causal
    attention on nstf::flash_attn over HF's cache (a DynamicCache: the keys
    so far, this call's appended by cache.update); in training its backward
    is NSTF's attention backward (nstf::flash_attn_bwd).
  MLP: inference runs gate|up as one GEMM with the SwiGLU epilogue
    (nstf::gemm_swiglu; at most 8 tokens: one GEMV over [Wg; Wu] and
    nstf::swiglu), then down on nstf::gemm; training runs nstf::gemm for each
    projection and nstf::swiglu, whose autograd gives the gradients.
  RMSNorm: nstf::rms_norm (y in bf16).
The stacked and packed weights of the inference paths are built on first
use and rebuilt when a weight changes (its version counter or storage).

Limits: causal attention without padding (the attention mask is not read:
a batch must hold sequences of one length), no attention or MLP biases,
models in bf16 on a GPU, or float32 ones under torch.autocast(dtype=bf16)
(the ops cast their inputs; float32 works as it is on the CPU reference
path)."""

import types

import torch

from . import torch as nt  # noqa: F401 - registers torch.ops.nstf

_ops = torch.ops.nstf

__all__ = ["patch_llama", "unpatch_llama"]


def _cached(mod, key, weights, build):
    """A tensor built from weights, rebuilt when one of them changes."""
    stamp = tuple((w._version, w.data_ptr(), w.device, w.dtype) for w in weights)
    cache = mod.__dict__.setdefault("_nstf_cache", {})
    hit = cache.get(key)
    if hit is None or hit[0] != stamp:
        with torch.no_grad():
            hit = (stamp, build())
        cache[key] = hit
    return hit[1]


def _training(mod):
    return torch.is_grad_enabled() and any(p.requires_grad for p in mod.parameters())


def _attn_forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                  cache=None, **kwargs):
    cache = cache if cache is not None else past_key_values
    cfg = self.config
    B, T, _ = hidden_states.shape
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, self.head_dim
    x = hidden_states
    if _training(self):
        q = _ops.gemm(x, self.q_proj.weight)
        k = _ops.gemm(x, self.k_proj.weight)
        v = _ops.gemm(x, self.v_proj.weight)
    else:
        wqkv = _cached(self, "qkv", (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight),
                       lambda: torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]).contiguous())
        q, k, v = _ops.gemm(x, wqkv).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.reshape(B, T, H, D), k.reshape(B, T, Hkv, D), v.reshape(B, T, Hkv, D)
    past = cache.get_seq_length(self.layer_idx) if cache is not None else 0
    if self._nstf_rope_base is not None:
        pos = kwargs.get("position_ids")
        if pos is None:
            pos = torch.arange(past, past + T, device=x.device)[None].expand(B, T)
        q, k = _ops.rope(q, k, pos.expand(B, T).to(torch.int32), self._nstf_rope_base, True)
    else:
        cos, sin = position_embeddings
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)

        def rot(t):
            t1, t2 = t[..., : D // 2], t[..., D // 2:]
            return t * cos + torch.cat((-t2, t1), dim=-1) * sin

        q, k = rot(q), rot(k)
    if cache is not None:
        kf, vf = cache.update(k.transpose(1, 2), v.transpose(1, 2), self.layer_idx)
        k, v = kf.transpose(1, 2), vf.transpose(1, 2)
    out = _ops.flash_attn(q, k, v, float(self.scaling))
    return _ops.gemm(out.reshape(B, T, H * D), self.o_proj.weight), None


def _mlp_forward(self, x):
    if _training(self):
        h = _ops.swiglu(_ops.gemm(x, self.gate_proj.weight), _ops.gemm(x, self.up_proj.weight))
        return _ops.gemm(h, self.down_proj.weight)
    ws = (self.gate_proj.weight, self.up_proj.weight)
    n_tok = x.numel() // x.shape[-1]
    if n_tok <= 8:  # decode: one GEMV over the stacked [Wg; Wu]
        wgu = _cached(self, "gate_up", ws, lambda: torch.cat(ws).contiguous())
        gu = _ops.gemm(x, wgu)
        n_ff = ws[0].shape[0]
        h = _ops.swiglu(gu[..., :n_ff].contiguous(), gu[..., n_ff:].contiguous())
    else:
        h = _ops.gemm_swiglu(x, _cached(self, "packed", ws, lambda: nt.pack_swiglu(*ws).contiguous()))
    return _ops.gemm(h, self.down_proj.weight)


def _norm_forward(self, x):
    y, _ = _ops.rms_norm(x, self.weight, float(self.variance_epsilon))
    return y.to(x.dtype)


def _rope_base(model):
    """The RoPE base when the model's rotary embedding is the plain one (the
    kernel's), else None."""
    cfg = model.config
    params = getattr(cfg, "rope_parameters", None) or {}
    scaling = getattr(cfg, "rope_scaling", None) or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    base = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    if rope_type != "default" or base is None:
        return None
    return float(base)


def patch_llama(model, attention=True, mlp=True, norms=False):
    """Run the model's Llama blocks on NSTF's ops (see the module text).
    Returns the model; unpatch_llama undoes it."""
    cfg = model.config
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        raise ValueError("nstf.hf.patch_llama: models with attention or MLP biases are not supported")
    base = _rope_base(model)
    n = 0
    for mod in model.modules():
        name = type(mod).__name__
        fwd = None
        if attention and name == "LlamaAttention":
            mod._nstf_rope_base = base
            fwd = _attn_forward
        elif mlp and name == "LlamaMLP":
            fwd = _mlp_forward
        elif norms and name == "LlamaRMSNorm":
            fwd = _norm_forward
        if fwd is None or "_nstf_original" in mod.__dict__:
            continue
        mod._nstf_original = mod.__dict__.get("forward")
        mod.forward = types.MethodType(fwd, mod)
        n += 1
    if n == 0 and (attention or mlp or norms):
        raise ValueError("nstf.hf.patch_llama: no LlamaAttention / LlamaMLP / LlamaRMSNorm module in the model")
    return model


def unpatch_llama(model):
    """Undo patch_llama."""
    for mod in model.modules():
        if "_nstf_original" in mod.__dict__:
            orig = mod.__dict__.pop("_nstf_original")
            if orig is None:
                del mod.forward
            else:
                mod.forward = orig
            mod.__dict__.pop("_nstf_cache", None)
    return model
