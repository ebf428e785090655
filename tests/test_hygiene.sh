#!/bin/sh
# test_hygiene.sh — library hygiene rules that a grep can check.
#
#   sh tests/test_hygiene.sh SRC_DIR [DIR...]   check every source under SRC_DIR
#                                               (rules 1-3) and under each DIR (rule 3)
#   sh tests/test_hygiene.sh --bench ROOT       check ROOT/bench against ROOT/tests (rule 4)
#   sh tests/test_hygiene.sh --self-test        check that the checks catch things
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
# 3. The environment is read through the switch registry only: no call of
#    getenv or secure_getenv outside SRC_DIR/core/switches.c, in the library
#    or in the other DIRs given (the CLI's tools/). No exception comment:
#    a new variable is a new row of the registry (core/switches.h).
# 4. Benchmarks use no test code: no source under bench/ includes a header
#    of tests/ (an #include "X" where X names a tests/ path, or resolves
#    into tests/ from the including file's folder, or is found only in
#    tests/ and not beside the file, in src/ or in include/, i.e. through an
#    include path), and no build file under bench/ puts tests/ on the
#    include path (-I...tests).
# 5. The library starts threads through nstf_thread_start (core/threadpool.c),
#    which blocks the asynchronous signals in them: no pthread_create
#    elsewhere in SRC_DIR. A program's handlers then run on its own threads.
# Exit 0 when clean, 1 with one line per violation (file:line: text).
set -u

PROC_END='(^|[^A-Za-z0-9_])(exit|_Exit|quick_exit|abort|assert|__builtin_trap)[[:space:]]*\('
THREAD='(^|[^A-Za-z0-9_])pthread_create[[:space:]]*\('
GETENV='(^|[^A-Za-z0-9_])(secure_)?getenv[[:space:]]*\('

# code_hits ERE FILE: "line:text" of each line of FILE whose code (comments
# removed) matches ERE.
code_hits() {
    grep -nE "$1" "$2" |
        grep -vE '^[0-9]+:[[:space:]]*(/\*|\*|//)' |
        RE="$1" awk '{
            re = ENVIRON["RE"]; # not -v: awk would process its backslashes
            line = $0; sub(/^[0-9]+:/, "", line);
            code = line; sub(/\/\/.*/, "", code); gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", code);
            if (code ~ re) print
        }'
}

list_sources() {
    find "$1" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
        -o -name '*.cpp' -o -name '*.hip' \) | LC_ALL=C sort
}

# check_getenv FILE ALLOWED: rule 3 for one file (ALLOWED: the registry's path)
check_getenv() {
    [ "$1" = "$2" ] && return 0
    hits=$(code_hits "$GETENV" "$1")
    [ -z "$hits" ] && return 0
    echo "$hits" | sed "s|^|$1:|; s|\$|   <- read the environment through core/switches.h (the switch registry)|"
    return 1
}

check() {
    dir=$1
    shift
    bad=0
    files=$(list_sources "$dir")
    if [ -z "$files" ]; then
        echo "test_hygiene: no sources under $dir"
        return 1
    fi
    registry="$dir/core/switches.c"
    for f in $files; do
        # rule 1: process-ending calls
        hits=$(code_hits "$PROC_END" "$f" | grep -v 'hygiene: allow')
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
        check_getenv "$f" "$registry" || bad=1
        # rule 5: threads through nstf_thread_start
        if [ "$f" != "$dir/core/threadpool.c" ]; then
            hits=$(code_hits "$THREAD" "$f")
            if [ -n "$hits" ]; then
                echo "$hits" | sed "s|^|$f:|; s|\$|   <- start library threads with nstf_thread_start (core/threadpool.h)|"
                bad=1
            fi
        fi
    done
    n=$(echo "$files" | wc -l)
    for other in "$@"; do
        more=$(list_sources "$other")
        for f in $more; do check_getenv "$f" "$registry" || bad=1; done
        [ -z "$more" ] || n=$((n + $(echo "$more" | wc -l)))
    done
    if [ $bad -eq 0 ]; then echo "test_hygiene: $n sources clean"; fi
    return $bad
}

