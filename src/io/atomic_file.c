/* atomic_file.c — temporary file, fsync, rename (see atomic_file.h). */
#include "io/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

nstf_status nstf_afile_open(nstf_afile *f, const char *path) {
    f->fd = -1;
    if (strlen(path) >= sizeof f->path) return nstf_set_error(NSTF_ERR_INVALID_ARG, "path too long: %s", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->tmp, sizeof f->tmp, "%s.tmp", path);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) return nstf_set_error(NSTF_ERR_IO, "%s: cannot create: %s", f->tmp, strerror(errno));
    return NSTF_OK;
}

nstf_status nstf_afile_write(nstf_afile *f, const void *p, size_t n) {
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return nstf_set_error(NSTF_ERR_IO, "%s: write failed: %s", f->tmp, w < 0 ? strerror(errno) : "no progress");
        c += w;
        n -= (size_t)w;
    }
    return NSTF_OK;
}

/* fsync the folder that holds path, so the rename itself is on disk */
static nstf_status sync_dir(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    const char *dir = dirname(buf);
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d < 0) return nstf_set_error(NSTF_ERR_IO, "%s: cannot open the folder to flush it: %s", dir, strerror(errno));
    int r = fsync(d);
    int e = errno;
    close(d);
    if (r != 0 && e != EINVAL) return nstf_set_error(NSTF_ERR_IO, "%s: cannot flush the folder: %s", dir, strerror(e));
    return NSTF_OK;
}

nstf_status nstf_afile_commit(nstf_afile *f) {
    nstf_status st = NSTF_OK;
    if (fsync(f->fd) != 0) st = nstf_set_error(NSTF_ERR_IO, "%s: fsync failed: %s", f->tmp, strerror(errno));
    if (close(f->fd) != 0 && st == NSTF_OK) st = nstf_set_error(NSTF_ERR_IO, "%s: close failed: %s", f->tmp, strerror(errno));
    f->fd = -1;
    if (st == NSTF_OK && rename(f->tmp, f->path) != 0)
        st = nstf_set_error(NSTF_ERR_IO, "%s: cannot rename to %s: %s", f->tmp, f->path, strerror(errno));
    if (st != NSTF_OK) {
        unlink(f->tmp);
        return st;
    }
    return sync_dir(f->path);
}

void nstf_afile_abort(nstf_afile *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    unlink(f->tmp);
}

nstf_status nstf_afile_publish(const char *tmp, const char *path) {
    nstf_afile f;
    f.fd = open(tmp, O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) {
        nstf_status st = nstf_set_error(NSTF_ERR_IO, "%s: cannot open: %s", tmp, strerror(errno));
        unlink(tmp);
        return st;
    }
    snprintf(f.path, sizeof f.path, "%s", path);
    snprintf(f.tmp, sizeof f.tmp, "%s", tmp);
    return nstf_afile_commit(&f);
}
