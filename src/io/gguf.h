/* gguf.h — GGUF v2/v3 reader (mmap, validate-before-trust) and writer.
 *
 * The reader checks everything before any pointer into the file is handed
 * out: magic, version, counts against the bytes left, string lengths,
 * key/value types, array element types and lengths, n_dims (1..4), every
 * dim > 0, the product of dims and the byte size without overflow, type
 * ids, alignment (a power of two), data offsets aligned and inside the
 * file, and tensor names unique. A malformed file yields NSTF_ERR_FORMAT
 * with a message naming the file and the problem.
 *
 * Strings inside a gguf are not NUL-terminated; they are (len, ptr) views
 * into the mapping, valid until nstf_gguf_close(). */
#ifndef NSTF_IO_GGUF_H
#define NSTF_IO_GGUF_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/dtype.h"
#include "core/status.h"

#define NSTF_GGUF_MAX_DIMS 4
#define NSTF_GGUF_DEFAULT_ALIGNMENT 32

typedef enum nstf_gguf_vtype {
    NSTF_GGUF_UINT8 = 0,
    NSTF_GGUF_INT8 = 1,
    NSTF_GGUF_UINT16 = 2,
    NSTF_GGUF_INT16 = 3,
    NSTF_GGUF_UINT32 = 4,
    NSTF_GGUF_INT32 = 5,
    NSTF_GGUF_FLOAT32 = 6,
    NSTF_GGUF_BOOL = 7,
    NSTF_GGUF_STRING = 8,
    NSTF_GGUF_ARRAY = 9,
    NSTF_GGUF_UINT64 = 10,
    NSTF_GGUF_INT64 = 11,
    NSTF_GGUF_FLOAT64 = 12,
} nstf_gguf_vtype;

typedef struct nstf_gguf_str {
    uint64_t len;
    const char *ptr; /* not NUL-terminated */
} nstf_gguf_str;

typedef struct nstf_gguf_kv {
    nstf_gguf_str key;
    nstf_gguf_vtype type;
    union {
        uint64_t u64;  /* any unsigned integer type, and bool (0/1) */
        int64_t i64;   /* any signed integer type */
        double f64;    /* FLOAT32 / FLOAT64 */
        nstf_gguf_str str;
    } val;
    /* ARRAY only: element type and count; elements of fixed size are
     * little-endian raw data at arr_data; string arrays are decoded into
     * arr_strs (allocated by the reader). Nested arrays are rejected. */
    nstf_gguf_vtype arr_type;
    uint64_t arr_n;
    const void *arr_data;
    nstf_gguf_str *arr_strs;
} nstf_gguf_kv;

typedef struct nstf_gguf_tensor {
    nstf_gguf_str name;
    uint32_t n_dims;
    int64_t ne[NSTF_GGUF_MAX_DIMS]; /* ne[0] is the innermost (row length); unused dims are 1 */
    nstf_type type;
    uint64_t offset;  /* relative to the data section */
    uint64_t n_elems;
    uint64_t n_bytes;
    const void *data; /* inside the mapping */
} nstf_gguf_tensor;

typedef struct nstf_gguf {
    char *path;         /* for messages */
    uint32_t version;
    uint64_t alignment;
    uint64_t n_kv;
    nstf_gguf_kv *kv;
    uint64_t n_tensors;
    nstf_gguf_tensor *tensors;
    uint64_t data_offset; /* start of the tensor data section in the file */
    const uint8_t *base;  /* the whole file */
    uint64_t size;
    bool mapped;          /* base is an mmap (else borrowed memory) */
} nstf_gguf;

/* mmap and validate `path`. */
nstf_status nstf_gguf_open(const char *path, nstf_gguf **out);
/* Validate an in-memory image (borrowed: must outlive the result); `name`
 * is used in messages. Used by tests and the fuzzer. */
nstf_status nstf_gguf_open_memory(const void *data, uint64_t size, const char *name,
                                  nstf_gguf **out);
/* A view assembled by another reader (an HF model folder: io/hf_model.h),
 * for code that reads GGUF. The key/values are parsed and validated from
 * `kv_image`, a GGUF image without tensors (nstf_gguf_writer_write_memory),
 * which the view owns from this call on (freed at close, or now on
 * failure). The tensor infos are copied from `tensors`; their names and
 * data stay the caller's until `release(ctx)` (may be NULL), which close
 * calls, as does a failing call. Tensors are checked like a file's (unique
 * non-empty names, dims, type, n_elems and n_bytes consistent, data set);
 * `offset` is not used. base/size are the key/value image's. */
nstf_status nstf_gguf_open_view(void *kv_image, uint64_t size, const char *path,
                                const nstf_gguf_tensor *tensors, uint64_t n_tensors,
                                void (*release)(void *ctx), void *ctx, nstf_gguf **out);
void nstf_gguf_close(nstf_gguf *g);

const nstf_gguf_kv *nstf_gguf_find_kv(const nstf_gguf *g, const char *key);
const nstf_gguf_tensor *nstf_gguf_find_tensor(const nstf_gguf *g, const char *name);

