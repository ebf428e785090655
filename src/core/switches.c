/* switches.c — the registry of environment switches (see switches.h): the
 * table, the one read of the environment (pthread_once), parsing with its
 * warnings, atomic reads and sets. The only file of the library and the CLI
 * that calls getenv(). */
#include "core/switches.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const nstf_switch_choice gemm_choices[] = {
    {"auto", NSTF_SWITCH_AUTO}, {"mma", 0}, {"wgmma256", 256}, {"wgmma192", 192}, {"wgmma128", 128}, {"wgmma64", 64},
    {NULL, 0}};
static const nstf_switch_choice flash_choices[] = {{"auto", NSTF_SWITCH_AUTO}, {"mma", 0}, {NULL, 0}};
static const nstf_switch_choice gemv_rows_choices[] = {
    {"auto", NSTF_SWITCH_AUTO}, {"8", 8}, {"16", 16}, {"32", 32}, {NULL, 0}};
static const nstf_switch_choice cpu_isa_choices[] = {
    {"auto", NSTF_SWITCH_AUTO}, {"scalar", 0}, {"avx2", 1}, {"avx512", 2}, {NULL, 0}};

/* Every switch the library knows. The defaults are today's choices: the
 * figures in docs/PERFORMANCE.md are measured with them. */
static const nstf_switch_def g_defs[] = {
    [NSTF_SW_GEMM] = {"NSTF_GEMM", NSTF_SWITCH_ENUM, NSTF_SWITCH_AUTO, 0, 0, gemm_choices,
                      "GEMM kernel: auto (wgmma on sm_90a, tile per shape; else mma.sync), mma (the portable "
                      "kernel) or one wgmma tile width"},
    [NSTF_SW_PDL] = {"NSTF_PDL", NSTF_SWITCH_BOOL, 1, 0, 1, NULL,
                     "programmatic dependent launch in the level-3 decode (0: ordinary launches, for A/B timing)"},
    [NSTF_SW_GEMV_PRE] = {"NSTF_GEMV_PRE", NSTF_SWITCH_BOOL, 1, 0, 1, NULL,
                          "one-token GEMVs issue their first weight loads before the PDL wait (0: after)"},
    [NSTF_SW_PF_BYTES] = {"NSTF_PF_BYTES", NSTF_SWITCH_INT, NSTF_SWITCH_AUTO, 0, INT_MAX, NULL,
                          "bytes of each weight row a decode GEMV L2-prefetches under PDL (auto: whole rows of "
                          "matrices <= 8 MB, else none)"},
    [NSTF_SW_FD_EARLY] = {"NSTF_FD_EARLY", NSTF_SWITCH_BOOL, 1, 0, 1, NULL,
                          "flash decode loads its first tile's cache rows before the PDL wait (0: after)"},
    [NSTF_SW_GEMV_ROWS] = {"NSTF_GEMV_ROWS", NSTF_SWITCH_ENUM, NSTF_SWITCH_AUTO, 0, 0, gemv_rows_choices,
                           "rows per block of the fused bf16 / f16 GEMV (auto: 8; 16 from 16384 outputs "
                           "while 16 rows are at most 64 KiB) and of the one-token integer GEMV (auto: 32 "
                           "from 8192 outputs; 8 for the 32-element types with rows of 4096 or more under two "
                           "blocks of 16 per SM; else 16)"},
    [NSTF_SW_CPU_ISA] = {"NSTF_CPU_ISA", NSTF_SWITCH_ENUM, NSTF_SWITCH_AUTO, 0, 0, cpu_isa_choices,
                         "CPU matmul tiles at most this instruction set (auto: the best the CPU has, chosen by "
                         "cpuid; a higher one than the CPU has is ignored)"},
    [NSTF_SW_CKPT_STALL_MS] = {"NSTF_CKPT_STALL_MS", NSTF_SWITCH_INT, 0, 0, 600000, NULL,
                               "milliseconds a training checkpoint write sleeps mid-way through the weights (0: none; "
                               "for the tests that kill a run mid-write)"},
    [NSTF_SW_CE_ROWS] = {"NSTF_CE_ROWS", NSTF_SWITCH_INT, NSTF_SWITCH_AUTO, 8, 65535 * 32, NULL,
                         "tokens per chunk of the GPU cross-entropy, rounded down to a multiple of 8 (auto: the "
                         "most whose logits fit its 2 GiB scratch; tests force small chunks)"},
    [NSTF_SW_FLASH] = {"NSTF_FLASH", NSTF_SWITCH_ENUM, NSTF_SWITCH_AUTO, 0, 0, flash_choices,
                       "flash attention (prefill, training forward and backward): auto (wgmma + TMA on sm_90a; else "
                       "mma.sync) or mma (the portable kernels)"},
    [NSTF_SW_XDG_CACHE_HOME] = {"XDG_CACHE_HOME", NSTF_SWITCH_STR, 0, 0, 0, NULL,
                                "cache folder: the CPU roofline figures go to nstf/roofline.json in it"},
    [NSTF_SW_HOME] = {"HOME", NSTF_SWITCH_STR, 0, 0, 0, NULL,
                      "home folder: the roofline cache is ~/.cache/nstf/roofline.json without XDG_CACHE_HOME"},
    [NSTF_SW_API_KEY] = {"NSTF_API_KEY", NSTF_SWITCH_STR, 0, 0, 0, NULL,
                         "the bearer token nstf serve asks of every request (--api-key overrides)", 1},
    [NSTF_SW_NCCL_LIBRARY] = {"NSTF_NCCL_LIBRARY", NSTF_SWITCH_STR, 0, 0, 0, NULL,
                              "the NCCL (RCCL) library tensor-parallel runs load (default: libnccl.so.2 / "
                              "librccl.so.1 through the loader's path)"},
    [NSTF_SW_TP_STALL_AT] = {"NSTF_TP_STALL_AT", NSTF_SWITCH_INT, 0, 0, 1000000000, NULL,
                             "the last rank of a tensor-parallel run stops before its collective N (1-based; 0: "
                             "never; for the tests of the stall timeout)"},
    [NSTF_SW_DP_STALL_AT] = {"NSTF_DP_STALL_AT", NSTF_SWITCH_INT, 0, 0, 1000000000, NULL,
                             "the last rank of a data-parallel training run stops before its collective N "
                             "(1-based; 0: never; for the tests of the stall timeout)"},
    [NSTF_SW_MPI_LIBRARY] = {"NSTF_MPI_LIBRARY", NSTF_SWITCH_STR, 0, 0, 0, NULL,
                             "the libnstf_mpi library a process started by mpirun loads (default: libnstf_mpi.so "
                             "beside the program or libnstf, then the loader's path)"},
    [NSTF_SW_OMPI_WORLD_SIZE] = {"OMPI_COMM_WORLD_SIZE", NSTF_SWITCH_INT, 0, 0, 1 << 20, NULL,
                                 "set by Open MPI's mpirun: more than 1 makes nstf train one data-parallel rank of "
                                 "the launch (through libnstf_mpi)"},
    [NSTF_SW_PMI_SIZE] = {"PMI_SIZE", NSTF_SWITCH_INT, 0, 0, 1 << 20, NULL,
                          "set by PMI launchers (MPICH's mpiexec, srun --mpi=pmi2): as OMPI_COMM_WORLD_SIZE"},
};
_Static_assert(sizeof g_defs / sizeof g_defs[0] == NSTF_SW_COUNT, "one registry row per nstf_switch_id");

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_int g_value[NSTF_SW_COUNT];
static atomic_int g_source[NSTF_SW_COUNT];
/* String values: written once inside read_env (pthread_once orders it
 * before every reader), never after. g_str_set: whether the value is set. */
