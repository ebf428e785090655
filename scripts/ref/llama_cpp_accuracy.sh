#!/bin/sh
# llama_cpp_accuracy.sh — tests/data/smollm2_llama_cpp_cpu*.txt: llama.cpp's
# CPU logits on each end-to-end reference text, summarised against the fp32
# reference (scripts/ref/llama_cpp_logits.c says what each line holds):
#   smollm2_llama_cpp_cpu.txt           the prose text (smollm2_logits_ref.bin),
#                                       and llama.cpp's greedy answers to the
#                                       reference's prompts and to "What is the
#                                       capital of France?" (a chat turn)
#   smollm2_llama_cpp_cpu_NAME.txt      the text of smollm2_logits_ref_NAME.bin
#                                       (NAME: code, dialogue)
# tests/test_accuracy.c holds our default CPU path to be at least as close
# as these figures on every text.
#
# usage: sh scripts/ref/llama_cpp_accuracy.sh [MODEL]
#   LLAMA_CPP_DIR  a llama.cpp tree with a CPU build in build-cpu/bin (default:
#                  the one scripts/build_llama_cpp.sh makes, built when missing)
#   THREADS        threads for llama.cpp (default 2)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
model=${1:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
lcpp=${LLAMA_CPP_DIR:-$root/third_party/llama.cpp-0.3.36}
threads=${THREADS:-2}
if [ ! -e "$lcpp/build-cpu/bin/libllama.so" ]; then
    sh "$root/scripts/build_llama_cpp.sh" cpu "$threads" llama
fi
[ -x "$root/build/nstf" ] || make -C "$root" build
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc -O2 -o "$tmp/llama_cpp_logits" "$root/scripts/ref/llama_cpp_logits.c" -I"$lcpp/include" -I"$lcpp/ggml/include" \
    -L"$lcpp/build-cpu/bin" -lllama -lggml -lggml-base -lm -Wl,-rpath,"$lcpp/build-cpu/bin"
# the reference's prompts, and the France question as nstf renders a chat turn
cp "$root/tests/data/smollm2_greedy_ref.txt" "$tmp/cases.txt"
{
    echo "case france"
    printf "prompt"
    "$root/build/nstf" run -m "$model" --chat -p "What is the capital of France?" -n 0 --verbose-prompt 2>&1 >/dev/null |
        awk '/ -> / { printf " %s", $1 }'
    echo
} >> "$tmp/cases.txt"
for name in "" _code _dialogue; do
    ref=$root/tests/data/smollm2_logits_ref$name.bin
    out=$root/tests/data/smollm2_llama_cpp_cpu$name.txt
    cases=$tmp/cases.txt
    [ -z "$name" ] || cases=/dev/null
    {
        echo "# llama.cpp's CPU path on tests/data/$(basename "$ref")'s text: made by scripts/ref/llama_cpp_accuracy.sh"
        echo "# model sha256 $(sha256sum "$model" | cut -d' ' -f1)"
        echo "# llama.cpp from llama-cpp-python $(basename "$lcpp" | sed 's/llama.cpp-//'), $(uname -m), $threads threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
        "$tmp/llama_cpp_logits" "$model" "$ref" "$cases" "$threads" 2>/dev/null
    } > "$out"
    echo "llama_cpp_accuracy: wrote $out" >&2
done
