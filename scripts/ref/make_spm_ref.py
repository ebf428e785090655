#!/usr/bin/env python3
"""make_spm_ref.py — a tiny SentencePiece BPE model as a GGUF, and reference ids.

Trains a small sentencepiece BPE model (byte_fallback, identity
normalization, whitespace kept as is, dummy prefix on: the Llama-1/2
settings) on generated English-like text, writes its vocabulary into a
GGUF (tokenizer.ggml.model = "llama": tokens, scores, token_type, bos/eos/
unk ids; no tensors), and encodes a list of strings with sentencepiece
(no BOS) into a reference file, one case per line:

    <hex of the UTF-8 input> TAB <space-separated ids>

usage: python3 make_spm_ref.py OUT.gguf OUT_REF.txt
"""
import importlib.metadata
import io
import random
import sys

import gguf
import sentencepiece as spm

WORDS = """the of and to in is was for on that with as by at from his her it an
were are which this be or has had not but first one their its new after who
they have two she been other when there all during into school time may years
more most only over city some world would where later up such used many can
state about national out known university united then made three while
people good reasons learn language programming computer hello how you today
weather river mountain small large quickly slowly because although tokenizer
piece merge byte fallback model score""".split()


def corpus(rng, n_lines=4000):
    lines = []
    for _ in range(n_lines):
        n = rng.randint(3, 14)
        ws = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            ws[0] = ws[0].capitalize()
        if rng.random() < 0.2:
            ws.insert(rng.randint(0, len(ws)), str(rng.randint(0, 9999)))
        line = " ".join(ws) + rng.choice([".", "!", "?", ",", ""])
        lines.append(line)
    return "\n".join(lines) + "\n"


CASES = [
    "",
    "hello",
    "Hello world",
    "the quick brown fox",
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "multiple   spaces   inside",
    "The university of the world was known for its people.",
    "programming language reasons",
    "tokenizer byte fallback model",
    "1234 5678 90",
    "a1b2c3",
    "newline\nin text",
    "tab\tin text",
    "zebra xylophone jukebox",
    "QUIZ JAZZ",
    "café naïve",
    "中文",
    "emoji 😀 here",
    "Привет",
    "\u00a0nbsp",
    "a",
    " ",
    "   ",
    "!!!???...",
    "{\"json\": [1, 2, 3]}",
    "mountain river weather today, quickly and slowly",
    "thethethethethe",
    "e\u0301 combining",
    "x" * 50,
]


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    out_gguf, out_ref = sys.argv[1], sys.argv[2]
    rng = random.Random(1234)
    text = corpus(rng)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()),
        model_writer=model,
        model_type="bpe",
        vocab_size=700,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=True,
        split_digits=False,
        character_coverage=1.0,
        num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())

    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            t = gguf.TokenType.UNKNOWN
        elif sp.is_control(i):
            t = gguf.TokenType.CONTROL
        elif sp.is_byte(i):
            t = gguf.TokenType.BYTE
        elif sp.is_unused(i):
            t = gguf.TokenType.UNUSED
        else:
            t = gguf.TokenType.NORMAL
        types.append(int(t))

    w = gguf.GGUFWriter(out_gguf, "llama")
    w.add_name("spm-tiny")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    with open(out_ref, "w", encoding="utf-8", newline="\n") as out:
        out.write("# tiny SentencePiece BPE reference: <hex UTF-8 input> TAB <ids>\n")
        out.write("# encoded by sentencepiece without BOS; model trained by this script\n")
        out.write("# by design, llama.cpp-style encoders differ from sentencepiece only where the text\n"
                  "# holds special-token text (</s>...) parsed as specials: no case here does\n")
        out.write(f"# made by scripts/ref/make_spm_ref.py with sentencepiece "
                  f"{importlib.metadata.version('sentencepiece')}, gguf {importlib.metadata.version('gguf')}, "
                  f"vocab {sp.get_piece_size()}\n")
        for s in CASES:
            ids = sp.encode(s)
            out.write(s.encode("utf-8").hex() + "\t" + " ".join(map(str, ids)) + "\n")
    print(f"vocab {sp.get_piece_size()}, wrote {len(CASES)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
