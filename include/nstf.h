/* nstf.h — the public C API of the NSTF engine.
 *
 * Conventions:
 *  - Every fallible function returns an nstf_status. NSTF_OK is 0. On any
 *    other value a one-line message (what failed, where, what to do) can be
 *    read with nstf_last_error() on the calling thread until the next
 *    failing call on that thread.
 *  - The library never calls exit() or abort() on bad input.
 *  - Sizes, offsets and counts are 64-bit.
 */
#ifndef NSTF_H
#define NSTF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nstf_status {
    NSTF_OK = 0,
    NSTF_ERR_INVALID_ARG = 1, /* a caller-supplied value is out of its domain */
    NSTF_ERR_IO = 2,          /* open/read/write/mmap failed */
    NSTF_ERR_FORMAT = 3,      /* a file is malformed or truncated */
    NSTF_ERR_UNSUPPORTED = 4, /* valid input the engine cannot handle (arch, type) */
    NSTF_ERR_OOM = 5,         /* host or device allocation failed */
    NSTF_ERR_RANGE = 6,       /* a limit was exceeded (context length, ids) */
    NSTF_ERR_GPU = 7,         /* a GPU runtime call failed */
    NSTF_ERR_INTERNAL = 8,    /* a bug: please report */
} nstf_status;

/* The message recorded by the last failing call on this thread. */
const char *nstf_last_error(void);
/* A short name for a status code ("malformed file"). */
const char *nstf_status_str(nstf_status s);

/* Version of the library. */
#define NSTF_VERSION_STRING "0.1.0"

#ifdef __cplusplus
}
#endif
#endif