static char g_str[NSTF_SW_COUNT][NSTF_SWITCH_STR_MAX + 1];
static int g_str_set[NSTF_SW_COUNT];

static int valid_id(nstf_switch_id id) { return (int)id >= 0 && id < NSTF_SW_COUNT; }

static const char *const bool_false[] = {"0", "off", "false", "no"};
static const char *const bool_true[] = {"1", "on", "true", "yes"};

/* Parses `s` as a value of switch d; 1 and *out on success. */
static int parse_value(const nstf_switch_def *d, const char *s, int *out) {
    switch (d->kind) {
    case NSTF_SWITCH_BOOL:
        for (int i = 0; i < 4; i++) {
            if (!strcasecmp(s, bool_false[i])) { *out = 0; return 1; }
            if (!strcasecmp(s, bool_true[i])) { *out = 1; return 1; }
        }
        return 0;
    case NSTF_SWITCH_INT: {
        if (d->def < d->min && !strcasecmp(s, "auto")) { *out = d->def; return 1; }
        if (!((*s >= '0' && *s <= '9') || *s == '-')) return 0; /* no blanks, no '+' */
        char *end = NULL;
        long long v = strtoll(s, &end, 10); /* out of long long: LLONG_MIN/MAX, out of range below */
        if (end == s || *end || v < d->min || v > d->max) return 0;
        *out = (int)v;
        return 1;
    }
    case NSTF_SWITCH_ENUM:
        for (const nstf_switch_choice *c = d->choices; c && c->name; c++)
            if (!strcmp(s, c->name)) { *out = c->value; return 1; }
        return 0;
    case NSTF_SWITCH_STR: return 0;
    }
    return 0;
}

