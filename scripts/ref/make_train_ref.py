#!/usr/bin/env python3
"""make_train_ref.py — one training step of a small random Llama in PyTorch
(HF transformers' LlamaForCausalLM, float64), the reference for
tests/test_train_torch.c.

The model: 2 layers, width 64, 4 heads sharing 2 KV heads (head size 16),
SwiGLU width 96, vocabulary 96, tied embeddings, RMSNorm eps 1e-5, RoPE
base 10000; matrices N(0, 0.1), norm weights 1 + N(0, 0.1) (so that no
gradient is trivially symmetric). The batch: 2 sequences of 16 tokens and
their next tokens. The step: mean cross-entropy over the 32 targets,
backward, clip_grad_norm_(1.0), AdamW(lr 1e-3, betas (0.9, 0.95), eps
1e-8, weight decay 0.1 on the matrices and 0 on the norm weights).

Everything runs in float64, with the RoPE inverse frequencies recomputed in
float64 too (HF forms them in float32), so the reference stands for exact
arithmetic: the test holds NSTF's fp32 step to fp32 tolerances against it.

Then the same step with LoRA: the base frozen, rank-2 adapters on all seven
matrices of every layer (y = x W^T + (x A^T) B^T, A and B drawn N(0, 0.1)
so that both have gradients), clipping and AdamW (weight decay 0.1) over
the adapters only.

Writes two GGUF files:
  OUT_MODEL  the model (F32 tensors with GGUF names, HF's rotate-half Q/K
             rows, flagged by nstf.rope.neox = true, which NSTF's loader
             honours; no tokenizer);
  OUT_REF    the batch (nstf.ref.tokens, int32 [2 x 17]), the loss
             (nstf.ref.loss, float64 as a string), the gradient norm, and
             per parameter tensor NAME: NAME.grad (the gradient before
             clipping) and NAME.new (the weights after the step), F32;
             for LoRA nstf.ref.lora.loss, .grad_norm, and per adapter
             blk.N.<matrix>.weight.lora_a (A [r, n_in]) and .lora_b (B^T
             [r, n_out], NSTF's layout): .init, .grad and .new.
Versions used are recorded in the metadata (nstf.ref.versions).

usage: make_train_ref.py OUT_MODEL OUT_REF
"""
import sys

import gguf
import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

LAYERS, DIM, HEADS, KV, FFN, VOCAB, SEQ, BATCH = 2, 64, 4, 2, 96, 96, 16, 2
LR, BETAS, EPS, WD, CLIP, THETA, NORM_EPS = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0, 10000.0, 1e-5
RANK = 2
LORA_MATS = [("self_attn", "q_proj", "attn_q"), ("self_attn", "k_proj", "attn_k"), ("self_attn", "v_proj", "attn_v"),
             ("self_attn", "o_proj", "attn_output"), ("mlp", "gate_proj", "ffn_gate"), ("mlp", "up_proj", "ffn_up"),
             ("mlp", "down_proj", "ffn_down")]


class LoraLinear(torch.nn.Module):
    """y = base(x) + (x A^T) B^T, base frozen"""

    def __init__(self, base, a, b):
        super().__init__()
        self.base, self.a, self.b = base, torch.nn.Parameter(a), torch.nn.Parameter(b)

    def forward(self, x):
        return self.base(x) + (x @ self.a.T) @ self.b.T


