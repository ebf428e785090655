/* mem.h — overflow-checked size arithmetic and allocation helpers.
 *
 * Every multiplication that sizes an allocation or a file range goes
 * through nstf_mul_ok / nstf_add_ok. Allocation failures become
 * NSTF_ERR_OOM with the requested size in the message. */
#ifndef NSTF_CORE_MEM_H
#define NSTF_CORE_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

static inline bool nstf_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool nstf_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

/* malloc/calloc with a readable error: `what` names the buffer. Returns
 * NULL and sets NSTF_ERR_OOM on failure. 64-byte aligned. */
void *nstf_alloc(size_t bytes, const char *what);
void *nstf_calloc(size_t n, size_t size, const char *what);
void nstf_free(void *p);

/* Host memory available for new allocations without swapping (Linux
 * MemAvailable), in bytes; 0 when unknown. Used to fail early, with the
 * figures, instead of being killed by the OOM killer mid-run. */
uint64_t nstf_host_mem_available(void);
/* MemTotal and MemAvailable in bytes (0 where unknown). */
void nstf_host_mem_info(uint64_t *total, uint64_t *avail);

#endif
