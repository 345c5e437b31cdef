/* cost.c — the per-op cost model (see cost.h). */
#include "backend/cost.h"

llmi_op_cost cost_embed(int n, int dim, double row_bytes, size_t out_elem) {
    return (llmi_op_cost){.bytes = (double)n * row_bytes + (double)n * dim * (double)out_elem, .flops = 0};
}

llmi_op_cost cost_rmsnorm(int n, int dim, bool add_residual, size_t out_elem) {
    double per_row = 4.0 * dim + (double)out_elem * dim + (add_residual ? 8.0 * dim : 0.0);
    return (llmi_op_cost){.bytes = n * per_row + 4.0 * dim, .flops = (add_residual ? 5.0 : 4.0) * n * dim};
}

llmi_op_cost cost_matmul(int64_t rows, int64_t cols, double weight_bytes, int n, size_t in_elem) {
    return (llmi_op_cost){.bytes = weight_bytes + (double)n * (double)cols * (double)in_elem + 4.0 * n * (double)rows,
                          .flops = 2.0 * n * (double)rows * (double)cols};
}

llmi_op_cost cost_rope_kv(int n, int q_dim, int kv_dim, double kv_elem) {
    double per_tok = 8.0 * (q_dim + kv_dim) + 4.0 * kv_dim + 2.0 * kv_dim * kv_elem;
    return (llmi_op_cost){.bytes = n * per_tok, .flops = 3.0 * n * (q_dim + kv_dim)};
}

llmi_op_cost cost_attention(double ctx_sum, int n, int q_dim, int kv_dim, double kv_elem, size_t out_elem) {
    return (llmi_op_cost){.bytes = ctx_sum * 2.0 * kv_dim * kv_elem + 4.0 * n * q_dim +
                                   (double)out_elem * n * q_dim,
                          .flops = ctx_sum * 4.0 * q_dim};
}

llmi_op_cost cost_swiglu(int n, int ffn, size_t out_elem) {
    return (llmi_op_cost){.bytes = (double)n * ffn * (8.0 + (double)out_elem), .flops = 6.0 * n * ffn};
}

void op_stats_add(llmi_op_stats *s, llmi_op_class c, double seconds, llmi_op_cost cost) {
    s->seconds[c] += seconds;
    s->bytes[c] += cost.bytes;
    s->flops[c] += cost.flops;
    s->calls[c]++;
}
