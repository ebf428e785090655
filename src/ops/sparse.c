/* sparse.c — the sizes of the sparse decode attention op (ATTN_SPARSE,
 * ops.h): how many blocks a step selects, how many keys it reads and the
 * scratch it needs. Shared by every backend, the forward that allocates
 * the op's buffers, and the cost model. */
#include "ops/ops.h"

int64_t nstf_sparse_max_sel(int topk, int block, int window) {
    if (block < 1 || topk < 0 || window < 0) return 0;
    const int64_t w = window > 1 ? window : 1;
    /* the last w positions span at most ceil((w - 1) / block) + 1 blocks */
    return 1 + (int64_t)topk + (w - 1 + block - 1) / block + 1;
}

int64_t nstf_sparse_keys(int64_t p, int topk, int block, int window) {
    if (p < 0 || block < 1) return 0;
    const int64_t n_keys = p + 1, nb = (n_keys + block - 1) / block, w = window > 1 ? window : 1;
    const int64_t wb0 = (n_keys > w ? n_keys - w : 0) / block; /* first window block */
    const int64_t n_other = wb0 > 1 ? wb0 - 1 : 0;            /* blocks 1..wb0-1 */
    const int64_t k = topk < n_other ? topk : n_other;
    const int64_t full = (wb0 > 0 ? 1 : 0) + k + (nb - wb0) - 1; /* full blocks besides the last */
    return full * block + (n_keys - (nb - 1) * block);
}

int64_t nstf_sparse_work_floats(int64_t n, int n_heads, int n_kv_heads, int head_dim, int64_t n_ctx, int topk,
                                int block, int window) {
    if (block < 1) return 0;
    const int64_t nb = (n_ctx + block - 1) / block, ms = nstf_sparse_max_sel(topk, block, window);
    /* per token: the bounds and the marks of every block (GPU), the partial
     * softmax of every (query head, selected block) (GPU; the CPU keeps a
     * block max and sum per selected block and kv head in their place) */
    const int64_t per = 2 * (int64_t)n_kv_heads * nb + (int64_t)n_heads * ms * (head_dim + 2);
    return n * per;
}
