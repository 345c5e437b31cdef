/* backend.c — what all backends share beyond the interface (see backend.h). */
#include "backend/backend.h"

#include <math.h>
#include <string.h>

const char *op_class_name(llmi_op_class c) {
    static const char *const names[LLMI_OP_COUNT] = {
        "embed", "norm", "qkv", "rope_kv", "attn", "o_proj",
        "mlp_up", "act", "mlp_down", "lm_head", "sample", "host",
    };
    return (c >= 0 && c < LLMI_OP_COUNT) ? names[c] : "unknown";
}

static int check_weight(const char *who, const llmi_tensor *t, int64_t rows, int64_t cols, const char *what, int l,
                        llmi_status *st) {
    if (t->rows != rows || t->cols != cols)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: layer %d %s is %lldx%lld, expected %lldx%lld", who, l, what,
                         (long long)t->rows, (long long)t->cols, (long long)rows, (long long)cols);
    if (t->dtype < 0 || t->dtype >= LLMI_DTYPE_COUNT)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: layer %d %s has an unknown dtype %d", who, l, what,
                         (int)t->dtype);
    if (!t->data || cols % dtype_block_elems(t->dtype) ||
        t->row_bytes != (size_t)(cols / dtype_block_elems(t->dtype)) * dtype_block_bytes(t->dtype))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: layer %d %s has an inconsistent row size", who, l, what);
    return 0;
}

int backend_check_model(const llmi_model *m, const char *who, llmi_status *st) {
    const llmi_config *c = &m->cfg;
    if (c->dim <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0 ||
        c->ffn_dim <= 0 || c->n_vocab <= 0 || c->n_heads % c->n_kv_heads)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: inconsistent model dimensions", who);
    int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    if (check_weight(who, &m->tok_embd, c->n_vocab, dim, "token_embd", -1, st) ||
        check_weight(who, &m->lm_head, c->n_vocab, dim, "lm_head", -1, st))
        return st->code;
    if (!m->out_norm || !m->layers)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: model lacks output norm or layers", who);
    for (int l = 0; l < c->n_layers; l++) {
        const llmi_layer *L = &m->layers[l];
        if (check_weight(who, &L->wq, qd, dim, "q_proj", l, st) || check_weight(who, &L->wk, kvd, dim, "k_proj", l, st) ||
            check_weight(who, &L->wv, kvd, dim, "v_proj", l, st) || check_weight(who, &L->wo, dim, qd, "o_proj", l, st) ||
            check_weight(who, &L->w_gate, (int64_t)config_experts(c) * c->ffn_dim, dim, "gate_proj", l, st) ||
            check_weight(who, &L->w_up, (int64_t)config_experts(c) * c->ffn_dim, dim, "up_proj", l, st) ||
            check_weight(who, &L->w_down, (int64_t)config_experts(c) * dim, c->ffn_dim, "down_proj", l, st) ||
            (c->n_experts > 0 && check_weight(who, &L->w_router, c->n_experts, dim, "router", l, st)))
            return st->code;
        if (c->n_experts > 0 && (L->w_gate.dtype == LLMI_I4G || L->w_up.dtype == LLMI_I4G || L->w_down.dtype == LLMI_I4G))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: int4 (GPTQ/AWQ) experts are not supported", who);
        if (!L->attn_norm || !L->ffn_norm)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s backend: layer %d lacks a norm", who, l);
    }
    return 0;
}

int backend_check_kv_dtype(const llmi_config *c, llmi_kv_dtype t, const char *who, llmi_status *st) {
    if ((int)t < 0 || t >= LLMI_KV_DTYPE_COUNT)
        return llmi_fail(st, LLMI_E_USAGE, "%s backend: unknown KV dtype %d", who, (int)t);
    if (t == LLMI_KV_Q8 && c->head_dim % KV_Q8_BLOCK)
        return llmi_fail(st, LLMI_E_USAGE, "--kv-type q8: head_dim %d is not a multiple of %d (use f16, bf16 or fp8)",
                         c->head_dim, KV_Q8_BLOCK);
    return 0;
}

size_t backend_kv_block_bytes(const llmi_config *c, int block_size, llmi_kv_dtype t) {
    return 2 * (size_t)c->n_layers * (size_t)block_size * kv_dtype_row_bytes(t, (size_t)c->n_kv_heads * c->head_dim);
}

