/* status.c — thread-local last-error message and status names. */
#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char g_msg[1024];

const char *nstf_last_error(void) { return g_msg[0] ? g_msg : "no error"; }

void nstf_clear_error(void) { g_msg[0] = 0; }

const char *nstf_status_str(nstf_status s) {
    switch (s) {
    case NSTF_OK: return "ok";
    case NSTF_ERR_INVALID_ARG: return "invalid argument";
    case NSTF_ERR_IO: return "I/O error";
    case NSTF_ERR_FORMAT: return "malformed file";
    case NSTF_ERR_UNSUPPORTED: return "unsupported";
    case NSTF_ERR_OOM: return "out of memory";
    case NSTF_ERR_RANGE: return "out of range";
    case NSTF_ERR_GPU: return "GPU error";
    case NSTF_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

nstf_status nstf_set_error(nstf_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_msg, sizeof g_msg, fmt, ap);
    va_end(ap);
    return s;
}

nstf_status nstf_wrap_error(nstf_status s, const char *fmt, ...) {
    char prefix[512], old[sizeof g_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_msg, sizeof old);
    /* Both parts are bounded; a long message is cut, never overrun. */
    size_t np = strlen(prefix);
    if (np > sizeof g_msg - 3) np = sizeof g_msg - 3;
    memcpy(g_msg, prefix, np);
    memcpy(g_msg + np, ": ", 2);
    size_t room = sizeof g_msg - np - 3, no = strlen(old);
    if (no > room) no = room;
    memcpy(g_msg + np + 2, old, no);
    g_msg[np + 2 + no] = 0;
    return s;
}