static void read_env(void) {
    for (int i = 0; i < NSTF_SW_COUNT; i++) {
        const nstf_switch_def *d = &g_defs[i];
        const char *e = getenv(d->name);
        int src = NSTF_SWITCH_FROM_DEFAULT, v = d->def;
        if (e && *e) {
            if (d->kind == NSTF_SWITCH_STR) {
                if (strlen(e) <= NSTF_SWITCH_STR_MAX) {
                    memcpy(g_str[i], e, strlen(e) + 1);
                    g_str_set[i] = 1;
                    src = NSTF_SWITCH_FROM_ENV;
                } else {
                    fprintf(stderr, "nstf: warning: ignoring %s (longer than %d bytes)\n", d->name,
                            NSTF_SWITCH_STR_MAX);
                    src = NSTF_SWITCH_FROM_BAD_ENV;
                }
            } else if (parse_value(d, e, &v)) {
                src = NSTF_SWITCH_FROM_ENV;
            } else {
                char allowed[160], def[32];
                nstf_switch_allowed_text((nstf_switch_id)i, allowed, sizeof allowed);
                nstf_switch_format((nstf_switch_id)i, d->def, def, sizeof def);
                fprintf(stderr, "nstf: warning: ignoring %s='%.64s' (accepted: %s); using the default, %s\n",
                        d->name, e, allowed, def);
                v = d->def;
                src = NSTF_SWITCH_FROM_BAD_ENV;
            }
        }
        atomic_store(&g_value[i], v);
        atomic_store(&g_source[i], src);
    }
}

static void ensure_read(void) { pthread_once(&g_once, read_env); }

const nstf_switch_def *nstf_switch_def_of(nstf_switch_id id) { return valid_id(id) ? &g_defs[id] : NULL; }

int nstf_switch_int(nstf_switch_id id) {
    if (!valid_id(id) || g_defs[id].kind == NSTF_SWITCH_STR) return 0;
    ensure_read();
    return atomic_load(&g_value[id]);
}

const char *nstf_switch_str(nstf_switch_id id) {
    if (!valid_id(id) || g_defs[id].kind != NSTF_SWITCH_STR) return NULL;
    ensure_read();
    return g_str_set[id] ? g_str[id] : NULL;
}

