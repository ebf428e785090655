/* mem.c — aligned, checked allocation. */
#include "core/mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *nstf_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || posix_memalign(&p, 64, rounded) != 0) {
        nstf_set_error(NSTF_ERR_OOM, "out of host memory allocating %zu bytes for %s", bytes,
                       what ? what : "a buffer");
        return NULL;
    }
    return p;
}

void *nstf_calloc(size_t n, size_t size, const char *what) {
    uint64_t bytes;
    if (!nstf_mul_ok(n, size, &bytes) || bytes > SIZE_MAX) {
        nstf_set_error(NSTF_ERR_OOM, "allocation size overflow for %s (%zu x %zu)",
                       what ? what : "a buffer", n, size);
        return NULL;
    }
    void *p = nstf_alloc((size_t)bytes, what);
    if (p) memset(p, 0, (size_t)bytes);
    return p;
}

void nstf_free(void *p) { free(p); }

void nstf_host_mem_info(uint64_t *total, uint64_t *avail) {
    *total = *avail = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) *total = (uint64_t)kb * 1024;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *avail = (uint64_t)kb * 1024;
    }
    fclose(f);
}

uint64_t nstf_host_mem_available(void) {
    uint64_t total, avail;
    nstf_host_mem_info(&total, &avail);
    return avail;
}
