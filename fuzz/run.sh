#!/bin/sh
# run.sh — run each fuzz target for a fixed time; fail if any crashed.
#
#   sh fuzz/run.sh BUILD_DIR SECONDS TARGET...
#
# Run from fuzz/. Each target reads its checked-in seeds (corpus/<target>/,
# plus ../tests/data/hostile/ for fuzz_gguf and
# ../tests/data/hostile/safetensors/ for fuzz_safetensors) and writes the inputs it finds
# interesting to BUILD_DIR/corpus/<target>/ (kept between runs, never
# committed). A crash, leak, sanitizer report, timeout (> 10 s per input)
# or out-of-memory input is saved as findings/<target>/<kind>-<sha1> and
# makes this script exit non-zero after every target has had its turn.
# fuzz_tokenizer needs a vocabulary: $NSTF_FUZZ_MODEL or the default
# model under models/; without one it is skipped with a note.
set -u
out=$1; secs=$2; shift 2
status=0
for t in "$@"; do
    seeds="corpus/$t"
    extra=""
    dict=""
    maxlen=4096
    case $t in
    fuzz_gguf) extra="../tests/data/hostile"; dict="-dict=gguf.dict"; maxlen=16384 ;;
    fuzz_safetensors) extra="../tests/data/hostile/safetensors"; dict="-dict=safetensors.dict"; maxlen=16384 ;;
    fuzz_hf_tokenizer) dict="-dict=hf_tokenizer.dict"; maxlen=32768 ;;
    fuzz_serve_request) dict="-dict=serve.dict"; maxlen=16384 ;;
    fuzz_tokenizer)
        model=${NSTF_FUZZ_MODEL:-../models/SmolLM2-135M-Instruct.Q4_1.gguf}
        if [ ! -r "$model" ]; then
            echo "fuzz: $t skipped: no vocabulary at $model (make model, or set NSTF_FUZZ_MODEL)"
            continue
        fi ;;
    esac
    mkdir -p "$out/corpus/$t" "findings/$t"
    echo "fuzz: $t for ${secs}s"
    # -close_fd_mask=2: the code under test may print (the CLI parsers do);
    # libFuzzer and the sanitizers keep reporting on a copy of stderr.
    "$out/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=$maxlen \
        -close_fd_mask=2 -print_final_stats=1 $dict \
        -artifact_prefix="findings/$t/" "$out/corpus/$t" "$seeds" $extra 2>"$out/$t.log"
    rc=$?
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done )' "$out/$t.log" | sed "s/^/fuzz: $t: /"
    if [ $rc -ne 0 ]; then
        echo "fuzz: $t FAILED (exit $rc); report follows, inputs in fuzz/findings/$t/"
        tail -n 60 "$out/$t.log"
        status=1
    fi
done
exit $status
