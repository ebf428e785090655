/* text.c — the text helpers of `nstf isa`'s parsers (isa.h): bounded
 * string copies, strict numbers, and a line reader that counts lines for
 * the file:line of every message. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "isa.h"

bool isa_copy_str(char *dst, size_t cap, const char *src, size_t len) {
    if (len >= cap) return false;
    memcpy(dst, src, len);
    dst[len] = 0;
    return true;
}

bool isa_parse_num(const char *s, long *out) {
    while (*s == ' ' || *s == '\t') s++;
    if (!isdigit((unsigned char)*s)) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || v < 0) return false;
    while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n') end++;
    if (*end && strncmp(end, "bytes", 5) != 0) return false;
    *out = v;
    return true;
}

const char *isa_skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

bool isa_starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

bool isa_reader_open(isa_reader *r, const char *path, const char *what) {
    r->line = NULL;
    r->cap = 0;
    r->ln = 0;
    r->f = fopen(path, "r");
    if (!r->f) fprintf(stderr, "nstf isa: cannot open %s%s: %s\n", what, path, strerror(errno));
    return r->f != NULL;
}

char *isa_reader_next(isa_reader *r) {
    if (getline(&r->line, &r->cap, r->f) == -1) return NULL;
    r->ln++;
    return r->line;
}

void isa_reader_close(isa_reader *r) {
    free(r->line);
    fclose(r->f);
}
