/* switches.h — the registry of environment switches: every environment
 * variable the library reads, in one table with its kind, default, allowed
 * values and a one-line description. Two sorts live here: the kernel-variant
 * switches for measurement (NSTF_GEMM, NSTF_PDL, ...; their defaults are what
 * the figures in docs/PERFORMANCE.md use) and the plain reads of the
 * environment (HOME, XDG_CACHE_HOME for the roofline cache, NSTF_API_KEY
 * for the server).
 *
 * Rules:
 *  - The environment is read once per process, on the first use of any
 *    switch (pthread_once), so every thread and every call sees the same
 *    values, and each value is parsed and checked in one place. Changing the
 *    environment afterwards has no effect; a program that compares variants
 *    in one process (tests, benchmarks) calls nstf_switch_set().
 *  - Reads and sets are atomic: any thread may read while another sets.
 *  - An empty value counts as unset. A value that does not parse
 *    (NSTF_GEMM=foo, NSTF_PF_BYTES=-3, NSTF_PDL=maybe) is ignored with one
 *    warning line on stderr, on the first read, naming the variable, what it
 *    accepts and the default used instead; the library goes on with the
 *    default (a measurement switch is no reason to refuse work).
 *  - Kinds: bool accepts 0/1, off/on, false/true, no/yes (any case); int a
 *    decimal integer in [min, max], or "auto" where the default is auto;
 *    enum one of its names (exact case); string any text up to
 *    NSTF_SWITCH_STR_MAX bytes.
 *  - getenv() is called nowhere else in src/ or tools/ (tests/test_hygiene.sh
 *    checks); `nstf devices --verbose` lists every switch with its value.
 *
 * C and C++ (the .cu files call the accessors). */
#ifndef NSTF_CORE_SWITCHES_H
#define NSTF_CORE_SWITCHES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/status.h" /* inside: status.h declares without extern "C" of its own */

/* The value of "auto" in int and enum switches: the library chooses. */
#define NSTF_SWITCH_AUTO (-1)
/* Longest string value kept (bytes, without the terminating zero). */
#define NSTF_SWITCH_STR_MAX 4095

typedef enum {
    NSTF_SW_GEMM,           /* enum: AUTO, 0 = "mma" (the portable kernel), 256/128/64 a wgmma tile width */
    NSTF_SW_PDL,            /* bool: 1 programmatic dependent launch allowed in the L3 decode */
    NSTF_SW_GEMV_PRE,       /* bool: 1 early weight loads in the one-token GEMVs */
    NSTF_SW_PF_BYTES,       /* int: AUTO, or bytes of each weight row to L2-prefetch under PDL */
    NSTF_SW_FD_EARLY,       /* bool: 1 flash decode loads its first cache tile before the PDL wait */
    NSTF_SW_GEMV_ROWS,      /* enum: AUTO, 8, 16 or 32 rows per block of the fused bf16 GEMV and the one-token integer GEMV */
    NSTF_SW_CPU_ISA,        /* enum: AUTO, 0 scalar, 1 avx2, 2 avx512: a cap on the CPU matmul tiles */
    NSTF_SW_CKPT_STALL_MS,  /* int: ms a checkpoint write sleeps mid-way (fault-injection tests) */
    NSTF_SW_CE_ROWS,        /* int: AUTO, or tokens per chunk of the GPU cross-entropy (rounded down to 8) */
    NSTF_SW_FLASH,          /* enum: AUTO, 0 = "mma" (the portable flash attention kernels, forward and backward) */
    NSTF_SW_XDG_CACHE_HOME, /* string: cache folder (roofline cache) */
    NSTF_SW_HOME,           /* string: home folder (roofline cache without XDG_CACHE_HOME) */
    NSTF_SW_API_KEY,        /* string, secret: the bearer token `nstf serve` asks for (--api-key wins) */
    NSTF_SW_NCCL_LIBRARY,   /* string: the NCCL (RCCL) library file tensor-parallel runs load */
    NSTF_SW_TP_STALL_AT,    /* int: the last tensor-parallel rank stalls before its collective N (fault tests) */
    NSTF_SW_DP_STALL_AT,    /* int: the last data-parallel training rank stalls before its collective N (fault tests) */
    NSTF_SW_MPI_LIBRARY,    /* string: the libnstf_mpi file a process launched by mpirun loads */
    NSTF_SW_OMPI_WORLD_SIZE, /* int: set by Open MPI's mpirun: the processes of the launch */
    NSTF_SW_PMI_SIZE,       /* int: set by PMI launchers (MPICH's hydra, srun --mpi=pmi2): the processes of the launch */
    NSTF_SW_COUNT
} nstf_switch_id;

typedef enum { NSTF_SWITCH_BOOL, NSTF_SWITCH_INT, NSTF_SWITCH_ENUM, NSTF_SWITCH_STR } nstf_switch_kind;

/* Where the current value came from. */
typedef enum {
    NSTF_SWITCH_FROM_DEFAULT,
    NSTF_SWITCH_FROM_ENV,
    NSTF_SWITCH_FROM_BAD_ENV, /* the default: the environment's value did not parse (warned) */
    NSTF_SWITCH_FROM_SET      /* nstf_switch_set() */
} nstf_switch_source;

typedef struct {
    const char *name; /* as written in the environment */
    int value;        /* what nstf_switch_int() returns for it */
} nstf_switch_choice;

/* One row of the registry. */
typedef struct {
    const char *name;                  /* the environment variable */
    nstf_switch_kind kind;
    int def;                           /* default value (bool 0/1, int, enum: a choice's value; string: unused) */
    int min, max;                      /* int: accepted range ("auto" is also accepted when def < min) */
    const nstf_switch_choice *choices; /* enum: the names, ended by a NULL name */
    const char *desc;                  /* one line: what it changes */
    int secret;                        /* string: its value is never shown ("(set)" in listings) */
} nstf_switch_def;

/* The registry row of `id` (NULL for an id out of range). */
const nstf_switch_def *nstf_switch_def_of(nstf_switch_id id);

/* The current value of a bool, int or enum switch (the default for an id
 * out of range or a string switch: 0). */
int nstf_switch_int(nstf_switch_id id);

/* The current value of a string switch, or NULL when unset (or empty). */
const char *nstf_switch_str(nstf_switch_id id);

nstf_switch_source nstf_switch_source_of(nstf_switch_id id);
const char *nstf_switch_source_name(nstf_switch_source s); /* "default", "environment", ... */

/* `value` of switch `id` as text ("auto", "mma", "1", "4096"); the current
 * value of a string switch ("" when unset; "(set)" for a secret one). Writes at most cap bytes. */
void nstf_switch_format(nstf_switch_id id, int value, char *buf, size_t cap);
/* The current value as text. */
void nstf_switch_value_text(nstf_switch_id id, char *buf, size_t cap);
/* What the switch accepts, as text ("auto|mma|wgmma256", "0..2147483647|auto",
 * "0|1 (off|on, false|true, no|yes)", "any text"). */
void nstf_switch_allowed_text(nstf_switch_id id, char *buf, size_t cap);

/* Sets a bool, int or enum switch from text, as the environment would
 * (NULL: back to the default), for every thread from now on. For programs
 * that compare variants in one process (tests, benchmarks). Returns
 * NSTF_ERR_INVALID_ARG with a message for a value that does not parse, and
 * NSTF_ERR_UNSUPPORTED for a string switch (read-only). */
nstf_status nstf_switch_set(nstf_switch_id id, const char *text);

#ifdef __cplusplus
}
#endif

#endif
