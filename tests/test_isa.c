/* test_isa.c — `nstf isa` on a small hand-written build folder: an AMD
 * assembly file (a kernel body, its "; Kernel info" block and amdgpu_metadata)
 * and a ptxas -v log; checks the parsed figures (JSON), that passing and
 * failing gates give exit 0 / 1 with the kernel, target and figure named, and
 * that malformed input is a clear error (exit 1 or 2), never a crash.
 * Metric: exact figures and exit codes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

#define NSTF_BIN NSTF_BUILD_DIR "/nstf"

static char g_dir[256];

static void put(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    FILE *f = fopen(p, "w");
    if (!f) {
        perror(p);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* Runs `nstf isa ARGS` with output in g_dir/out.txt; returns the exit code. */
static int isa(const char *args, char *out, size_t cap) {
    char cmd[1024], p[512];
    snprintf(p, sizeof p, "%s/out.txt", g_dir);
    snprintf(cmd, sizeof cmd, "%s isa %s > %s 2>&1", NSTF_BIN, args, p);
    int rc = system(cmd);
    rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
    FILE *f = fopen(p, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    return rc;
}

static const char *k_asm =
    "\t.amdgcn_target \"amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-\"\n"
    "\t.globl\t_Z6kernelILi64EEvPf\n"
    "_Z6kernelILi64EEvPf: ; @_Z6kernelILi64EEvPf\n"
    "; %bb.0:\n"
    "\tglobal_load_dwordx4 v[0:3], v4, s[0:1]\n"
    "\tglobal_load_dword v5, v4, s[0:1]\n"
    "\tv_mfma_f32_16x16x16bf16_1k a[0:3], v[0:1], v[2:3], a[0:3]\n"
    "\tv_mfma_f32_16x16x16bf16_1k a[0:3], v[0:1], v[2:3], a[0:3]\n"
    "\tds_read_b128 v[0:3], v6\n"
    "\tds_write_b64 v6, v[0:1]\n"
    "\ts_barrier\n"
    "\tscratch_store_dword off, v1, s0\n"
    "\ts_endpgm\n"
    "\t.amdhsa_kernel _Z6kernelILi64EEvPf\n"
    "\t\t.amdhsa_group_segment_fixed_size 0\n"
    "\t.end_amdhsa_kernel\n"
    ".Lfunc_end0:\n"
    "; Kernel info:\n"
    "; NumSgprs: 20\n"
    "; NumVgprs: 100\n"
    "; NumAgprs: 8\n"
    "; ScratchSize: 16\n"
    "; LDSByteSize: 0 bytes/workgroup (compile time only)\n"
    "; Occupancy: 4\n"
    "\t.amdgpu_metadata\n"
    "---\n"
    "amdhsa.kernels:\n"
    "  - .agpr_count:     8\n"
    "    .args:\n"
    "      - .address_space:  global\n"
    "        .offset:         0\n"
    "    .max_flat_workgroup_size: 256\n"
    "    .symbol:         _Z6kernelILi64EEvPf.kd\n"
    "    .vgpr_count:     108\n"
    "    .vgpr_spill_count: 4\n"
    "    .wavefront_size: 64\n"
    "amdhsa.target:   amdgcn-amd-amdhsa--gfx942\n"
    "...\n"
    "\t.end_amdgpu_metadata\n";

static const char *k_ptxas =
    "ptxas info    : Compiling entry function '_Z6kernelILi64EEvPf' for 'sm_90a'\n"
    "ptxas info    : Function properties for _Z6kernelILi64EEvPf\n"
    "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 364 bytes cmem[0]\n";

static const char *k_ptx = ".visible .entry _Z6kernelILi64EEvPf(\n"
                           "\t.param .u64 p\n"
                           ")\n"
                           "{\n"
                           "\tld.global.nc.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1];\n"
                           "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f1};\n"
                           "\tbar.sync 0;\n"
                           "\tret;\n"
                           "}\n";

int main(void) {
    static char out[1 << 16];
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_isa_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char p[512];
    snprintf(p, sizeof p, "%s/gfx942", g_dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/sm_90a", g_dir);
    mkdir(p, 0755);
    put("gfx942/k.s", k_asm);
    put("sm_90a/k.ptxas.txt", k_ptxas);
    put("sm_90a/k.ptx", k_ptx);

    char args[1024];
    snprintf(args, sizeof args, "--dir %s --json", g_dir);
    int rc = isa(args, out, sizeof out);
    CHECK(rc == 0, "isa --json exit %d: %s", rc, out);
    const char *want[] = {"\"kernel\": \"kernel<64>\"", "\"vgpr\": 100", "\"agpr\": 8", "\"sgpr\": 20",
                          "\"scratch_bytes\": 16", "\"vgpr_spill\": 4", "\"occupancy\": 4", "\"wave\": 64",
                          "\"mfma\": 2", "\"global_load_b32\": 1", "\"global_load_b128\": 1", "\"ds_read\": 1",
                          "\"ds_write\": 1", "\"barrier\": 1", "\"scratch_ops\": 1", "\"regs\": 40",
                          "\"smem_bytes\": 256", "\"mma\": 1", "\"ldg_128\": 1", "\"counted_from\": \"ptx\""};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(out, want[i]) != NULL, "JSON lacks %s:\n%s", want[i], out);

    /* gates: matrix + occupancy pass, scratch fails */
    put("g_ok.tsv", "# comment\nkernel<*>\tgfx942\tyes\t16\t2\t16384\t-\tok\nkernel<*>\tsm_90a\tyes\t0\t-\t-\t-\tok\n");
    snprintf(args, sizeof args, "--dir %s --check %s/g_ok.tsv", g_dir, g_dir);
    rc = isa(args, out, sizeof out);
    CHECK(rc == 0, "passing gates exit %d: %s", rc, out);
    put("g_bad.tsv", "kernel<*>\tgfx942\tyes\t0\t8\t-\t-\tstrict\n");
    snprintf(args, sizeof args, "--dir %s --check %s/g_bad.tsv", g_dir, g_dir);
    rc = isa(args, out, sizeof out);
    CHECK(rc == 1, "failing gates exit %d: %s", rc, out);
    CHECK(strstr(out, "kernel<64> on gfx942: scratch 16 bytes") != NULL, "scratch failure not named: %s", out);
    CHECK(strstr(out, "occupancy 4 waves/SIMD < floor 8") != NULL, "occupancy failure not named: %s", out);
    /* LDS over 64 KiB cannot launch; a row for a missing target is stale */
    put("g_lds.tsv", "kernel<*>\tgfx942\t-\t-\t-\t70000\t-\ttoo big\nkernel<*>\tgfx1100\t-\t0\t-\t-\t-\tnone\n");
    snprintf(args, sizeof args, "--dir %s --check %s/g_lds.tsv", g_dir, g_dir);
    rc = isa(args, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "cannot launch") && strstr(out, "matches no kernel"), "LDS/stale gates: %d %s",
          rc, out);

    /* malformed input: clear errors, no crash */
    put("g_mal.tsv", "kernel<*>\tgfx942\tmaybe\n");
    snprintf(args, sizeof args, "--dir %s --check %s/g_mal.tsv", g_dir, g_dir);
    rc = isa(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "g_mal.tsv:1"), "malformed gates: %d %s", rc, out);
    put("gfx942/bad.s", "\t.amdgpu_metadata\n  - .vgpr_count: lots\n");
    snprintf(args, sizeof args, "--dir %s", g_dir);
    rc = isa(args, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "bad.s:2") && strstr(out, "not a number"), "malformed asm: %d %s", rc, out);
    put("gfx942/bad.s", "\t.amdgpu_metadata\n  - .vgpr_count: 3\n"); /* truncated */
    rc = isa(args, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "not closed"), "truncated asm: %d %s", rc, out);
    snprintf(args, sizeof args, "--dir %s/nonexistent", g_dir);
    rc = isa(args, out, sizeof out);
    CHECK(rc == 1 && strstr(out, "cannot open folder"), "missing dir: %d %s", rc, out);

    snprintf(args, sizeof args, "rm -rf '%s'", g_dir);
    if (system(args) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_isa");
}