nstf_switch_source nstf_switch_source_of(nstf_switch_id id) {
    if (!valid_id(id)) return NSTF_SWITCH_FROM_DEFAULT;
    ensure_read();
    return (nstf_switch_source)atomic_load(&g_source[id]);
}

const char *nstf_switch_source_name(nstf_switch_source s) {
    switch (s) {
    case NSTF_SWITCH_FROM_DEFAULT: return "default";
    case NSTF_SWITCH_FROM_ENV: return "environment";
    case NSTF_SWITCH_FROM_BAD_ENV: return "default (env value invalid)";
    case NSTF_SWITCH_FROM_SET: return "set by the program";
    }
    return "?";
}

void nstf_switch_format(nstf_switch_id id, int value, char *buf, size_t cap) {
    if (!cap) return;
    buf[0] = 0;
    if (!valid_id(id)) return;
    const nstf_switch_def *d = &g_defs[id];
    switch (d->kind) {
    case NSTF_SWITCH_BOOL:
    case NSTF_SWITCH_INT:
        if (d->kind == NSTF_SWITCH_INT && value == NSTF_SWITCH_AUTO && d->def < d->min) snprintf(buf, cap, "auto");
        else snprintf(buf, cap, "%d", value);
        return;
    case NSTF_SWITCH_ENUM:
        for (const nstf_switch_choice *c = d->choices; c && c->name; c++)
            if (c->value == value) { snprintf(buf, cap, "%s", c->name); return; }
        snprintf(buf, cap, "%d", value);
        return;
    case NSTF_SWITCH_STR: {
        const char *s = nstf_switch_str(id);
        snprintf(buf, cap, "%s", !s ? "" : d->secret ? "(set)" : s);
        return;
    }
    }
}

void nstf_switch_value_text(nstf_switch_id id, char *buf, size_t cap) {
    nstf_switch_format(id, nstf_switch_int(id), buf, cap);
}

void nstf_switch_allowed_text(nstf_switch_id id, char *buf, size_t cap) {
    if (!cap) return;
    buf[0] = 0;
    if (!valid_id(id)) return;
    const nstf_switch_def *d = &g_defs[id];
    switch (d->kind) {
    case NSTF_SWITCH_BOOL: snprintf(buf, cap, "0|1 (off|on, false|true, no|yes)"); return;
    case NSTF_SWITCH_INT:
        snprintf(buf, cap, "%d..%d%s", d->min, d->max, d->def < d->min ? "|auto" : "");
        return;
    case NSTF_SWITCH_ENUM: {
        size_t n = 0;
        for (const nstf_switch_choice *c = d->choices; c && c->name && n < cap; c++) {
            int k = snprintf(buf + n, cap - n, "%s%s", n ? "|" : "", c->name);
            if (k < 0) return;
            n += (size_t)k;
        }
        return;
    }
    case NSTF_SWITCH_STR: snprintf(buf, cap, "any text"); return;
    }
}

nstf_status nstf_switch_set(nstf_switch_id id, const char *text) {
    if (!valid_id(id)) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_switch_set: no switch %d", (int)id);
    const nstf_switch_def *d = &g_defs[id];
    if (d->kind == NSTF_SWITCH_STR)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_switch_set: %s is read from the environment only", d->name);
    ensure_read(); /* the environment is read first, so it cannot overwrite this later */
    int v = d->def;
    if (text && !parse_value(d, text, &v)) {
        char allowed[160];
        nstf_switch_allowed_text(id, allowed, sizeof allowed);
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_switch_set: %s='%.64s' is not accepted (accepted: %s)",
                              d->name, text, allowed);
    }
    atomic_store(&g_value[id], v);
    atomic_store(&g_source[id], text ? NSTF_SWITCH_FROM_SET : NSTF_SWITCH_FROM_DEFAULT);
    return NSTF_OK;
}
