/* cost.h — owns the bytes-moved and FLOP model of every op class `llmi profile`
 * reports, one formula per op for every backend: a backend says only how it stores
 * things (weight bytes, activation and KV element sizes).  Bytes are what an op must
 * move at least once: weights as stored, activations in and out, and the KV cache up to
 * each token's position; FLOPs count multiply-adds as two. */
#ifndef LLMI_COST_H
#define LLMI_COST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"

typedef struct llmi_op_cost {
    double bytes, flops;
} llmi_op_cost;

/* n rows of an embedding of row_bytes each, written as out_elem-byte values. */
llmi_op_cost cost_embed(int n, int dim, double row_bytes, size_t out_elem);
/* RMSNorm of (n, dim) fp32 rows; add_residual: x += delta first (delta read, x written). */
llmi_op_cost cost_rmsnorm(int n, int dim, bool add_residual, size_t out_elem);
/* y (n, rows) fp32 = x (n, cols) @ W^T, W stored in weight_bytes, x read as in_elem-byte values. */
llmi_op_cost cost_matmul(int64_t rows, int64_t cols, double weight_bytes, int n, size_t in_elem);
/* RoPE on q (n, q_dim) and k (n, kv_dim) in fp32, then K and V written to the cache;
 * kv_elem: bytes per cached value (fractional for q8). */
llmi_op_cost cost_rope_kv(int n, int q_dim, int kv_dim, double kv_elem);
/* Attention over ctx_sum cached positions in all (sum over tokens of position + 1). */
llmi_op_cost cost_attention(double ctx_sum, int n, int q_dim, int kv_dim, double kv_elem, size_t out_elem);
/* silu(gate) * up over (n, ffn) fp32, written as out_elem-byte values. */
llmi_op_cost cost_swiglu(int n, int ffn, size_t out_elem);

/* Adds one op's time and cost to class c. */
void op_stats_add(llmi_op_stats *s, llmi_op_class c, double seconds, llmi_op_cost cost);

#endif
