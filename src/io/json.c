/* json.c — strict JSON parsing over cJSON (see json.h). */
#include "io/json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/mapfile.h"
#include "io/utf8.h"

typedef unsigned long long ull;

/* 1-based line and column of byte offset `off`. */
static void line_col(const char *t, size_t off, ull *line, ull *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (t[i] == '\n') { (*line)++; *col = 1; }
        else (*col)++;
    }
}

static bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

nstf_status nstf_json_parse(const char *text, size_t n, const char *what, cJSON **out) {
    *out = NULL;
    ull line, col;
    const char *nul = memchr(text, 0, n);
    if (nul) {
        line_col(text, (size_t)(nul - text), &line, &col);
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: NUL byte at offset %llu (line %llu, column %llu)", what,
                              (ull)(nul - text), line, col);
    }
    const char *why = "";
    int64_t bad = nstf_utf8_check((const uint8_t *)text, n, &why);
    if (bad >= 0) {
        line_col(text, (size_t)bad, &line, &col);
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: invalid UTF-8 at offset %lld (line %llu, column %llu): %s",
                              what, (long long)bad, line, col, why);
    }
    /* \u0000 inside a string: cJSON would cut the string there */
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        if (!in_str) { in_str = text[i] == '"'; continue; }
        if (text[i] == '"') in_str = false;
        else if (text[i] == '\\' && i + 1 < n) {
            if (text[i + 1] == 'u' && n - i >= 6 && memcmp(text + i + 2, "0000", 4) == 0) {
                line_col(text, i, &line, &col);
                return nstf_set_error(NSTF_ERR_FORMAT,
                                      "%s: string with an escaped NUL (\\u0000) at line %llu, column %llu", what,
                                      line, col);
            }
            i++;
        }
    }
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, n, &end, false);
    if (!j) {
        size_t off = end && end >= text && end <= text + n ? (size_t)(end - text) : n;
        line_col(text, off, &line, &col);
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: not valid JSON (error at line %llu, column %llu)", what, line,
                              col);
    }
    size_t off = end && end >= text && end <= text + n ? (size_t)(end - text) : n;
    while (off < n && is_blank(text[off])) off++;
    if (off < n) {
        cJSON_Delete(j);
        line_col(text, off, &line, &col);
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: unexpected data after the JSON value at line %llu, column %llu",
                              what, line, col);
    }
    *out = j;
    return NSTF_OK;
}

nstf_status nstf_json_read_file(const char *path, uint64_t max_bytes, cJSON **out) {
    *out = NULL;
    const uint8_t *m;
    uint64_t size;
    NSTF_TRY(nstf_map_file(path, "JSON", &m, &size));
    nstf_status st = size > max_bytes
                         ? nstf_set_error(NSTF_ERR_FORMAT, "%s: %llu bytes is larger than the %llu this file may have",
                                          path, (ull)size, (ull)max_bytes)
                         : nstf_json_parse((const char *)m, (size_t)size, path, out);
    nstf_unmap_file(m, size);
    return st;
}

bool nstf_json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0) || !(d < 9007199254740992.0) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

const char *nstf_json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
