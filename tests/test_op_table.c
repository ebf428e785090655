/* test_op_table.c — the op table (src/ops/ops.h) is true: every row has
 * each of its pieces, and each piece is where the row says.
 *
 * For every row:
 *  - its name, description and entry names are set, names are unique;
 *  - the reference (nstf_ref_*) is defined in a reference file of
 *    src/ops/cpu/ (ref.c, backward_ref.c, optim_ref.c: *ref.c) and the CPU
 *    entry (nstf_cpu_*) in src/ops/cpu/; the CPU backend's table has the
 *    op, and the GPU backend's table too when this build has one;
 *  - the GPU launcher is declared in src/ops/gpu/gpu_api.h, defined in a
 *    .cu file of src/ops/gpu/, and called by the GPU backend
 *    (src/backend/gpu_ops.c) — checked in every build, so a CPU-only CI
 *    catches a row whose GPU entry went missing;
 *  - the cost model has a case: nstf_op_cost_of gives finite FLOPs >= 0
 *    and bytes > 0 for a small instance of the op;
 *  - the op-comparison test has its case: tests/test_backend_ops.c (or
 *    backend_ops_grad.h, its gradient mode, or backend_ops_sparse.h, the
 *    sparse attention's case, which it includes) defines
 *    case_<op> (the X-macro there also makes it a compile error).
 * Sources are read under NSTF_SOURCE_DIR. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>

#include "backend/backend.h"
#include "ops/optim.h"
#include "test_util.h"

/* The whole file, NUL-terminated (NULL when unreadable). */
static char *slurp(const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", NSTF_SOURCE_DIR, rel);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* name followed (after spaces / a newline) by "(": a declaration, a
 * definition or a call. */
static bool has_call(const char *text, const char *name) {
    size_t n = strlen(name);
    for (const char *p = text; p && (p = strstr(p, name)); p += n) {
        const char prev = p == text ? ' ' : p[-1];
        if (prev == '_' || (prev >= 'a' && prev <= 'z') || (prev >= '0' && prev <= '9')) continue;
        const char *q = p + n;
        while (*q == ' ' || *q == '\n') q++;
        if (*q == '(') return true;
    }
    return false;
}

/* A definition: on a line that starts at column 0 (a call sits inside a
 * function, indented), "name(" whose parameter list is followed by "{"
 * before any ";" (a prototype ends in ";"). */
static bool has_definition(const char *text, const char *name) {
    size_t n = strlen(name);
    for (const char *p = text; p && (p = strstr(p, name)); p += n) {
        const char *ls = p;
        while (ls > text && ls[-1] != '\n') ls--;
        if (*ls == ' ' || *ls == '\t' || *ls == '/' || *ls == '*' || *ls == '#') continue;
        if (p[n] != '(' || (p > text && (p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z')))) continue;
        const char *brace = strchr(p + n, '{'), *semi = strchr(p + n, ';');
        if (brace && (!semi || brace < semi)) return true;
    }
    return false;
}

/* Whether any file of dir with the suffix defines name. */
static bool defined_in_dir(const char *dir, const char *suffix, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", NSTF_SOURCE_DIR, dir);
    DIR *d = opendir(path);
    if (!d) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));) {
        size_t ln = strlen(e->d_name), ls = strlen(suffix);
        if (ln < ls || strcmp(e->d_name + ln - ls, suffix) != 0) continue;
        char rel[1024];
        snprintf(rel, sizeof rel, "%s/%s", dir, e->d_name);
        char *t = slurp(rel);
        found = t && has_definition(t, name);
        free(t);
    }
    closedir(d);
    return found;
}

/* A small instance of each op, for the cost model. */
static nstf_op_args instance(nstf_op op, const nstf_matrix *w) {
    static float f[64];
    static int32_t ids[4];
    nstf_op_args a = {.op = op, .label = nstf_op_name(op), .layer = 0};
    const nstf_view v = {f, NSTF_TYPE_F32, 32};
    switch (op) {
    case NSTF_OP_GET_ROWS: a.get_rows.table = w, a.get_rows.ids = ids, a.get_rows.out = v, a.get_rows.n = 2; break;
    case NSTF_OP_RMSNORM: a.rmsnorm.x = f, a.rmsnorm.w = f, a.rmsnorm.y = v, a.rmsnorm.n = 2, a.rmsnorm.dim = 32; break;
    case NSTF_OP_ADD: a.add.x = f, a.add.y = f, a.add.n = 64; break;
    case NSTF_OP_MATMUL:
        a.matmul.w[0] = w, a.matmul.n_w = 1, a.matmul.x = v, a.matmul.out[0] = v, a.matmul.n = 2;
        break;
    case NSTF_OP_ROPE: a.rope.q = a.rope.k = v, a.rope.n = 2, a.rope.r = (nstf_rope_args){ids, 1, 1, 32, 1e4f, 0, NULL}; break;
    case NSTF_OP_ATTENTION:
        a.attention.q = a.attention.k = a.attention.v = a.attention.out = v;
        a.attention.n = 2, a.attention.n_ctx = 8, a.attention.pos0 = 3;
        a.attention.n_heads = a.attention.n_kv_heads = 1, a.attention.head_dim = 32, a.attention.scale = 0.2f;
        break;
    case NSTF_OP_SWIGLU: a.swiglu.gate = a.swiglu.up = a.swiglu.y = v, a.swiglu.n = 2, a.swiglu.n_ff = 32; break;
    case NSTF_OP_ARGMAX: a.argmax.x = v, a.argmax.out = ids, a.argmax.n_rows = 2, a.argmax.n = 32; break;
    case NSTF_OP_BIAS: a.bias.x = v, a.bias.b = f, a.bias.n = 2, a.bias.width = 32; break;
    case NSTF_OP_HEAD_NORM:
        a.head_norm.q = a.head_norm.k = v, a.head_norm.wq = a.head_norm.wk = f, a.head_norm.n = 2;
        a.head_norm.n_heads = a.head_norm.n_kv_heads = 1, a.head_norm.head_dim = 32, a.head_norm.eps = 1e-6f;
        break;
    case NSTF_OP_GET_ROWS_BWD:
        a.get_rows_bwd.ids = ids, a.get_rows_bwd.dout = v, a.get_rows_bwd.dtable = f, a.get_rows_bwd.n = 2;
        a.get_rows_bwd.dim = 32;
        break;
    case NSTF_OP_RMSNORM_BWD:
        a.rmsnorm_bwd.x = a.rmsnorm_bwd.w = a.rmsnorm_bwd.dy = f, a.rmsnorm_bwd.dx = a.rmsnorm_bwd.dw = f;
        a.rmsnorm_bwd.n = 2, a.rmsnorm_bwd.dim = 32;
        break;
    case NSTF_OP_ROPE_BWD:
        a.rope_bwd.q = a.rope_bwd.k = v, a.rope_bwd.n = 2, a.rope_bwd.r = (nstf_rope_args){ids, 1, 1, 32, 1e4f, 0, NULL};
        break;
    case NSTF_OP_ATTENTION_BWD:
        a.attention_bwd.q = a.attention_bwd.k = a.attention_bwd.v = a.attention_bwd.out = a.attention_bwd.dout = v;
        a.attention_bwd.dq = a.attention_bwd.dk = a.attention_bwd.dv = v, a.attention_bwd.lse = f;
        a.attention_bwd.n = 2, a.attention_bwd.pos0 = 3, a.attention_bwd.n_heads = a.attention_bwd.n_kv_heads = 1;
        a.attention_bwd.head_dim = 32, a.attention_bwd.scale = 0.2f;
        break;
    case NSTF_OP_SWIGLU_BWD:
        a.swiglu_bwd.gate = a.swiglu_bwd.up = a.swiglu_bwd.dy = a.swiglu_bwd.dgate = a.swiglu_bwd.dup = v;
        a.swiglu_bwd.n = 2, a.swiglu_bwd.n_ff = 32;
        break;
    case NSTF_OP_MATMUL_BWD_X:
        a.matmul_bwd_x.w = w, a.matmul_bwd_x.dy = a.matmul_bwd_x.dx = v, a.matmul_bwd_x.n = 2;
        break;
    case NSTF_OP_MATMUL_BWD_W:
        a.matmul_bwd_w.x = a.matmul_bwd_w.dy = v, a.matmul_bwd_w.dw = f, a.matmul_bwd_w.n = 2;
        a.matmul_bwd_w.n_in = a.matmul_bwd_w.n_out = 32;
        break;
    case NSTF_OP_CROSS_ENTROPY:
        a.cross_entropy.h = v, a.cross_entropy.w = w, a.cross_entropy.targets = ids, a.cross_entropy.dh = f;
        a.cross_entropy.dw = f, a.cross_entropy.n = 2, a.cross_entropy.n_norm = 2;
        break;
    case NSTF_OP_ADAMW:
    case NSTF_OP_GRAD_NORM: {
        static const nstf_param_tensor t[2] = {{"a", 0, 32, true}, {"b", 32, 32, false}};
        if (op == NSTF_OP_ADAMW) a.adamw.tensors = t, a.adamw.n_tensors = 2, a.adamw.w = a.adamw.m = a.adamw.v = f;
        else a.grad_norm.tensors = t, a.grad_norm.n_tensors = 2, a.grad_norm.grad = f;
        break;
    }
    case NSTF_OP_MATMUL_LR:
        a.matmul_lr.a = a.matmul_lr.b = w, a.matmul_lr.x = a.matmul_lr.tmp = a.matmul_lr.out = v, a.matmul_lr.n = 2;
        break;
    case NSTF_OP_ATTN_SPARSE:
        a.attn_sparse.q = a.attn_sparse.k = a.attn_sparse.v = a.attn_sparse.out = v;
        a.attn_sparse.n = 1, a.attn_sparse.n_ctx = 64, a.attn_sparse.pos0 = 40;
        a.attn_sparse.n_heads = a.attn_sparse.n_kv_heads = 1, a.attn_sparse.head_dim = 32, a.attn_sparse.scale = 0.2f;
        a.attn_sparse.block = 8, a.attn_sparse.topk = 2, a.attn_sparse.window = 8;
        break;
    case NSTF_OP_N: break;
    }
    return a;
}

int main(void) {
    char *api = slurp("src/ops/gpu/gpu_api.h"), *gpu_ops = slurp("src/backend/gpu_ops.c"),
         *cases = slurp("tests/test_backend_ops.c"), *grad_cases = slurp("tests/backend_ops_grad.h"),
         *sparse_cases = slurp("tests/backend_ops_sparse.h");
    CHECK(api && gpu_ops && cases && grad_cases && sparse_cases, "cannot read the sources under %s", NSTF_SOURCE_DIR);
    if (!api || !gpu_ops || !cases || !grad_cases || !sparse_cases) return test_finish("test_op_table");
    nstf_backend *cpu = NULL;
    const nstf_cpu_params cp = {1, false, false, 0};
    CHECK(nstf_backend_cpu_create(&cp, &cpu) == NSTF_OK, "%s", nstf_last_error());
    const nstf_backend_vt *gpu = nstf_backend_gpu_table();
    static const unsigned char wdata[32 * 34];
    const nstf_matrix w = {wdata, NSTF_TYPE_Q8_0, 32, 32, NULL};
    printf("%-10s %-20s %-26s %-26s %s\n", "op", "reference", "cpu", "gpu", "pieces");
    for (int i = 0; i < NSTF_OP_N; i++) {
        const nstf_op op = (nstf_op)i;
        const char *name = nstf_op_name(op), *rn = nstf_op_ref_name(op), *cn = nstf_op_cpu_name(op),
                   *gn = nstf_op_gpu_name(op);
        const int before = g_fails;
        CHECK(name[0] && nstf_op_desc(op)[0] && rn[0] && cn[0] && gn[0], "row %d: empty field", i);
        for (int j = 0; j < i; j++) CHECK(strcmp(name, nstf_op_name((nstf_op)j)) != 0, "name %s twice", name);
        CHECK(defined_in_dir("src/ops/cpu", "ref.c", rn), "%s: reference %s is not defined in src/ops/cpu/*ref.c",
              name, rn);
        CHECK(defined_in_dir("src/ops/cpu", ".c", cn), "%s: CPU entry %s is not defined in src/ops/cpu/", name, cn);
        CHECK(cpu && cpu->vt->ops[op], "%s: the CPU backend's table lacks it", name);
        CHECK(has_call(api, gn), "%s: GPU launcher %s is not declared in gpu_api.h", name, gn);
        CHECK(defined_in_dir("src/ops/gpu", ".cu", gn), "%s: GPU launcher %s is not defined in src/ops/gpu/", name, gn);
        CHECK(has_call(gpu_ops, gn), "%s: the GPU backend (src/backend/gpu_ops.c) never calls %s", name, gn);
        if (gpu) CHECK(gpu->ops[op], "%s: the GPU backend's table lacks it", name);
        const nstf_op_args a = instance(op, &w);
        const nstf_op_cost c = nstf_op_cost_of(&a, true);
        CHECK(isfinite(c.flops) && c.flops >= 0 && isfinite(c.bytes) && c.bytes > 0,
              "%s: cost model gives %g FLOPs, %g bytes", name, c.flops, c.bytes);
        char cn_case[64];
        snprintf(cn_case, sizeof cn_case, "case_%s", name);
        CHECK(has_definition(cases, cn_case) || has_definition(grad_cases, cn_case) ||
                  has_definition(sparse_cases, cn_case),
              "%s: no %s in tests/test_backend_ops.c (or backend_ops_grad.h, backend_ops_sparse.h)", name, cn_case);
        printf("%-10s %-20s %-26s %-26s %s\n", name, rn, cn, gn, g_fails == before ? "all" : "MISSING");
    }
    nstf_backend_free(cpu);
    free(api), free(gpu_ops), free(cases), free(grad_cases), free(sparse_cases);
    return test_finish("test_op_table");
}