/* Mirrors transformers' _compute_default_rope_parameters, _compute_llama3_parameters and
 * _compute_yarn_parameters (modeling_rope_utils.py); computed in double, rounded once to
 * fp32.  (YaRN's attention factor is config_attn_scale's.) */
static void rope_inv_freq(const llmi_config *c, double theta, bool scaled, float *inv_freq) {
    int rd = c->rope_dim > 0 ? c->rope_dim : c->head_dim;
    int half = c->head_dim / 2;
    const bool yarn = scaled && c->rope_scaling == LLMI_ROPE_SCALING_YARN;
    double yarn_lo = 0, yarn_hi = 1;
    if (yarn) {
        /* find_correction_range: the dimensions whose wavelengths make beta_fast and beta_slow
         * turns over the original context; interpolated below lo's frequency, extrapolated above */
        const double orig = c->rope_orig_max_pos;
        yarn_lo = rd * log(orig / (c->rope_yarn_beta_fast * 2 * M_PI)) / (2 * log(theta));
        yarn_hi = rd * log(orig / (c->rope_yarn_beta_slow * 2 * M_PI)) / (2 * log(theta));
        if (!c->rope_yarn_no_truncate) yarn_lo = floor(yarn_lo), yarn_hi = ceil(yarn_hi);
        if (yarn_lo < 0) yarn_lo = 0;
        if (yarn_hi > rd - 1) yarn_hi = rd - 1;
        if (yarn_lo == yarn_hi) yarn_hi += 0.001;
    }
    for (int i = 0; i < half; i++) {
        if (2 * i >= rd) {   /* past a partial RoPE's pairs: never read (the rotation stops at rope_dim) */
            inv_freq[i] = 0;
            continue;
        }
        double f = pow(theta, -(double)(2 * i) / (double)rd);
        if (scaled && c->rope_scaling == LLMI_ROPE_SCALING_LONGROPE) {
            f /= c->rope_long_active ? c->rope_long[i] : c->rope_short[i];
        } else if (scaled && c->rope_scaling == LLMI_ROPE_SCALING_LINEAR && c->rope_factor > 0) {
            f /= c->rope_factor;
        } else if (yarn) {
            double ramp = ((double)i - yarn_lo) / (yarn_hi - yarn_lo);
            double extrapolated = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
            f = f / c->rope_factor * (1.0 - extrapolated) + f * extrapolated;
        } else if (scaled && c->rope_scaling == LLMI_ROPE_SCALING_LLAMA3) {
            double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
            double old = c->rope_orig_max_pos;
            double lo_wavelen = old / lo, hi_wavelen = old / hi;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > lo_wavelen) {
                f = f / factor;
            } else if (!(wavelen < hi_wavelen)) {
                double smooth = (old / wavelen - lo) / (hi - lo);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

void backend_rope_inv_freq(const llmi_config *c, float *inv_freq) { rope_inv_freq(c, c->rope_theta, true, inv_freq); }

/* Gemma 3's sliding layers: transformers' "sliding_attention" rope parameters, default type. */
void backend_rope_inv_freq_local(const llmi_config *c, float *inv_freq) {
    rope_inv_freq(c, c->rope_theta_local, false, inv_freq);
}

int backend_moe_group(const int32_t *sel, int n, int k, int n_experts, int32_t *start, int32_t *tok, int32_t *row,
                      llmi_status *st) {
    const size_t nk = (size_t)n * k;
    /* start[e + 1] counts expert e's rows, then start[e] becomes its first; the fill advances
     * each start to the next expert's, which the shift undoes */
    memset(start, 0, ((size_t)n_experts + 1) * sizeof *start);
    for (size_t i = 0; i < nk; i++) {
        if (sel[i] < 0 || sel[i] >= n_experts)
            return llmi_fail(st, LLMI_E_RUNTIME, "moe: the router chose expert %d of %d", sel[i], n_experts);
        start[sel[i] + 1]++;
    }
    for (int e = 0; e < n_experts; e++) {
        if (start[e + 1] > n)
            return llmi_fail(st, LLMI_E_RUNTIME, "moe: expert %d routed %d times in %d tokens", e, start[e + 1], n);
        start[e + 1] += start[e];
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const int32_t at = start[sel[(size_t)t * k + j]]++;
            tok[at] = t;
            row[(size_t)t * k + j] = at;
        }
    for (int e = n_experts; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
    return 0;
}
