#!/bin/sh
# test_hygiene.sh — library hygiene rules that a grep can check.
#
#   sh tests/test_hygiene.sh SRC_DIR       check every source under SRC_DIR
#   sh tests/test_hygiene.sh --self-test   check that the checks catch things
#
# 1. The library never ends the process: no call of exit, _Exit,
#    quick_exit, abort, assert or __builtin_trap in any library source
#    (.c .h .cu .cuh .cpp .hip). Mentions inside comments ("//" after code,
#    or lines that are part of a block comment and start with "/*" or "*")
#    do not count. A call that must stay (say, a device-side trap in a GPU
#    kernel that cannot return an error) carries the comment
#    `hygiene: allow <reason>` on the same line.
# 2. Every library source opens with a block comment saying what it is
#    (its first line starts with "/*").
# Exit 0 when clean, 1 with one line per violation (file:line: text).
set -u

check() {
    dir=$1
    bad=0
    files=$(find "$dir" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
        -o -name '*.cpp' -o -name '*.hip' \) | LC_ALL=C sort)
    if [ -z "$files" ]; then
        echo "test_hygiene: no sources under $dir"
        return 1
    fi
    for f in $files; do
        # rule 1: process-ending calls
        hits=$(grep -nE '(^|[^A-Za-z0-9_])(exit|_Exit|quick_exit|abort|assert|__builtin_trap)[[:space:]]*\(' "$f" |
            grep -v 'hygiene: allow' |
            grep -vE '^[0-9]+:[[:space:]]*(/\*|\*|//)' |
            awk -F: '{
                line = $0; sub(/^[0-9]+:/, "", line);
                code = line; sub(/\/\/.*/, "", code); gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", code);
                if (code ~ /(^|[^A-Za-z0-9_])(exit|_Exit|quick_exit|abort|assert|__builtin_trap)[[:space:]]*\(/) print
            }')
        if [ -n "$hits" ]; then
            echo "$hits" | sed "s|^|$f:|; s|\$|   <- the library must return an nstf_status, not end the process|"
            bad=1
        fi
        # rule 2: a file header comment
        first=$(head -n 1 "$f")
        case $first in
        /\**) ;;
        *) echo "$f:1: does not open with a block comment saying what the file is and owns"; bad=1 ;;
        esac
    done
    n=$(echo "$files" | wc -l)
    if [ $bad -eq 0 ]; then echo "test_hygiene: $n sources clean"; fi
    return $bad
}

self_test() {
    t=$(mktemp -d) || exit 1
    trap 'rm -rf "$t"' EXIT
    fails=0
    expect() { # expect <0|1> <name> <content>
        mkdir -p "$t/$2" && printf '%s\n' "$3" > "$t/$2/x.c"
        check "$t/$2" > "$t/out" 2>&1
        rc=$?
        if [ "$rc" -ne "$1" ]; then
            echo "self-test '$2': exit $rc, expected $1"; cat "$t/out"; fails=1
        fi
    }
    expect 0 clean '/* x.c — fine. never calls exit() or abort() */
static_assert(1, "ok");
_Static_assert(1, "ok");
int f(void) { return exit_code(); } // exit(1) in a comment
 * assert(x) in a block comment line'
    expect 1 exit '/* x.c */
void f(void) { exit(1); }'
    expect 1 abort '/* x.c */
void f(void) { if (1) abort (); }'
    expect 1 assert '/* x.c */
#include <assert.h>
void f(int x) { assert(x > 0); }'
    expect 1 trap '/* x.c */
void f(void) { __builtin_trap(); }'
    expect 1 after_comment '/* x.c */
void f(void) { /* c */ exit(2); }'
    expect 0 allowed '/* x.c */
__device__ void f(void) { __builtin_trap(); } /* hygiene: allow device code cannot return */'
    expect 1 no_header 'int x;'
    if [ $fails -eq 0 ]; then echo "test_hygiene: self-test passed"; fi
    return $fails
}

case ${1:-} in
--self-test) self_test ;;
"") echo "usage: test_hygiene.sh SRC_DIR | --self-test"; exit 2 ;;
*) self_test > /dev/null || { echo "test_hygiene: self-test failed (run with --self-test)"; exit 1; }
   check "$1" ;;
esac
