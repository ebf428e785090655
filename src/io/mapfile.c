/* mapfile.c — read-only mmap of a whole regular file (see mapfile.h). */
#include "io/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

nstf_status nstf_map_file(const char *path, const char *kind, const uint8_t **base, uint64_t *size) {
    *base = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nstf_set_error(NSTF_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return nstf_set_error(NSTF_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    nstf_status st = NSTF_OK;
    if (S_ISDIR(sb.st_mode)) st = nstf_set_error(NSTF_ERR_IO, "%s: cannot read: %s", path, strerror(EISDIR));
    else if (!S_ISREG(sb.st_mode)) st = nstf_set_error(NSTF_ERR_IO, "%s: not a regular file", path);
    else if (sb.st_size == 0)
        st = nstf_set_error(NSTF_ERR_FORMAT, "%s: empty file (0 bytes); not a %s file", path, kind);
    else if ((uint64_t)sb.st_size > SIZE_MAX)
        st = nstf_set_error(NSTF_ERR_IO, "%s: file of %lld bytes is too large to map", path, (long long)sb.st_size);
    if (st != NSTF_OK) {
        close(fd);
        return st;
    }
    void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return nstf_set_error(NSTF_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    *base = m;
    *size = (uint64_t)sb.st_size;
    return NSTF_OK;
}

void nstf_unmap_file(const uint8_t *base, uint64_t size) {
    if (base && size) munmap((void *)base, (size_t)size);
}
