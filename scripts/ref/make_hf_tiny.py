#!/usr/bin/env python3
"""make_hf_tiny.py — a tiny random-weight Llama saved as an HF model folder,
with transformers' fp32 logits, for the HF-folder and `nstf convert` tests.

Builds, with the `tokenizers` and `transformers` packages:
  OUTDIR/hf_tiny/                 the model folder (config.json, sharded
                                  safetensors + model.safetensors.index.json,
                                  tokenizer.json, tokenizer_config.json,
                                  chat_template.jinja when transformers
                                  writes one)
  OUTDIR/hf_tokenizers/llama3/    tokenizer files only: Llama-3 pre-tokenizer,
                                  BOS added by the post-processor, Llama-3
                                  chat template
  OUTDIR/hf_tokenizers/gpt2/      tokenizer files only: GPT-2 byte-level
  OUTDIR/hf_tiny_logits.bin       fp32 logits at every position of a few
                                  prompts, from transformers loading the folder
  OUTDIR/hf_tiny_ref.txt          versions; token ids of test strings for each
                                  tokenizer; chat renderings

The model: LlamaForCausalLM, 2 layers, width 128, 2 heads of 64 sharing 1
KV head (grouped-query attention; head size 64 as the GPU kernels need),
FFN 192, vocabulary 416 (the tokenizer has 400 tokens: ids 400..415 are
unused, as in models whose embedding is padded), untied output. Weights are drawn
N(0, 0.08) (norms 1 + N(0, 0.2)) so that logits are spread out and top-1 is
meaningful, then stored in mixed dtypes to exercise every mapped type:
embeddings and attention BF16, MLP F16, norms and lm_head F32. The
reference loads the saved folder with dtype=float32 (each stored value
widened exactly) and runs on the CPU.

The main tokenizer is SmolLM2-style (digits split one by one, then GPT-2
byte-level BPE) with SmolLM2's special tokens and chat template, trained on
the text below to 400 tokens.

hf_tiny_logits.bin (little-endian):
  char[8] "NSTFHF01"; int32 n_prompts, n_vocab;
  per prompt: int32 n_tok; int32 ids[n_tok]; float32 logits[n_tok][n_vocab]

hf_tiny_ref.txt: one record per line, text fields as hex of their UTF-8:
  tok VARIANT HEX_TEXT ID ID ...   tokenizer(text) ids (special tokens parsed,
                                   BOS as the tokenizer adds it)
  chat VARIANT HEX_RENDERED        apply_chat_template(CHAT, add_generation_prompt)
                                   without the BOS text a template writes
                                   (NSTF's renderer leaves BOS to the encoder)

usage: python3 make_hf_tiny.py OUTDIR     (OUTDIR = tests/data)
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
import safetensors
import tokenizers
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TRAIN_TEXT = """\
The history of computing is a story of abstraction. Early machines were programmed by rewiring
panels of cables, and every new problem meant a new arrangement of hardware. The stored-program
computer changed that: instructions became data, held in the same memory as the numbers they
worked on. In 1972 the C language appeared at Bell Labs, designed to write an operating system
that could move from one machine to another. Decades later, graphics processors brought
thousands of simple cores to a single chip. Matrix multiplication maps well onto this model:
each block of threads computes a tile of the output, loading slices of the inputs into fast
on-chip memory and reusing them many times. Here is a table: 12 kernels, 3.5 ms, 98.7 percent,
and 1024 tokens per second. Don't panic; it's fine, we'll see. They've said I'm right.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
Le café est très bon. Ünïcödé wörds, naïve façade. 東京 is a city. Emoji: 🙂🚀.
"""

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOKENIZER_TESTS = [
    "Hello world",
    "The 12 kernels ran in 3.5 ms, at 1024 tokens per second.",
    "  leading spaces and\ttabs\nnew lines\n\n\nend   ",
    "Don't panic; it's fine, we'll see. THEY'VE SAID I'M RIGHT.",
    "def f(x):\n    return x ** 2  # square",
    "Le café est très bon. 東京 🙂🚀 naïve",
    "12345678901234567890",
    "<|im_start|>user\nHi<|im_end|>",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "",
]

CHAT = [
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": " Thanks! "},
]

PROMPTS = [
    "The history of computing is a story of abstraction.",
    "def fibonacci(n):\n    return n",
    "12 kernels, 3.5 ms, and 1024 tokens per second. Le café est très bon.",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
]

N_VOCAB_TOK = 400
N_VOCAB_MODEL = 416


def train(pre, specials, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=N_VOCAB_TOK, special_tokens=specials, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAIN_TEXT] * 4, trainer=trainer)
    return tok


def save_tokenizer(tok, outdir, **kw):
    os.makedirs(outdir, exist_ok=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **kw)
    fast.save_pretrained(outdir)
    return PreTrainedTokenizerFast.from_pretrained(outdir)


def records(name, fast, lines):
    for text in TOKENIZER_TESTS:
        ids = fast(text)["input_ids"]
        lines.append(" ".join(["tok", name, text.encode().hex() or "-"] + [str(i) for i in ids]))
    if fast.chat_template:
        r = fast.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        if fast.bos_token and "bos_token" in fast.chat_template and r.startswith(fast.bos_token):
            r = r[len(fast.bos_token):]
        lines.append(f"chat {name} {r.encode().hex()}")


def header(script):
    """The first lines of a reference file: its maker and the versions used."""
    return [
        f"# made by scripts/ref/{script}",
        f"# python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}, safetensors {safetensors.__version__}, numpy {np.__version__}",
    ]


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    lines = header("make_hf_tiny.py")

    # --- tokenizers
    smol_pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    smol = train(smol_pre, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    model_dir = os.path.join(out, "hf_tiny")
    shutil.rmtree(model_dir, ignore_errors=True)
    smol_fast = save_tokenizer(smol, model_dir, bos_token="<|im_start|>", eos_token="<|im_end|>",
                               unk_token="<|endoftext|>", pad_token="<|im_end|>", chat_template=SMOLLM2_TEMPLATE)
    records("smollm", smol_fast, lines)

    l3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    l3_pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
                                      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    l3 = train(l3_pre, l3_specials, ignore_merges=True)
    bos = l3.token_to_id("<|begin_of_text|>")
    l3.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    l3_dir = os.path.join(out, "hf_tokenizers", "llama3")
    shutil.rmtree(l3_dir, ignore_errors=True)
    l3_fast = save_tokenizer(l3, l3_dir, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                             chat_template=LLAMA3_TEMPLATE)
    records("llama3", l3_fast, lines)

    g2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"])
    g2_dir = os.path.join(out, "hf_tokenizers", "gpt2")
    shutil.rmtree(g2_dir, ignore_errors=True)
    g2_fast = save_tokenizer(g2, g2_dir, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    records("gpt2", g2_fast, lines)

    # --- the model
    cfg = LlamaConfig(vocab_size=N_VOCAB_MODEL, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=False,
                      bos_token_id=smol_fast.bos_token_id, eos_token_id=smol_fast.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    for layer in model.model.layers:
        layer.mlp.to(torch.float16)
        layer.input_layernorm.to(torch.float32)
        layer.post_attention_layernorm.to(torch.float32)
    model.model.norm.to(torch.float32)
    model.lm_head.to(torch.float32)
    model.save_pretrained(model_dir, safe_serialization=True, max_shard_size="300KB")

    # --- the reference: transformers reads the folder back, fp32 on the CPU
    ref = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref.eval()
    blob = bytearray(b"NSTFHF01")
    blob += struct.pack("<ii", len(PROMPTS), N_VOCAB_MODEL)
    for text in PROMPTS:
        ids = smol_fast(text)["input_ids"]
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0].float().numpy()
        assert logits.shape == (len(ids), N_VOCAB_MODEL), logits.shape
        blob += struct.pack("<i", len(ids)) + np.asarray(ids, dtype="<i4").tobytes()
        blob += np.ascontiguousarray(logits, dtype="<f4").tobytes()
        top = logits.argmax(-1)
        lines.append(f"# prompt {text.encode().hex()}: {len(ids)} tokens, top-1 {' '.join(map(str, top))}")
    with open(os.path.join(out, "hf_tiny_logits.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(out, "hf_tiny_ref.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    total = 0
    for root, _, files in os.walk(model_dir):
        total += sum(os.path.getsize(os.path.join(root, x)) for x in files)
    print(f"{model_dir}: {total} bytes; {len(PROMPTS)} prompts; {len(lines)} reference lines")


if __name__ == "__main__":
    main()
