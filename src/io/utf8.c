/* utf8.c — strict UTF-8 validation (see utf8.h). */
#include "io/utf8.h"

int64_t nstf_utf8_check(const uint8_t *s, size_t n, const char **why) {
    const char *unused;
    if (!why) why = &unused;
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) len = 2;
        else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;        /* overlong */
            if (c == 0xED) hi = 0x9F;        /* surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;        /* overlong */
            if (c == 0xF4) hi = 0x8F;        /* > U+10FFFF */
        } else {
            *why = c >= 0x80 && c <= 0xBF ? "unexpected continuation byte"
                 : c <= 0xC1 ? "overlong encoding" : "byte never valid in UTF-8";
            return (int64_t)i;
        }
        if (n - i < (size_t)len) { *why = "truncated sequence"; return (int64_t)i; }
        for (int k = 1; k < len; k++) {
            uint8_t d = s[i + (size_t)k];
            uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (d < l || d > h) {
                *why = d < 0x80 || d > 0xBF ? "truncated sequence"
                     : c == 0xED ? "surrogate code point"
                     : c == 0xF4 ? "code point above U+10FFFF" : "overlong encoding";
                return (int64_t)i;
            }
        }
        i += (size_t)len;
    }
    return -1;
}


size_t nstf_utf8_repair(const uint8_t *s, size_t n, char *out) {
    size_t o = 0;
    while (n) {
        int64_t bad = nstf_utf8_check(s, n, NULL);
        size_t ok = bad < 0 ? n : (size_t)bad;
        for (size_t i = 0; i < ok; i++) { /* the valid run, NULs replaced */
            if (s[i]) {
                out[o++] = (char)s[i];
            } else {
                out[o++] = (char)0xEF, out[o++] = (char)0xBF, out[o++] = (char)0xBD;
            }
        }
        if (bad < 0) break;
        out[o++] = (char)0xEF, out[o++] = (char)0xBF, out[o++] = (char)0xBD;
        s += ok + 1;
        n -= ok + 1;
    }
    out[o] = 0;
    return o;
}
