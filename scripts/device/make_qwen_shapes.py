#!/usr/bin/env python3
"""make_qwen_shapes.py — random Qwen2 and Qwen3 HF folders at the widths of
the small released models, for the GPU checks of the fused decode
(scripts/device/qwen_fused_check.sh). Needs torch and transformers; reads
the tokenizer files of tests/data/arch/qwen2 and qwen3 (vocabulary 416),
downloads nothing.

  python3 scripts/device/make_qwen_shapes.py OUTDIR [N_LAYERS]

  OUTDIR/qwen25-0.5b/  Qwen2ForCausalLM at Qwen2.5-0.5B's width: hidden 896,
                       14 q / 2 kv heads of 64, ffn 4864, Q/K/V biases drawn
                       N(0, 0.5), tied embeddings
  OUTDIR/qwen3-0.6b/   Qwen3ForCausalLM at Qwen3-0.6B's width: hidden 1024,
                       16 q / 8 kv heads of 128 (q 2048 rows on a width of
                       1024), ffn 3072, per-head q/k norms 1 + N(0, 0.3)
N_LAYERS (default 4) layers each, weights N(0, 0.08) stored BF16, norms
1 + N(0, 0.2) in F32, drawn by scripts/ref/make_arch_ref.py's randomize."""
import os
import shutil
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "scripts", "ref"))
from make_arch_ref import randomize  # noqa: E402  (the reference models' weight draws)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def qwen_extras(name, p):
    """Qwen's extras drawn as make_arch_ref.py draws them (True: drawn here)."""
    if name.endswith("bias"):
        p.copy_(0.5 * torch.randn_like(p))
    elif name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
    else:
        return False
    return True


def build(out, name, src, cls, cfg):
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for f in TOKENIZER_FILES:
        p = os.path.join(ROOT, "tests", "data", "arch", src, f)
        if os.path.exists(p):
            shutil.copy(p, d)
    randomize(cls(cfg), qwen_extras).save_pretrained(d, safe_serialization=True)
    print(f"{d}: {cls.__name__}, hidden {cfg.hidden_size}, heads {cfg.num_attention_heads}/"
          f"{cfg.num_key_value_heads}, {cfg.num_hidden_layers} layers")


def main():
    out = sys.argv[1]
    n_layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    torch.manual_seed(0)
    common = dict(vocab_size=416, num_hidden_layers=n_layers, max_position_embeddings=4096, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, bos_token_id=None, eos_token_id=None, use_sliding_window=False)
    build(out, "qwen25-0.5b", "qwen2", Qwen2ForCausalLM,
          Qwen2Config(**common, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                      num_key_value_heads=2, tie_word_embeddings=True))
    build(out, "qwen3-0.6b", "qwen3", Qwen3ForCausalLM,
          Qwen3Config(**common, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, tie_word_embeddings=False))


if __name__ == "__main__":
    main()
