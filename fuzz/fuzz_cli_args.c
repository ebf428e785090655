/* fuzz_cli_args.c — libFuzzer target for the CLI's number parsers
 * (tools/cli_util.c: cli_parse_int, cli_parse_u64, cli_parse_float) and
 * cli_value.
 *
 * The input is cut at its first NUL into the string the parsers see (as
 * argv would hand it over). Each parser is called with the ranges the
 * commands use, and what it accepts is checked against an independent
 * oracle: an accepted integer lies in [min, max] and equals a plain decimal
 * parse of the string (blanks and a sign allowed, as strtol does); a u64 is
 * digits only (no blanks, no sign) and equals their decimal value; an
 * accepted float is finite, in range, and what strtod reads. The rest of
 * the input, split at NULs, becomes an argv for cli_value. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"

#include "cli_util.h"

#define FAIL FUZZ_FAIL

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decimal digits of s after optional blanks and one sign: the value, or
 * false when there are no digits, junk follows, or it exceeds 2^64 - 1. */
static bool oracle_u(const char *s, bool *neg, uint64_t *v) {
    while (*s == ' ' || (*s >= '\t' && *s <= '\r')) s++;
    *neg = false;
    if (*s == '+' || *s == '-') *neg = *s++ == '-';
    if (*s < '0' || *s > '9') return false;
    uint64_t x = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        if (x > (UINT64_MAX - (uint64_t)(*s - '0')) / 10) return false;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    if (*s) return false;
    *v = x;
    return true;
}

static void check_int(const char *s, long min, long max) {
    int out = 12345;
    bool ok = cli_parse_int("--n", s, min, max, &out);
    bool neg;
    uint64_t mag;
    bool parsed = oracle_u(s, &neg, &mag);
    long want = 0;
    bool in_range = false;
    if (parsed && mag <= (uint64_t)LONG_MAX + neg) {
        want = neg ? (long)(0 - mag) : (long)mag;
        in_range = want >= min && want <= max;
    }
    if (ok != in_range) FAIL("cli_parse_int('%s', %ld..%ld) returned %d, oracle says %d", s, min, max, ok, in_range);
    if (ok && out != want) FAIL("cli_parse_int('%s') gave %d, expected %ld", s, out, want);
    if (!ok && out != 12345) FAIL("cli_parse_int('%s') wrote its output on failure", s);
}

static void check_u64(const char *s) {
    uint64_t out = 777;
    bool ok = cli_parse_u64("--seed", s, &out);
    bool neg;
    uint64_t mag;
    /* digits only: no blanks, no sign */
    bool want_ok = *s >= '0' && *s <= '9' && oracle_u(s, &neg, &mag);
    if (ok != want_ok) FAIL("cli_parse_u64('%s') returned %d, oracle says %d", s, ok, want_ok);
    if (ok && out != mag) FAIL("cli_parse_u64('%s') gave %llu", s, (unsigned long long)out);
    if (!ok && out != 777) FAIL("cli_parse_u64('%s') wrote its output on failure", s);
}

static void check_float(const char *s, double min, double max) {
    float out = 0.5f;
    bool ok = cli_parse_float("--temp", s, min, max, &out);
    if (ok) {
        if (!isfinite(out)) FAIL("cli_parse_float('%s') accepted a non-finite value", s);
        /* the double was in range; its float rounding may sit one ulp outside */
        if ((double)out < min - fabs(min) * 1e-7 || (double)out > max + fabs(max) * 1e-7)
            FAIL("cli_parse_float('%s', %g..%g) gave %g", s, min, max, (double)out);
        errno = 0;
        char *end;
        double ref = strtod(s, &end);
        if (*end || (float)ref != out) FAIL("cli_parse_float('%s') gave %g, strtod says %g", s, (double)out, ref);
    } else if (out != 0.5f) {
        FAIL("cli_parse_float('%s') wrote its output on failure", s);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size + 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    buf[size] = 0;
    const char *s = buf;

    /* the ranges tools/cmd_run.c passes */
    check_int(s, 1, 1 << 24);
    check_int(s, 1, 1024);
    check_int(s, 0, 1 << 30);
    check_int(s, -1, 1 << 20);
    check_int(s, -2147483647L - 1, 2147483647L);
    check_u64(s);
    check_float(s, 0, 1e6);
    check_float(s, 1e-9, 1);
    check_float(s, 1e-6, 1e6);
    check_float(s, -1e30, 1e30);

    /* argv from the NUL-separated pieces; walk it with cli_value */
    char *argv[64];
    int argc = 0;
    for (size_t i = 0; i <= size && argc < 64;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    for (int i = 0; i < argc; i++) {
        int j = i;
        const char *v = cli_value(argc, argv, &j);
        if (v ? (j != i + 1 || v != argv[i + 1]) : (j != i || i + 1 < argc))
            FAIL("cli_value at %d of %d: j = %d", i, argc, j);
    }
    free(buf);
    return 0;
}
