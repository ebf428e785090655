/* isa.h — the internals of `nstf isa` (tools/isa/), the machine-code report
 * of the GPU backend: the per-kernel record every parser fills, the kernel
 * set, the text helpers the parsers share, and the entry points of each
 * part:
 *   text.c        strict numbers, bounded copies, the line reader
 *   kernels.c     the kernel set and the kernel-name demangler
 *   parse_amd.c   AMD device assembly (and its amdgpu_metadata YAML)
 *   parse_cuda.c  ptxas -v logs, SASS, PTX
 *   load.c        the build folder: which parser reads which file
 *   report.c      the tables: markdown and JSON
 *   gates.c       the gate check (--check GATES.tsv)
 *   cmd_isa.c     the command: options, then load, sort, report or check
 * Messages go to stderr as "nstf isa: ...", with file:line where the input
 * is at fault. */
#ifndef NSTF_TOOLS_ISA_H
#define NSTF_TOOLS_ISA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

int cmd_isa(int argc, char **argv);

#define ISA_NAME_MAX 512     /* longest kernel symbol kept */
#define ISA_MAX_KERNELS 20000 /* per report: far above any real build */
#define ISA_UNK (-1L)        /* a figure the input did not give */

typedef struct isa_kernel {
    char target[24];          /* gfx90a, gfx942, gfx1100, sm_90a */
    char file[64];            /* source stem: gemm, flash_attn, ... */
    char name[ISA_NAME_MAX];  /* mangled symbol */
    char pretty[ISA_NAME_MAX]; /* gemm_bf16_kernel<128,128,64,32> */
    bool amd, is_kernel;
    /* AMD: resources */
    long vgpr, agpr, sgpr, lds, scratch, occupancy, wave, max_wg, vgpr_spill, sgpr_spill, code_bytes;
    /* CUDA: resources (ptxas -v) */
    long regs, stack, spill_st, spill_ld, smem;
    /* instruction mix */
    long n_inst;
    long mfma, wmma;              /* AMD matrix instructions */
    long gld[5];                  /* global/flat/buffer loads by width: <=32, 64, 96, 128, other */
    long gst, ds_rd, ds_wr, barrier, scratch_ops;
    long mma, hgmma, ldg128, ldg_other, lds_ops; /* CUDA: HMMA (or mma.sync), HGMMA (wgmma), LDG.128, other LDG, LDS/LDSM */
    long ldgsts;                  /* CUDA: LDGSTS (cp.async) in SASS, cp.async in PTX */
    const char *counted_from;     /* "asm", "sass", "ptx", or NULL when no body was seen */
} isa_kernel;

typedef struct isa_set {
    isa_kernel *k;
    size_t n, cap;
} isa_set;

/* ---- text helpers (text.c) ---- */

bool isa_copy_str(char *dst, size_t cap, const char *src, size_t len);
/* Strict non-negative decimal (or 0x hex) number that ends the token. */
bool isa_parse_num(const char *s, long *out);
const char *isa_skip_ws(const char *s);
bool isa_starts(const char *s, const char *prefix);

/* A text file read line by line, the line number kept for messages. */
typedef struct isa_reader {
    FILE *f;
    char *line;
    size_t cap;
    long ln;
} isa_reader;

/* Opens path; says "cannot open <what><path>" on failure. */
bool isa_reader_open(isa_reader *r, const char *path, const char *what);
/* The next line (ending newline kept; the buffer is reused), or NULL at the end. */
char *isa_reader_next(isa_reader *r);
void isa_reader_close(isa_reader *r);

/* ---- the kernel set (kernels.c) ---- */

void isa_kernel_reset(isa_kernel *k);
isa_kernel *isa_find(isa_set *s, const char *target, const char *name);
/* The record of (target, name), created when new. NULL (with a message) on
 * a name too long or too many kernels. */
isa_kernel *isa_get(isa_set *s, const char *target, const char *file, const char *name, size_t name_len,
                    bool amd, const char *where, long line);

/* ---- parsers: one file each, false (with a message) on malformed input ---- */

bool isa_parse_amd_asm(isa_set *s, const char *path, const char *dir_target, const char *stem);
bool isa_parse_ptxas(isa_set *s, const char *path, const char *target, const char *stem);
bool isa_parse_sass(isa_set *s, const char *path, const char *target, const char *stem);
bool isa_parse_ptx(isa_set *s, const char *path, const char *target, const char *stem);
/* Reads every <target>/ folder under dir (load.c); keeps kernels only. */
bool isa_load(isa_set *s, const char *dir);

/* ---- output (report.c) and gates (gates.c) ---- */

/* qsort order of the report: AMD targets first (by number), then CUDA; file; name. */
int isa_cmp_kernel(const void *a, const void *b);
void isa_print_md(FILE *o, const isa_set *s, char **match, int n_match, char **tgt, int n_tgt);
void isa_print_json(FILE *o, const isa_set *s, char **match, int n_match, char **tgt, int n_tgt);
/* Checks the gates of the TSV at path; 0: all pass, 1: a gate failed, 2: bad gate file. */
int isa_run_gates(const isa_set *s, const char *path, bool verbose);

#endif
