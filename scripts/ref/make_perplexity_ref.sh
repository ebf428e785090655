#!/bin/sh
# make_perplexity_ref.sh — llama.cpp's llama-perplexity numbers that
# tests/test_perplexity.c compares `nstf perplexity` against: SmolLM2-135M
# Instruct Q4_1 on Debian's /usr/share/common-licenses/Apache-2.0 (package
# base-files; 11358 bytes), windows of 128 tokens; and the GGUF files
# `nstf convert` writes of tests/data/arch/{llama31,qwen2,qwen3} (build/nstf
# is needed) on the same text, 8 windows of 64. Mistral is left out:
# llama.cpp runs its files (architecture llama) without the sliding
# window. Builds llama-perplexity with scripts/build_llama_cpp.sh (its
# pinned llama-cpp-python sdist) unless given, and writes
# tests/data/perplexity_ref.txt: the commands, the versions, and per run
# the window size, the running perplexity after each window and the final
# one.
#
# usage: sh scripts/ref/make_perplexity_ref.sh [MODEL] [LLAMA_PERPLEXITY]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${1:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
bin=${2:-}
text=/usr/share/common-licenses/Apache-2.0
ctx=128
if [ -z "$bin" ]; then
    sh "$root/scripts/build_llama_cpp.sh" cpu 2 llama-perplexity
    bin=$(ls "$root"/third_party/llama.cpp-*/build-cpu/bin/llama-perplexity | head -1)
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/out
"$bin" -m "$model" -f "$text" -c $ctx -t 2 >"$out" 2>/dev/null
running=$(grep '^\[1\]' "$out" | tr -d ' ')
final=$(printf '%s\n' "$running" | sed 's/,$//; s/.*\]//')
[ -n "$running" ] && [ -n "$final" ] || { echo "make_perplexity_ref: no output from $bin" >&2; exit 1; }
{
    echo "# made by scripts/ref/make_perplexity_ref.sh"
    echo "# llama-perplexity -m $(basename "$model") -f $text -c $ctx"
    echo "# llama.cpp from llama-cpp-python $(sed -n 's/^LCP_VERSION=//p' "$root/scripts/build_llama_cpp.sh") ($("$bin" --version 2>&1 | head -1)); $text from base-files $(dpkg-query -W -f '${Version}' base-files 2>/dev/null || echo '?')"
    echo "ctx $ctx"
    echo "running $running"
    echo "final $final"
    echo "# the architectures: nstf convert tests/data/arch/A -o A.gguf; llama-perplexity -m A.gguf -f $text -c 64 --chunks 8 -b 64 -t 1"
    for a in llama31 qwen2 qwen3; do
        "$root/build/nstf" convert "$root/tests/data/arch/$a" -o "$tmp/$a.gguf" >/dev/null
        # llama-perplexity's log thread can lose the last lines at exit: run until all 8 values are there
        for try in 1 2 3 4 5 6 7 8; do
            "$bin" -m "$tmp/$a.gguf" -f "$text" -c 64 --chunks 8 -b 64 -t 1 >"$out" 2>/dev/null
            running=$(grep '^\[1\]' "$out" | tr -d ' ')
            case $running in *"[8]"*) break ;; esac
        done
        case $running in *"[8]"*) ;; *) echo "make_perplexity_ref: no complete output for $a" >&2; exit 1 ;; esac
        echo "arch $a ctx 64 running $running"
    done
} >"$root/tests/data/perplexity_ref.txt"
cat "$root/tests/data/perplexity_ref.txt"
