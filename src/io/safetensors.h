/* safetensors.h — safetensors reader (mmap, validate-before-trust), one
 * file or a sharded set through model.safetensors.index.json.
 *
 * A file is: u64 N (little-endian), N bytes of a UTF-8 JSON object, then
 * the data section. Each key of the object but "__metadata__" names a
 * tensor: {"dtype": "BF16", "shape": [rows, cols], "data_offsets":
 * [begin, end]}, offsets relative to the data section. "__metadata__" is
 * an object of strings.
 *
 * Checked before any pointer is handed out: N bounded by the file size and
 * NSTF_ST_MAX_HEADER; the header valid UTF-8 without NUL characters, valid
 * JSON (cJSON) followed only by blanks; names non-empty and unique (across
 * shards too); every dtype known, and one of F32, F16, BF16 (any other
 * known dtype is NSTF_ERR_UNSUPPORTED naming the tensor); every shape
 * entry and offset an integer in [0, 2^53); the element count and byte size
 * without overflow and equal to end - begin; the range inside the file,
 * aligned to the element size, and overlapping no other tensor's range.
 * Gaps between ranges are allowed. A sharded set is checked as a whole:
 * shard names are plain file names beside the index, every shard is
 * validated, every tensor of a shard is in the index's weight_map under
 * that shard, and every entry of the map is found there.
 *
 * A malformed file is NSTF_ERR_FORMAT with a message naming the file. */
#ifndef NSTF_IO_SAFETENSORS_H
#define NSTF_IO_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#define NSTF_ST_MAX_DIMS 8
/* The reference implementation's limit on the JSON header (100 MB). */
#define NSTF_ST_MAX_HEADER 100000000ull

typedef struct nstf_st_tensor {
    const char *name;                /* NUL-terminated UTF-8, owned by the set */
    nstf_type type;                  /* NSTF_TYPE_F32, _F16 or _BF16 */
    uint32_t n_dims;                 /* 0 (a scalar) .. NSTF_ST_MAX_DIMS */
    int64_t shape[NSTF_ST_MAX_DIMS]; /* PyTorch order: shape[0] outermost; unused = 1 */
    uint64_t n_elems;
    uint64_t n_bytes;
    uint64_t begin;                  /* data_offsets[0], from the shard's data section */
    const void *data;                /* inside the shard's mapping */
    uint32_t shard;                  /* index into nstf_safetensors.shards */
} nstf_st_tensor;

typedef struct nstf_st_shard {
    char *path;
    const uint8_t *base; /* the whole file */
    uint64_t size;
    bool mapped;         /* else borrowed memory */
    uint64_t data_start; /* 8 + header length */
} nstf_st_shard;

typedef struct nstf_safetensors {
    char *path;               /* the file, index or folder opened: for messages */
    uint32_t n_shards;
    nstf_st_shard *shards;
    uint64_t n_tensors;
    nstf_st_tensor *tensors;  /* sorted by name */
    uint64_t n_meta;          /* __metadata__ of the first shard (string pairs) */
    char **meta_keys, **meta_vals;
} nstf_safetensors;

/* One .safetensors file. */
nstf_status nstf_safetensors_open(const char *path, nstf_safetensors **out);
/* A sharded set: `index_path` is a model.safetensors.index.json; the shards
 * are read from its folder. */
nstf_status nstf_safetensors_open_index(const char *index_path, nstf_safetensors **out);
/* A model folder: model.safetensors, else model.safetensors.index.json. */
nstf_status nstf_safetensors_open_dir(const char *dir, nstf_safetensors **out);
/* Validate an in-memory file (borrowed: must outlive the result); `name`
 * is used in messages. Used by tests and the fuzzer. */
nstf_status nstf_safetensors_open_memory(const void *data, uint64_t size, const char *name,
                                         nstf_safetensors **out);
void nstf_safetensors_close(nstf_safetensors *st);

const nstf_st_tensor *nstf_safetensors_find(const nstf_safetensors *st, const char *name);
/* The value of a __metadata__ key, or NULL. */
const char *nstf_safetensors_meta(const nstf_safetensors *st, const char *key);

#endif
