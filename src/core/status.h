/* status.h — error codes and the per-thread "last error" message.
 *
 * Every fallible library function returns an nstf_status and, on failure,
 * records one readable line (what failed, where, what to do) with
 * nstf_set_error(). The message lives in thread-local storage, so it is
 * safe to read from the thread that made the call. The library never exits
 * or aborts on bad input. */
#ifndef NSTF_CORE_STATUS_H
#define NSTF_CORE_STATUS_H

#include "nstf.h"

#if defined(__GNUC__)
#define NSTF_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define NSTF_PRINTF(a, b)
#endif

/* Records a formatted message for `s` and returns `s`, so callers can write
 * `return nstf_set_error(NSTF_ERR_FORMAT, "%s: bad magic", path);`. */
nstf_status nstf_set_error(nstf_status s, const char *fmt, ...) NSTF_PRINTF(2, 3);

/* Prefixes the current message with more context ("loading x.gguf: ..."). */
nstf_status nstf_wrap_error(nstf_status s, const char *fmt, ...) NSTF_PRINTF(2, 3);

void nstf_clear_error(void);

/* Propagate a failing status unchanged. */
#define NSTF_TRY(expr)                         \
    do {                                       \
        nstf_status nstf_try_s_ = (expr);      \
        if (nstf_try_s_ != NSTF_OK)            \
            return nstf_try_s_;                \
    } while (0)

#endif
