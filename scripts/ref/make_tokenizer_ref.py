#!/usr/bin/env python3
"""make_tokenizer_ref.py — reference token ids for the SmolLM2 tokenizer.

Builds a HF `tokenizers` Tokenizer from the GGUF's own vocabulary and merges
(BPE model, byte-level; pre-tokenizer Sequence[Digits(individual_digits),
ByteLevel(add_prefix_space=False, use_regex=True)]; ByteLevel decoder; the
control tokens added as special AddedTokens). That is the configuration of
SmolLM2's tokenizer.json. It then encodes a fixed list of strings (without
BOS, special tokens parsed) and writes one case per line:

    <hex of the UTF-8 input> TAB <space-separated ids>

Lines starting with '#' are comments (versions, model sha256).

A second file does the same with the Llama-3 pre-tokenizer over the same
vocabulary (Split on the Llama-3 regex, ByteLevel without its own regex,
BPE with ignore_merges), which is what a GGUF with tokenizer.ggml.pre =
"llama-bpe" asks for; the test rewrites the model's vocabulary into such a
GGUF to check that pre-tokenizer.

usage: python3 make_tokenizer_ref.py MODEL.gguf OUT.txt [OUT_LLAMA3PRE.txt]
"""
import hashlib
import importlib.metadata
import sys

import gguf
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def field_str(f, i):
    return bytes(f.parts[f.data[i]]).decode("utf-8")


def load_vocab(path):
    r = gguf.GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"]
    types = r.fields["tokenizer.ggml.token_type"]
    merges = r.fields["tokenizer.ggml.merges"]
    vocab = [field_str(toks, i) for i in range(len(toks.data))]
    ttype = [int(types.parts[i][0]) for i in types.data]
    mlist = [field_str(merges, i) for i in range(len(merges.data))]
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[r.fields["tokenizer.ggml.pre"].data[0]]).decode()
    return vocab, ttype, mlist, pre


LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def build(vocab, ttype, mlist, llama3=False):
    v = {t: i for i, t in enumerate(vocab)}
    merges = [tuple(m.split(" ", 1)) for m in mlist]
    tok = Tokenizer(models.BPE(vocab=v, merges=merges, unk_token=None, fuse_unk=False,
                               ignore_merges=llama3))
    if llama3:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(LLAMA3_RE), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False)
                for t, ty in zip(vocab, ttype) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


CASES = [
    "",
    "Hello world",
    "Hello, world!",
    " Hello world",
    "  leading spaces",
    "trailing spaces   ",
    "The quick brown fox jumps over the lazy dog.",
    "What are three good reasons to learn the C programming language?",
    "I'm sure you'll see they've done it, didn't they? We're here; he'd go.",
    "I'M SHOUTING AND IT'S LOUD",
    "1234567",
    "3.14159",
    "pi is 3.14159265358979 and e is 2.71828",
    "Numbers: 0 1 12 123 1234 12345 123456 1000000",
    "a1b2c3 x99y",
    "int main(void) {\n    printf(\"hello\\n\");\n    return 0;\n}\n",
    "def f(x):\n\treturn x ** 2  # square\n",
    "for (size_t i = 0; i < n; i++) { a[i] += b[i] * c; }",
    "<html><body class=\"x\">&amp;</body></html>",
    "a\tb\t\tc",
    "line1\nline2\n\nline4\r\nline5",
    "\n\n\n",
    "    ",
    " ",
    "\t",
    "word \n next",
    "spaces    between     words",
    "emoji 😀 test 🎉🎉 and 👨‍👩‍👧 family",
    "🤗",
    "中文测试：你好，世界！",
    "日本語のテキストです。カタカナ、ひらがな。",
    "한국어 문장입니다",
    "مرحبا بالعالم",
    "שלום עולם",
    "Привет, мир! Как дела?",
    "Ελληνικά γράμματα",
    "café naïve résumé façade Ångström",
    "e\u0301 combining acute, a\u0308 and n\u0303",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L",
    "<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|>",
    "<|im_start",
    "<file_sep><filename>main.c<gh_stars>10",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 300,
    "abcdefghij" * 40,
    "x" + "-" * 100 + "y",
    "https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct?x=1&y=2#frag",
    "user@example.com, +1 (555) 123-4567",
    "$100.00 or €50,25 or ¥1000 — 50% off!",
    "snake_case camelCase PascalCase SCREAMING_CASE kebab-case",
    "'s 't 're 've 'm 'll 'd",
    "don't DON'T Don't",
    "  \n  \t  x",
    "Mixed 中文 and English 123 😀!",
    "½ ¾ ² ³ ① Ⅻ",
    "\u00a0non-breaking\u00a0space and\u2003em space",
    "zero\u200bwidth\u200cjoiners\u200d",
    "NEL\u0085char",
    "tab\tseparated\tvalues\n1\t2\t3\n",
    "`code` **bold** _it_ ~~strike~~ [link](url)",
    "The year 2024 had 366 days.",
    # bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d have no byte-level token in
    # SmolLM2's vocabulary: HF drops them (so does llama.cpp)
    "ctrl\x04\x06 bytes\x13\x1d and DEL\x7f",
    # nor for the UTF-8 lead bytes 0xF1, 0xF2 (planes 4-11, unassigned)
    "plane5 \U00050000 plane14 \U000E0041 plane16 \U0010FFFD",
]


def write_ref(tok, out_path, title, sha, pre):
    with open(out_path, "w", encoding="utf-8", newline="\n") as out:
        out.write(f"# {title}: <hex UTF-8 input> TAB <ids>\n")
        out.write("# encoded without BOS, special tokens parsed (HF AddedTokens)\n")
        out.write(f"# made by scripts/ref/make_tokenizer_ref.py with tokenizers {tokenizers.__version__}, gguf {importlib.metadata.version('gguf')}\n")
        out.write(f"# model SmolLM2-135M-Instruct.Q4_1.gguf sha256 {sha}, pre-tokenizer {pre}\n")
        for s in CASES:
            ids = tok.encode(s, add_special_tokens=False).ids
            # the reference must round-trip through the HF decoder too
            # (except where the vocabulary lacks a byte)
            if "\x04" not in s and "\U00050000" not in s:
                assert tok.decode(ids, skip_special_tokens=False) == s, repr(s)
            out.write(s.encode("utf-8").hex() + "\t" + " ".join(map(str, ids)) + "\n")
    print(f"wrote {len(CASES)} cases to {out_path}")


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    model_path, out_path = sys.argv[1], sys.argv[2]
    with open(model_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    vocab, ttype, mlist, pre = load_vocab(model_path)
    write_ref(build(vocab, ttype, mlist), out_path, "SmolLM2 tokenizer reference", sha, pre)
    if len(sys.argv) == 4:
        write_ref(build(vocab, ttype, mlist, llama3=True), sys.argv[3],
                  "SmolLM2 vocabulary with the Llama-3 pre-tokenizer (ignore_merges)", sha, "llama-bpe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