/* Typed getters. Missing key -> NSTF_ERR_FORMAT naming the key (unless a
 * *_or default variant is used); wrong type or out of range ->
 * NSTF_ERR_FORMAT. Integer getters accept any integer type whose value
 * fits. */
nstf_status nstf_gguf_get_u32(const nstf_gguf *g, const char *key, uint32_t *out);
nstf_status nstf_gguf_get_f32(const nstf_gguf *g, const char *key, float *out);
nstf_status nstf_gguf_get_bool(const nstf_gguf *g, const char *key, bool *out);
nstf_status nstf_gguf_get_str(const nstf_gguf *g, const char *key, nstf_gguf_str *out);
uint32_t nstf_gguf_get_u32_or(const nstf_gguf *g, const char *key, uint32_t dflt);
float nstf_gguf_get_f32_or(const nstf_gguf *g, const char *key, float dflt);
bool nstf_gguf_get_bool_or(const nstf_gguf *g, const char *key, bool dflt);
/* Array of the given element type; returns the kv. */
nstf_status nstf_gguf_get_arr(const nstf_gguf *g, const char *key, nstf_gguf_vtype elem_type,
                              const nstf_gguf_kv **out);
/* Compare a gguf string with a C string. */
bool nstf_gguf_str_eq(nstf_gguf_str s, const char *c);
/* "uint32", "string", ...; "?" for an unknown id. */
const char *nstf_gguf_vtype_name(uint32_t t);

/* Human-readable dump (for `nstf inspect`): version, alignment, counts,
 * every key/value (arrays as type[count] with the first few elements;
 * long strings and arrays are shortened unless `all_kv`), a tensor table
 * (name, type, dims, bytes, offset) and the total bytes per type. */
nstf_status nstf_gguf_print(const nstf_gguf *g, FILE *f, bool all_kv);

/* ---- writer -------------------------------------------------------------- */

typedef struct nstf_gguf_writer nstf_gguf_writer;

nstf_status nstf_gguf_writer_create(nstf_gguf_writer **out);
void nstf_gguf_writer_free(nstf_gguf_writer *w);
/* Key/values are written in the order added; adding a key twice is an error. */
nstf_status nstf_gguf_writer_set_u32(nstf_gguf_writer *w, const char *key, uint32_t v);
nstf_status nstf_gguf_writer_set_i32(nstf_gguf_writer *w, const char *key, int32_t v);
nstf_status nstf_gguf_writer_set_u64(nstf_gguf_writer *w, const char *key, uint64_t v);
nstf_status nstf_gguf_writer_set_f32(nstf_gguf_writer *w, const char *key, float v);
nstf_status nstf_gguf_writer_set_bool(nstf_gguf_writer *w, const char *key, bool v);
nstf_status nstf_gguf_writer_set_str(nstf_gguf_writer *w, const char *key, const char *v);
/* Arrays of fixed-size elements (copied) and of strings (copied). */
nstf_status nstf_gguf_writer_set_arr(nstf_gguf_writer *w, const char *key, nstf_gguf_vtype elem,
                                     const void *data, uint64_t n);
nstf_status nstf_gguf_writer_set_arr_str(nstf_gguf_writer *w, const char *key,
                                         const char *const *strs, uint64_t n);
/* A key/value of a file that was read (nstf_gguf_kv), written back as it
 * was (same type, same value). */
nstf_status nstf_gguf_writer_copy_kv(nstf_gguf_writer *w, const nstf_gguf_kv *kv);
/* Tensor data is copied. ne[0] is the innermost dim. */
nstf_status nstf_gguf_writer_add_tensor(nstf_gguf_writer *w, const char *name, nstf_type type,
                                        uint32_t n_dims, const int64_t *ne, const void *data);
/* A tensor whose bytes are produced while the file is written:
 * fill(ctx, index, dst, n_bytes) writes all n_bytes into dst (a buffer the
 * size of the largest such tensor), or returns an error that stops the
 * write. Converters stream a model this way instead of holding a copy. */
typedef nstf_status (*nstf_gguf_fill_fn)(void *ctx, uint64_t index, void *dst, uint64_t n_bytes);
nstf_status nstf_gguf_writer_add_tensor_fill(nstf_gguf_writer *w, const char *name, nstf_type type,
                                             uint32_t n_dims, const int64_t *ne, nstf_gguf_fill_fn fill,
                                             void *ctx, uint64_t index);
/* Write version 3 with the given alignment (0 = default 32; otherwise a
 * power of two). general.alignment is written when it is not 32. Every
 * tensor's data is padded to the alignment, the last one included. */
nstf_status nstf_gguf_writer_write(nstf_gguf_writer *w, const char *path, uint32_t alignment);
/* The same through a temporary file beside path (path.tmp.PID), renamed
 * over path only when complete (removed on failure). */
nstf_status nstf_gguf_writer_write_replace(nstf_gguf_writer *w, const char *path, uint32_t alignment);
/* The same image in memory: free *out with nstf_free; *size is its length. */
nstf_status nstf_gguf_writer_write_memory(nstf_gguf_writer *w, uint32_t alignment, void **out,
                                          uint64_t *size);

#endif
