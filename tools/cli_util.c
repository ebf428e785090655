/* cli_util.c — strict number parsing for the CLI. */
#include "cli_util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool cli_parse_int(const char *flag, const char *s, long min, long max, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno) {
        fprintf(stderr, "nstf: %s expects an integer, got '%s'\n", flag, s);
        return false;
    }
    if (v < min || v > max) {
        fprintf(stderr, "nstf: %s %ld is out of range (%ld..%ld)\n", flag, v, min, max);
        return false;
    }
    *out = (int)v;
    return true;
}

bool cli_parse_u64(const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    /* Digits only: strtoull would skip blanks and negate after a '-', so
     * " -1" would come back as 2^64 - 1. */
    if (*s < '0' || *s > '9' || *end || errno) {
        fprintf(stderr, "nstf: %s expects a non-negative integer, got '%s'\n", flag, s);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_float(const char *flag, const char *s, double min, double max, float *out) {
    double v;
    if (!cli_parse_double(flag, s, min, max, &v)) return false;
    *out = (float)v;
    return true;
}

bool cli_parse_double(const char *flag, const char *s, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) {
        fprintf(stderr, "nstf: %s expects a number, got '%s'\n", flag, s);
        return false;
    }
    if (v < min || v > max) {
        fprintf(stderr, "nstf: %s %g is out of range (%g..%g)\n", flag, v, min, max);
        return false;
    }
    *out = v;
    return true;
}

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "nstf: %s needs a value (see --help)\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

/* The whole text file at path, NUL-terminated (malloc), or NULL with a
 * line on stderr naming `what`. */
char *cli_read_file(const char *path, const char *what) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "nstf: cannot open %s '%s': %s\n", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf && ferror(f)) {
        fprintf(stderr, "nstf: error reading %s '%s': %s\n", what, path, strerror(errno));
        free(buf);
        buf = NULL;
    } else if (!buf) {
        fprintf(stderr, "nstf: out of memory reading '%s'\n", path);
    } else {
        buf[len] = 0;
        if (strlen(buf) != len) {
            fprintf(stderr, "nstf: %s '%s' contains NUL bytes\n", what, path);
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}