check_bench() {
    root=$1
    bad=0
    if [ ! -d "$root/bench" ] || [ ! -d "$root/tests" ]; then
        echo "test_hygiene: no bench/ or tests/ under $root"
        return 1
    fi
    tests_dir=$(cd "$root/tests" && pwd -P)
    files=$(find "$root/bench" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \
        -o -name '*.cpp' -o -name '*.hpp' -o -name '*.hip' \) | LC_ALL=C sort)
    for f in $files; do
        dir=$(dirname "$f")
        grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "$f" |
            sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1 \2/' > "$tmp_inc"
        while read -r ln inc; do
            why=""
            case "/$inc" in
            */tests/*) why="names a tests/ path" ;;
            esac
            if [ -z "$why" ] && [ -e "$dir/$inc" ]; then
                target=$(cd "$(dirname "$dir/$inc")" && pwd -P)
                case "$target/" in
                "$tests_dir"/*) why="resolves into tests/" ;;
                esac
            elif [ -z "$why" ] && [ -e "$root/tests/$inc" ] && [ ! -e "$root/src/$inc" ] &&
                [ ! -e "$root/include/$inc" ]; then
                why="is found only in tests/ (through an include path)"
            fi
            if [ -n "$why" ]; then
                echo "$f:$ln: includes \"$inc\", which $why   <- benchmarks must not use test code"
                bad=1
            fi
        done < "$tmp_inc"
    done
    builds=$(find "$root/bench" -type f \( -name 'CMakeLists.txt' -o -name '*.cmake' -o -name '*.sh' \
        -o -name 'Makefile' -o -name '*.mk' \) | LC_ALL=C sort)
    for f in $builds; do
        hits=$(grep -nE '(-I|-isystem[[:space:]]*|include_directories\([^)]*)[^[:space:]"]*tests([/"[:space:])]|$)' "$f")
        if [ -n "$hits" ]; then
            echo "$hits" | sed "s|^|$f:|; s|\$|   <- benchmarks must not put tests/ on the include path|"
            bad=1
        fi
    done
    n=$(echo "$files" | wc -l)
    if [ $bad -eq 0 ]; then echo "test_hygiene: $n bench sources use no test headers"; fi
    return $bad
}

self_test() {
    t=$(mktemp -d) || exit 1
    trap 'rm -rf "$t" "$tmp_inc"' EXIT
    fails=0
    expect() { # expect <0|1> <name> <content> [path of the file, default x.c]
        mkdir -p "$(dirname "$t/$2/${4:-x.c}")" && printf '%s\n' "$3" > "$t/$2/${4:-x.c}"
        check "$t/$2" > "$t/out" 2>&1
        rc=$?
        if [ "$rc" -ne "$1" ]; then
            echo "self-test '$2': exit $rc, expected $1"; cat "$t/out"; fails=1
        fi
    }
    expect_tools() { # expect_tools <0|1> <name> <content>: the file in a second DIR
        mkdir -p "$t/$2/src" "$t/$2/tools" && printf '/* y.c */\n' > "$t/$2/src/y.c" &&
            printf '%s\n' "$3" > "$t/$2/tools/x.c"
        check "$t/$2/src" "$t/$2/tools" > "$t/out" 2>&1
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
    expect 1 getenv '/* x.c */
const char *f(void) { return getenv("NSTF_X"); }'
    expect 1 secure_getenv '/* x.c */
const char *f(void) { return secure_getenv ("HOME"); }'
    expect 0 getenv_comment '/* x.c — reads nothing; getenv("X") is the registry'"'"'s job */
 * getenv("Y") in a block comment line
int getenv_count; // getenv("Z")'
    expect 0 registry '/* switches.c — the registry */
