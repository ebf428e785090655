/* utf8.h — strict UTF-8 validation, shared by the tokenizer (text to
 * encode) and the file readers (names and strings in headers). */
#ifndef NSTF_IO_UTF8_H
#define NSTF_IO_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Returns the offset of the first invalid byte, or -1 if `s` is valid UTF-8
 * (no overlong forms, no surrogates, nothing above U+10FFFF); *why (may be
 * NULL) then says what is wrong ("truncated sequence", "overlong encoding", ...). */
int64_t nstf_utf8_check(const uint8_t *s, size_t n, const char **why);

/* `s` as valid UTF-8 without NUL bytes: each byte that does not begin a
 * valid sequence (and each NUL) becomes U+FFFD, as decoders show them.
 * out has room for 3 n bytes (+ 1 for the terminating NUL it writes);
 * returns the length written. */
size_t nstf_utf8_repair(const uint8_t *s, size_t n, char *out);

#endif
