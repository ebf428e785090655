/* atomic_file.h — a file written whole or not at all: the bytes go to a
 * temporary file beside the target (PATH.tmp), which is flushed to disk
 * (fsync) and renamed over the target, then the folder is flushed too.
 * A crash, a kill or a full disk before the rename leaves the target as it
 * was (the previous checkpoint, shard or model). Used by checkpoints,
 * token shards and the exported GGUF. */
#ifndef NSTF_IO_ATOMIC_FILE_H
#define NSTF_IO_ATOMIC_FILE_H

#include <stddef.h>

#include "core/status.h"

typedef struct nstf_afile {
    int fd;
    char path[1024], tmp[1040];
} nstf_afile;

/* Create PATH.tmp (replacing a stale one). */
nstf_status nstf_afile_open(nstf_afile *f, const char *path);
/* Append n bytes; a failure (ENOSPC, EFBIG, ...) names the file and the
 * reason. */
nstf_status nstf_afile_write(nstf_afile *f, const void *p, size_t n);
/* fsync, close, rename over PATH, fsync the folder. On failure the
 * temporary file is removed and PATH is untouched. */
nstf_status nstf_afile_commit(nstf_afile *f);
/* Give up: close and remove the temporary file. */
void nstf_afile_abort(nstf_afile *f);
/* fsync, close and rename a temporary file someone else wrote (tmp) over
 * path, and fsync the folder; the temporary file is removed on failure. */
nstf_status nstf_afile_publish(const char *tmp, const char *path);

#endif