static const char *read(const char *n) { return getenv(n); }' core/switches.c
    expect 1 not_the_registry '/* switches.c — another file of that name */
static const char *read(const char *n) { return getenv(n); }' ops/switches.c
    expect 1 allow_does_not_apply '/* x.c */
const char *f(void) { return getenv("X"); } /* hygiene: allow */'
    expect 1 thread '/* x.c */
int f(pthread_t *t) { return pthread_create(t, NULL, run, NULL); }'
    expect 0 thread_pool '/* threadpool.c — the one place */
int f(pthread_t *t) { return pthread_create(t, NULL, run, NULL); }' core/threadpool.c
    expect 0 thread_comment '/* x.c — pthread_create( is the job of nstf_thread_start */
int f(pthread_t *t) { return nstf_thread_start(t, run, NULL); }'
    expect_tools 1 getenv_tools '/* x.c — a CLI file */
const char *f(void) { return getenv("HOME"); }'
    expect_tools 0 tools_may_exit '/* x.c — the CLI may end the process */
void f(void) { exit(1); }'
    # rule 4: a tree with tests/, src/ and bench/
    expect_bench() { # expect_bench <0|1> <name> <file under bench/> <content>
        r="$t/bench_$2"
        mkdir -p "$r/tests" "$r/src/ops" "$r/include" "$r/bench/kernels/common" "$r/bench/kernels/gemm"
        printf '/* t.h */\n' > "$r/tests/gpu_mm_test.h"
        printf '/* s.h */\n' > "$r/src/ops/ops.h"
        printf '/* u.h */\n' > "$r/bench/kernels/common/bench_util.h"
        printf '%s\n' "$4" > "$r/bench/$3"
        check_bench "$r" > "$t/out" 2>&1
        rc=$?
        if [ "$rc" -ne "$1" ]; then
            echo "self-test bench '$2': exit $rc, expected $1"; cat "$t/out"; fails=1
        fi
    }
    expect_bench 0 bench_clean kernels/gemm/b.cu '/* b.cu */
#include <vector>
#include "../common/bench_util.h"
#include "ops/ops.h"
// #include "gpu_mm_test.h" in a comment'
    expect_bench 1 bench_bare kernels/gemm/b.cu '/* b.cu */
#include "gpu_mm_test.h"'
    expect_bench 1 bench_relative kernels/gemm/b.cu '/* b.cu */
#  include "../../../tests/gpu_mm_test.h"'
    expect_bench 1 bench_tests_path kernels/common/u2.h '/* u2.h */
#include "tests/gpu_mm_test.h"'
    expect_bench 1 bench_flag kernels/common/build.sh 'INC="-Isrc -Iinclude -Itests"'
    expect_bench 1 bench_cmake CMakeLists.txt 'target_include_directories(b PRIVATE ${PROJECT_SOURCE_DIR}/tests)'
    expect_bench 0 bench_flag_clean kernels/common/build.sh 'INC="-Isrc -Iinclude" # tests are built elsewhere'
    if [ $fails -eq 0 ]; then echo "test_hygiene: self-test passed"; fi
    return $fails
}

tmp_inc=$(mktemp) || exit 1
trap 'rm -f "$tmp_inc"' EXIT
case ${1:-} in
--self-test) self_test ;;
--bench)
    [ -n "${2:-}" ] || { echo "usage: test_hygiene.sh --bench ROOT"; exit 2; }
    ( self_test ) > /dev/null || { echo "test_hygiene: self-test failed (run with --self-test)"; exit 1; }
    check_bench "$2" ;;
"") echo "usage: test_hygiene.sh SRC_DIR [DIR...] | --bench ROOT | --self-test"; exit 2 ;;
*) ( self_test ) > /dev/null || { echo "test_hygiene: self-test failed (run with --self-test)"; exit 1; }
   check "$@" ;;
esac
