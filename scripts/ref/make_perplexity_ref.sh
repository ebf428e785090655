#!/bin/sh
# make_perplexity_ref.sh — llama.cpp's llama-perplexity numbers that
# tests/test_perplexity.c compares `nstf perplexity` against: SmolLM2-135M
# Instruct Q4_1 on Debian's /usr/share/common-licenses/Apache-2.0 (package
# base-files; 11358 bytes), windows of 128 tokens. Builds llama-perplexity
# with scripts/build_llama_cpp.sh (its pinned llama-cpp-python sdist) and
# writes tests/data/perplexity_ref.txt: the command, the version, the
# window size, the running perplexity after each window and the final one.
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
out=$(mktemp)
trap 'rm -f "$out"' EXIT
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
} >"$root/tests/data/perplexity_ref.txt"
cat "$root/tests/data/perplexity_ref.txt"
