#!/bin/sh
# test_layering.sh — the layering rules of the source tree that a grep can
# check (docs/ARCHITECTURE.md, "Seams"):
#
#   sh tests/test_layering.sh ROOT        check the tree under ROOT
#   sh tests/test_layering.sh --self-test check that the checks catch things
#
# 1. Vendor names stay behind the backend seam: no cuda*/hip* runtime names
#    (cudaMalloc, hipStream_t, ...) and no NSTF_HAVE_CUDA / NSTF_HAVE_HIP
#    in src/ or tools/ outside src/ops/gpu/ and the backend files
#    (src/backend/backend.c, src/backend/gpu*).
# 2. Dependencies point one way: core <- ops <- backend <- model <- prof <-
#    tools. ops/ never includes backend/, model/ or prof/; backend/ never
#    includes model/ or prof/; model/ never includes prof/ (the model calls
#    the hooks it is given); prof/ headers never include model/ or backend/
#    (prof's .c files may).
# 3. Tools see no struct internals: tools/ includes no model/, backend/ or
#    ops/ header; what a tool needs of a session is in include/nstf_tools.h.
# 4. The server sits above the model: nothing below it (core, io, ops,
#    backend, model, prof) includes serve/; serve/ headers include no
#    model/, backend/ or ops/ header; tools reach the server through
#    serve/server.h only.
# Exit 0 when clean, 1 with one line per violation (file:line: text).
set -u

# grep_code PATTERN FILE...: matches outside comment lines, as file:line: text
grep_code() {
    pat=$1
    shift
    [ $# -eq 0 ] && return 0
    grep -nE "$pat" "$@" /dev/null | grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/\*|\*|//)'
}

files_in() { # files_in DIR...: C/C++/CUDA sources and headers
    for d in "$@"; do
        [ -d "$d" ] && find "$d" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)
    done | LC_ALL=C sort
}

check() {
    root=$1
    bad=0
    report() { # report TEXT RULE
        if [ -n "$1" ]; then
            echo "$1" | sed "s|^$root/||; s|\$|   <- $2|"
            bad=1
        fi
    }
    vendor_files=$(files_in "$root/src" "$root/tools" | grep -vE "^$root/src/ops/gpu/|^$root/src/backend/(backend\.c|gpu[^/]*)$")
    # shellcheck disable=SC2086
    report "$(grep_code '(^|[^A-Za-z0-9_])(cuda|hip)[A-Z][A-Za-z0-9_]*|NSTF_HAVE_(CUDA|HIP)' $vendor_files)" \
        "vendor names belong in src/ops/gpu/ and the backend files"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "(backend|model|prof)/' $(files_in "$root/src/ops"))" "ops/ depends on core/ only"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "(model|prof)/' $(files_in "$root/src/backend"))" \
        "backend/ depends on ops/ and core/ only"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "prof/' $(files_in "$root/src/model"))" \
        "the model never calls the profiler: it calls the hooks it is given"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "(model|backend)/' $(files_in "$root/src/prof" | grep '\.h$'))" \
        "prof/ headers speak of sessions through nstf.h only"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "(model|backend|ops)/' $(files_in "$root/tools"))" \
        "tools use nstf.h and nstf_tools.h, not struct internals"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "serve/' $(files_in "$root/src/core" "$root/src/io" "$root/src/ops" "$root/src/backend" \
        "$root/src/model" "$root/src/prof"))" "the server sits above the model: nothing below includes serve/"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "(model|backend|ops)/' $(files_in "$root/src/serve" | grep '\.h$'))" \
        "serve/ headers speak through nstf.h, core/ and io/ types"
    # shellcheck disable=SC2086
    report "$(grep_code '#include "serve/' $(files_in "$root/tools") | grep -v '#include "serve/server\.h"')" \
        "tools reach the server through serve/server.h only"
    n=$(files_in "$root/src" "$root/tools" | wc -l)
    if [ $bad -eq 0 ]; then echo "test_layering: $n sources clean"; fi
    return $bad
}

self_test() {
    t=$(mktemp -d) || exit 1
    trap 'rm -rf "$t"' EXIT
    fails=0
    expect() { # expect <0|1> <name> <relative file> <content>
        rm -rf "$t/r" && mkdir -p "$t/r/src/core" "$(dirname "$t/r/$3")"
        printf '/* ok.c */\n' > "$t/r/src/core/ok.c"
        printf '%s\n' "$4" > "$t/r/$3"
        check "$t/r" > "$t/out" 2>&1
        rc=$?
        if [ "$rc" -ne "$1" ]; then
            echo "self-test '$2': exit $rc, expected $1"; cat "$t/out"; fails=1
        fi
    }
    expect 0 clean src/model/x.c '#include "backend/backend.h"
/* cudaMalloc in a comment */'
    expect 1 cuda_in_model src/model/x.c 'void f(void) { cudaMalloc(0, 0); }'
    expect 1 have_cuda_in_tools tools/x.c '#if defined(NSTF_HAVE_CUDA)
#endif'
    expect 0 cuda_in_gpu_ops src/ops/gpu/x.cu 'void f(void) { cudaMalloc(0, 0); }'
    expect 0 have_in_backend src/backend/gpu.c '#if defined(NSTF_HAVE_HIP)
#endif'
    expect 1 hip_in_backend_cpu src/backend/cpu.c 'hipStream_t s;'
    expect 1 ops_to_model src/ops/x.c '#include "model/llama.h"'
    expect 1 backend_to_model src/backend/x.c '#include "model/llama.h"'
    expect 1 model_to_prof src/model/x.c '#include "prof/profiler.h"'
    expect 1 prof_header_to_model src/prof/x.h '#include "model/session.h"'
    expect 0 prof_source_to_model src/prof/x.c '#include "model/session.h"'
    expect 1 tools_to_model tools/x.c '#include "model/session.h"'
    expect 0 tools_to_prof tools/x.c '#include "prof/report.h"'
    expect 1 model_to_serve src/model/x.c '#include "serve/engine.h"'
    expect 0 serve_to_model src/serve/x.c '#include "model/session.h"'
    expect 1 serve_header_to_model src/serve/x.h '#include "model/llama.h"'
    expect 0 tools_to_server tools/x.c '#include "serve/server.h"'
    expect 1 tools_to_engine tools/x.c '#include "serve/engine.h"'
    if [ $fails -eq 0 ]; then echo "test_layering: self-test passed"; fi
    return $fails
}

case ${1:-} in
--self-test) self_test ;;
"") echo "usage: test_layering.sh ROOT | --self-test"; exit 2 ;;
*) self_test > /dev/null || { echo "test_layering: self-test failed (run with --self-test)"; exit 1; }
   check "$1" ;;
esac