def main(out_model, out_ref):
    torch.manual_seed(1234)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=FFN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV, max_position_embeddings=64,
                      rms_norm_eps=NORM_EPS, rope_theta=THETA, tie_word_embeddings=True,
                      attention_bias=False, mlp_bias=False)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).double()
    hd = DIM // HEADS
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn_like(p) * 0.1)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        rot = model.model.rotary_emb
        rot.inv_freq = 1.0 / (THETA ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        rot.original_inv_freq = rot.inv_freq
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1))

    # GGUF names of HF's parameters
    def gname(n):
        n = n.replace("model.embed_tokens.weight", "token_embd.weight").replace("model.norm.weight",
                                                                               "output_norm.weight")
        for a, b in [("self_attn.q_proj", "attn_q"), ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
                     ("self_attn.o_proj", "attn_output"), ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"),
                     ("mlp.down_proj", "ffn_down"), ("input_layernorm", "attn_norm"),
                     ("post_attention_layernorm", "ffn_norm")]:
            n = n.replace(a, b)
        return n.replace("model.layers.", "blk.")

    params = [(gname(n), p) for n, p in model.named_parameters()]  # tied: lm_head is not listed again
    w = gguf.GGUFWriter(out_model, "llama")
    w.add_context_length(64)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(NORM_EPS)
    w.add_bool("nstf.rope.neox", True)
    for n, p in params:
        w.add_tensor(n, p.detach().float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # the weights as NSTF sees them: the same float32 numbers, in float64
    with torch.no_grad():
        for _, p in params:
            p.copy_(p.float().double())
    init_state = {k: v.clone() for k, v in model.state_dict().items()}
    decay = [p for n, p in params if p.dim() == 2]
    no_decay = [p for n, p in params if p.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    out = model(input_ids=tokens[:, :SEQ], labels=None)
    loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params}
    norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], CLIP)
    opt.step()

    # LoRA: the initial weights again, the base frozen, adapters on every matrix
    lora_model = LlamaForCausalLM(cfg).double()
    lora_model.load_state_dict(init_state)
    lora_model.model.rotary_emb.inv_freq = model.model.rotary_emb.inv_freq
    for p in lora_model.parameters():
        p.requires_grad_(False)
    adapters = []  # (gguf name, A, B)
    for li, layer in enumerate(lora_model.model.layers):
        for block, lin, gn in LORA_MATS:
            parent = getattr(layer, block)
            base = getattr(parent, lin)
            a = (torch.randn(RANK, base.in_features, dtype=torch.float64) * 0.1).float().double()
            b = (torch.randn(base.out_features, RANK, dtype=torch.float64) * 0.1).float().double()
            mod = LoraLinear(base, a, b)
            setattr(parent, lin, mod)
            adapters.append(("blk.%d.%s.weight" % (li, gn), mod.a, mod.b))
    lora_init = {n: (a.detach().clone(), b.detach().clone()) for n, a, b in adapters}
    lora_params = [p for _, a, b in adapters for p in (a, b)]
    lopt = torch.optim.AdamW(lora_params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    lout = lora_model(input_ids=tokens[:, :SEQ])
    lloss = torch.nn.functional.cross_entropy(lout.logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    lloss.backward()
    lgrads = {n: (a.grad.detach().clone(), b.grad.detach().clone()) for n, a, b in adapters}
    lnorm = torch.nn.utils.clip_grad_norm_(lora_params, CLIP)
    lopt.step()

    r = gguf.GGUFWriter(out_ref, "llama")
    r.add_array("nstf.ref.tokens", [int(x) for x in tokens.reshape(-1)])
    r.add_string("nstf.ref.loss", repr(float(loss)))
    r.add_string("nstf.ref.grad_norm", repr(float(norm)))
    r.add_string("nstf.ref.versions", "torch %s, transformers %s, gguf-py, numpy %s" %
                 (torch.__version__, transformers.__version__, np.__version__))
    for n, p in params:
        r.add_tensor(n + ".grad", grads[n].float().numpy())
        r.add_tensor(n + ".new", p.detach().float().numpy())
    r.add_string("nstf.ref.lora.loss", repr(float(lloss)))
    r.add_string("nstf.ref.lora.grad_norm", repr(float(lnorm)))
    for n, a, b in adapters:
        ai, bi = lora_init[n]
        ga, gb = lgrads[n]
        for suffix, x in [(".lora_a.init", ai), (".lora_a.grad", ga), (".lora_a.new", a.detach()),
                          (".lora_b.init", bi.T), (".lora_b.grad", gb.T), (".lora_b.new", b.detach().T)]:
            r.add_tensor(n + suffix, np.ascontiguousarray(x.float().numpy()))
    r.write_header_to_file()
    r.write_kv_data_to_file()
    r.write_tensors_to_file()
    r.close()
    print("loss %.10f, grad norm %.6f; LoRA loss %.10f, grad norm %.6f" % (float(loss), float(norm), float(lloss),
                                                                        float(lnorm)))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
