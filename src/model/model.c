/* model.c — what every loader shares behind model.h: choosing the loader for a path,
 * checking a config (config_validate), binding each weight with its dtype and shape
 * checked against the config (undoing the GGUF Q/K row permutation), and model_free.
 * The formats live in model_gguf.c, model_hf.c and model_dummy.c. */
#include "model/model_internal.h"
#include "core/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf.h"
#include "tok/tokenizer.h"

/* ================================================================ config_validate */

float config_attn_scale(const llmi_config *c) {
    return c->attn_scale > 0 ? c->attn_scale : 1.0f / sqrtf((float)c->head_dim);
}

double config_yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * log(scale) + 1.0; }

void config_yarn_context(llmi_config *c) {
    double ext = (double)c->rope_orig_max_pos * c->rope_factor;
    if (ext > CFG_MAX_CTX) ext = CFG_MAX_CTX;
    if (ext > c->max_ctx) c->max_ctx = (int)ext;
}

int config_validate(const llmi_config *c, const char *what, llmi_status *st) {
#define BAD(...) return llmi_fail(st, LLMI_E_RUNTIME, __VA_ARGS__)
    if (c->n_layers < 1 || c->n_layers > LLMI_MAX_LAYERS)
        BAD("%s: n_layers %d is outside [1, %d]", what, c->n_layers, LLMI_MAX_LAYERS);
    if (c->dim < 1 || c->dim > CFG_MAX_DIM) BAD("%s: hidden size %d is outside [1, %d]", what, c->dim, CFG_MAX_DIM);
    if (c->ffn_dim < 1 || c->ffn_dim > CFG_MAX_DIM)
        BAD("%s: ffn size %d is outside [1, %d]", what, c->ffn_dim, CFG_MAX_DIM);
    if (c->n_vocab < 1 || c->n_vocab > CFG_MAX_VOCAB)
        BAD("%s: vocab size %d is outside [1, %d]", what, c->n_vocab, CFG_MAX_VOCAB);
    if (c->n_heads < 1 || c->n_heads > CFG_MAX_HEADS)
        BAD("%s: n_heads %d is outside [1, %d]", what, c->n_heads, CFG_MAX_HEADS);
    if (c->n_kv_heads < 1 || c->n_kv_heads > c->n_heads)
        BAD("%s: n_kv_heads %d is outside [1, n_heads=%d]", what, c->n_kv_heads, c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        BAD("%s: n_heads %d is not a multiple of n_kv_heads %d", what, c->n_heads, c->n_kv_heads);
    if (c->head_dim < 2 || c->head_dim > 4096 || c->head_dim % 2 != 0)
        BAD("%s: head_dim %d must be even and in [2, 4096]", what, c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > CFG_MAX_DIM)
        BAD("%s: n_heads*head_dim %lld exceeds %d", what, (long long)c->n_heads * c->head_dim, CFG_MAX_DIM);
    if (c->rope_dim < 2 || c->rope_dim > c->head_dim || c->rope_dim % 2 != 0)
        BAD("%s: rope dimension %d must be even and in [2, head_dim %d]", what, c->rope_dim, c->head_dim);
    if (c->rope_dim != c->head_dim && c->arch != LLMI_ARCH_PHI3)   /* Phi-4-mini's partial RoPE is phi3's */
        BAD("%s: rope dimension %d differs from head_dim %d (a partial RoPE is supported for phi3 only)", what,
            c->rope_dim, c->head_dim);
    if (c->max_ctx < 1 || c->max_ctx > CFG_MAX_CTX)
        BAD("%s: context length %d is outside [1, %d]", what, c->max_ctx, CFG_MAX_CTX);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps) || c->norm_eps >= 1)
        BAD("%s: rms norm epsilon %g must be finite and in (0, 1)", what, (double)c->norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        BAD("%s: rope theta %g must be finite and > 0", what, (double)c->rope_theta);
    if (!(c->rope_theta_local >= 0) || !isfinite(c->rope_theta_local))
        BAD("%s: local rope theta %g must be finite and >= 0", what, (double)c->rope_theta_local);
    if (c->sliding_window < 0 || c->sliding_window > CFG_MAX_CTX)
        BAD("%s: sliding window %d is outside [0, %d]", what, c->sliding_window, CFG_MAX_CTX);
    if (!(c->embed_scale >= 0) || !isfinite(c->embed_scale) || !(c->attn_scale >= 0) || !isfinite(c->attn_scale))
        BAD("%s: embedding scale %g and attention scale %g must be finite and >= 0", what, (double)c->embed_scale,
            (double)c->attn_scale);
    /* 0 is none; a cap below 1e-3 would put the scores and logits at +-cap, a model nobody trained */
    if (!(c->attn_softcap == 0 || (c->attn_softcap >= 1e-3f && c->attn_softcap <= 1e6f)) ||
        !(c->final_softcap == 0 || (c->final_softcap >= 1e-3f && c->final_softcap <= 1e6f)))
        BAD("%s: attention soft cap %g and final logit soft cap %g must be 0 (none) or in [0.001, 1e6]", what,
            (double)c->attn_softcap, (double)c->final_softcap);
    /* 0 is 1; outside the bounds the stream or the logits would overflow or vanish */
    if (!(c->residual_scale == 0 || (c->residual_scale >= 1e-6f && c->residual_scale <= 1e6f)) ||
        !(c->logit_scale == 0 || (c->logit_scale >= 1e-3f && c->logit_scale <= 1e6f)))
        BAD("%s: residual scale %g must be 0 (none) or in [1e-6, 1e6] and logit scale %g 0 (none) or in [0.001, 1e6]",
            what, (double)c->residual_scale, (double)c->logit_scale);
    if (c->n_experts < 0 || c->n_experts > CFG_MAX_EXPERTS)
        BAD("%s: %d experts is outside [0, %d]", what, c->n_experts, CFG_MAX_EXPERTS);
    if (c->n_experts > 0 && (c->n_experts_used < 1 || c->n_experts_used > c->n_experts))
        BAD("%s: %d experts per token is outside [1, %d experts]", what, c->n_experts_used, c->n_experts);
    if ((int64_t)config_experts(c) * c->ffn_dim > CFG_MAX_DIM * 64 || (int64_t)config_experts(c) * c->dim > CFG_MAX_DIM * 64)
        BAD("%s: %d experts of %d x %d are more than llmi holds", what, c->n_experts, c->ffn_dim, c->dim);
    switch (c->rope_scaling) {
    case LLMI_ROPE_SCALING_NONE: break;
    case LLMI_ROPE_SCALING_LINEAR:
        if (!(c->rope_factor > 0) || !isfinite(c->rope_factor))
            BAD("%s: rope scaling factor %g must be finite and > 0", what, (double)c->rope_factor);
        break;
    case LLMI_ROPE_SCALING_LLAMA3:
        if (!(c->rope_factor > 0) || !isfinite(c->rope_factor))
            BAD("%s: rope scaling factor %g must be finite and > 0", what, (double)c->rope_factor);
        if (!(c->rope_low_freq_factor > 0) || !isfinite(c->rope_high_freq_factor) ||
            !(c->rope_high_freq_factor > c->rope_low_freq_factor))
            BAD("%s: llama3 rope scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g)", what,
                (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor);
        if (c->rope_orig_max_pos < 1 || c->rope_orig_max_pos > CFG_MAX_CTX)
            BAD("%s: llama3 rope scaling original_max_position_embeddings %d is outside [1, %d]", what,
                c->rope_orig_max_pos, CFG_MAX_CTX);
        break;
    case LLMI_ROPE_SCALING_LONGROPE:
        if (c->rope_dim / 2 > LLMI_ROPE_MAX_FACTORS)
            BAD("%s: longrope with %d rotated dims: at most %d factors are held", what, c->rope_dim,
                LLMI_ROPE_MAX_FACTORS);
        for (int i = 0; i < c->rope_dim / 2; i++)
            if (!(c->rope_short[i] > 0) || !(c->rope_long[i] > 0) || !isfinite(c->rope_short[i]) ||
                !isfinite(c->rope_long[i]))
                BAD("%s: longrope factor %d (short %g, long %g) must be finite and > 0", what, i,
                    (double)c->rope_short[i], (double)c->rope_long[i]);
        if (c->rope_orig_max_pos < 1 || c->rope_orig_max_pos > CFG_MAX_CTX)
            BAD("%s: longrope original_max_position_embeddings %d is outside [1, %d]", what, c->rope_orig_max_pos,
                CFG_MAX_CTX);
        if (!(c->rope_attn_factor > 0) || !(c->rope_attn_factor <= 100))
            BAD("%s: longrope attention factor %g is outside (0, 100]", what, (double)c->rope_attn_factor);
        if (c->rope_theta_local > 0)
            BAD("%s: longrope with a second RoPE for the sliding layers is not supported", what);
        break;
    case LLMI_ROPE_SCALING_YARN:
        if (!(c->rope_factor > 0) || !isfinite(c->rope_factor) || c->rope_factor > 1e6)
            BAD("%s: yarn rope scaling factor %g must be in (0, 1e6]", what, (double)c->rope_factor);
        if (c->rope_orig_max_pos < 1 || c->rope_orig_max_pos > CFG_MAX_CTX)
            BAD("%s: yarn rope scaling original_max_position_embeddings %d is outside [1, %d]", what,
                c->rope_orig_max_pos, CFG_MAX_CTX);
        if (!(c->rope_yarn_beta_fast > 0) || !(c->rope_yarn_beta_slow > 0) || !isfinite(c->rope_yarn_beta_fast) ||
            !isfinite(c->rope_yarn_beta_slow))
            BAD("%s: yarn beta_fast %g and beta_slow %g must be finite and > 0", what, (double)c->rope_yarn_beta_fast,
                (double)c->rope_yarn_beta_slow);
        if (!(c->rope_attn_factor > 0) || !(c->rope_attn_factor <= 100))
            BAD("%s: yarn attention factor %g is outside (0, 100]", what, (double)c->rope_attn_factor);
        if (c->rope_theta_local > 0)
            BAD("%s: yarn rope scaling with a second RoPE for the sliding layers (Gemma 3) is not supported", what);
        break;
    default: BAD("%s: unknown rope scaling type %d", what, (int)c->rope_scaling);
    }
    return 0;
#undef BAD
}

int model_override_rope(llmi_model *m, const llmi_rope_override *o, llmi_status *st) {
    llmi_config c = m->cfg;
    const bool file_yarn = c.rope_scaling == LLMI_ROPE_SCALING_YARN;
    const bool scales = o->scaling >= 0 || o->factor > 0 || o->orig_ctx > 0 || o->beta_fast > 0 || o->beta_slow > 0;
    if (scales && c.rope_scaling == LLMI_ROPE_SCALING_LLAMA3)
        return llmi_fail(st, LLMI_E_USAGE, "--rope-scaling/--rope-scale: the model has llama3 rope scaling, which they "
                         "would replace; not supported");
    if (scales && c.rope_theta_local > 0)
        return llmi_fail(st, LLMI_E_USAGE, "--rope-scaling/--rope-scale: not supported for a model with a second RoPE "
                         "for its sliding layers (Gemma 3)");
    if (o->freq_base > 0) c.rope_theta = o->freq_base;
    int type = o->scaling >= 0 ? o->scaling : file_yarn ? LLMI_ROPE_SCALING_YARN : LLMI_ROPE_SCALING_LINEAR;
    if ((o->orig_ctx > 0 || o->beta_fast > 0 || o->beta_slow > 0) && type != LLMI_ROPE_SCALING_YARN)
        return llmi_fail(st, LLMI_E_USAGE, "--yarn-orig-ctx/--yarn-beta-fast/--yarn-beta-slow: only with yarn scaling "
                         "(--rope-scaling yarn, or a model that has it)");
    if (scales && c.rope_scaling == LLMI_ROPE_SCALING_LONGROPE)
        return llmi_fail(st, LLMI_E_USAGE, "--rope-scaling/--rope-scale: the model has longrope scaling (Phi-3), which "
                         "they would replace; not supported");
    /* the factor: the flag's, else the file's */
    const float f = o->factor > 0 ? o->factor : c.rope_scaling == LLMI_ROPE_SCALING_NONE ? 1 : c.rope_factor;
    if (scales && type == LLMI_ROPE_SCALING_NONE) {
        c.rope_scaling = LLMI_ROPE_SCALING_NONE;
        c.rope_factor = 0;
        c.rope_attn_factor = 0;
    } else if (scales && type == LLMI_ROPE_SCALING_LINEAR) {
        if (c.rope_scaling == LLMI_ROPE_SCALING_NONE && f > 1)   /* positions f times further, as llama.cpp's -c allows */
            c.max_ctx = (int)fmin((double)c.max_ctx * f, CFG_MAX_CTX);
        c.rope_scaling = f != 1 ? LLMI_ROPE_SCALING_LINEAR : LLMI_ROPE_SCALING_NONE;
        c.rope_factor = f;
        c.rope_attn_factor = 0;
    } else if (scales) {
        if (!file_yarn) {
            c.rope_orig_max_pos = c.max_ctx;
            c.rope_yarn_beta_fast = 32, c.rope_yarn_beta_slow = 1;
            c.rope_yarn_no_truncate = false;
        }
        if (!file_yarn || f != c.rope_factor) c.rope_attn_factor = (float)config_yarn_mscale(f, 1);
        c.rope_scaling = LLMI_ROPE_SCALING_YARN;
        c.rope_factor = f;
        if (o->orig_ctx > 0) c.rope_orig_max_pos = o->orig_ctx;
        if (o->beta_fast > 0) c.rope_yarn_beta_fast = o->beta_fast;
        if (o->beta_slow > 0) c.rope_yarn_beta_slow = o->beta_slow;
        config_yarn_context(&c);
    }
    if (config_validate(&c, "--rope-scaling/--rope-scale/--rope-freq-base", st)) {
        st->code = LLMI_E_USAGE;   /* a flag's value, not a bad file */
        return st->code;
    }
    m->cfg = c;
    return 0;
}

void model_select_longrope(llmi_model *m, int n_ctx) {
    llmi_config *c = &m->cfg;
    if (c->rope_scaling != LLMI_ROPE_SCALING_LONGROPE) return;
    c->rope_long_active = (n_ctx > 0 ? n_ctx : c->max_ctx) > c->rope_orig_max_pos;
}

/* ================================================================ model_free */

static void tensor_release(llmi_tensor *t) {
    free(t->owned);
    memset(t, 0, sizeof *t);
}

void model_free(llmi_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            llmi_layer *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
            free(L->bo);
            free(L->q_norm);
            free(L->k_norm);
            free(L->post_attn_norm);
            free(L->post_ffn_norm);
            free(L->control);
            tensor_release(&L->wq);
            tensor_release(&L->wk);
            tensor_release(&L->wv);
            tensor_release(&L->wo);
            tensor_release(&L->w_gate);
            tensor_release(&L->w_up);
            tensor_release(&L->w_down);
            tensor_release(&L->w_router);
        }
        free(m->layers);
    }
    if (m->lm_head.owned == m->tok_embd.owned) m->lm_head.owned = NULL;
    tensor_release(&m->tok_embd);
    tensor_release(&m->lm_head);
    free(m->out_norm);
    if (m->tok) tok_free(m->tok);
    for (int i = 0; i < m->n_maps; i++)
        if (m->maps[i].addr) munmap(m->maps[i].addr, m->maps[i].len);
    memset(m, 0, sizeof *m);
}

/* ================================================================ weight binding */

/* The name of role r's tensor in layer (and expert, for the W_*_EXP roles); "" where the
 * format has none.  (A pattern with one %d ignores the expert.) */
static void weight_name(const weight_src *w, weight_role r, int layer, int expert, char *buf, size_t cap) {
    if (w->names[r]) snprintf(buf, cap, w->names[r], layer, expert);
    else buf[0] = '\0';
}

static int find_named(const weight_src *w, weight_role r, int layer, int expert, src_tensor *t, char *name,
                      size_t cap, llmi_status *st) {
    weight_name(w, r, layer, expert, name, cap);
    memset(t, 0, sizeof *t);
    return name[0] ? w->find(w, name, t, st) : 0;
}

int model_find_role(const weight_src *w, weight_role r, int layer, src_tensor *t, char *name, size_t cap,
                    llmi_status *st) {
    return find_named(w, r, layer, 0, t, name, cap, st);
}

static int shape_error(const src_tensor *t, const char *name, int64_t rows, int64_t cols, llmi_status *st) {
    char got[96] = "", want[64];
    size_t n = 0;
    for (int d = 0; d < t->n_dims && n < sizeof got - 24; d++)
        n += (size_t)snprintf(got + n, sizeof got - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (rows > 0) snprintf(want, sizeof want, "%lld, %lld", (long long)rows, (long long)cols);
    else snprintf(want, sizeof want, "%lld", (long long)cols);
    return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s has shape [%s], expected [%s]", t->file, name, got, want);
}

/* Checks a found tensor t of n_mats stacked (rows, cols) matrices (n_mats 1: a 2-d tensor)
 * and its dtype; *row_bytes the bytes of one row. */
static int check_matrix(const src_tensor *t, const char *name, int n_mats, int64_t rows, int64_t cols,
                        size_t *row_bytes, llmi_status *st) {
    if (!t->dtype_ok) return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported tensor type %s in %s", t->file, t->type_name, name);
    bool shape_ok = n_mats == 1 ? t->n_dims == 2 && t->shape[0] == rows && t->shape[1] == cols
                                : t->n_dims == 3 && t->shape[0] == n_mats && t->shape[1] == rows && t->shape[2] == cols;
    if (!shape_ok) {
        if (n_mats == 1) return shape_error(t, name, rows, cols, st);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s is not %d stacked %lldx%lld matrices", t->file, name, n_mats,
                         (long long)rows, (long long)cols);
    }
    int64_t be = dtype_block_elems(t->dtype);
    if (cols % be != 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: %lld columns are not a multiple of the %s block", t->file,
                         name, (long long)cols, dtype_name(t->dtype));
    *row_bytes = (size_t)(cols / be) * dtype_block_bytes(t->dtype);
    if ((uint64_t)n_mats * (uint64_t)rows * *row_bytes != t->n_bytes)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s holds %llu bytes, expected %llu", t->file, name,
                         (unsigned long long)t->n_bytes, (unsigned long long)((uint64_t)n_mats * rows * *row_bytes));
    return 0;
}

/* Points out at a checked tensor's (rows, cols) bytes; they stay in the mapping unless
 * misaligned for their element type, in which case they are copied so backends may load
 * them directly. */
static int view_matrix(const src_tensor *t, const char *name, int64_t rows, int64_t cols, size_t row_bytes,
                       llmi_tensor *out, size_t *bytes, llmi_status *st) {
    memset(out, 0, sizeof *out);
    out->dtype = t->dtype;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = row_bytes;
    out->data = t->data;
    if ((uintptr_t)t->data % 4 != 0) {
        out->owned = malloc(t->n_bytes ? t->n_bytes : 1);
        if (!out->owned) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory copying %s", t->file, name);
        memcpy(out->owned, t->data, t->n_bytes);
        out->data = out->owned;
    }
    *bytes += t->n_bytes;
    return 0;
}

/* Binds a (rows, cols) matrix. */
static int bind_matrix(const weight_src *w, weight_role r, int layer, int64_t rows, int64_t cols, llmi_tensor *out,
                       size_t *bytes, llmi_status *st) {
    src_tensor t;
    char name[128];
    if (w->qc && r >= W_Q && r <= W_DOWN && r != W_BQ && r != W_BK && r != W_BV && r != W_BO) {
        weight_name(w, r, layer, 0, name, sizeof name);
        char *dot = strrchr(name, '.'); /* "....q_proj.weight" -> "....q_proj" */
        if (dot) *dot = '\0';
        llmi_status qst = {0};
        if (quant_load_linear(w->qc, w->find_st, (void *)w->ctx, name, rows, cols, out, &qst))
            return llmi_fail(st, qst.code, "%s: %s", w->what, qst.msg);
        *bytes += (size_t)rows * cols / 2 + (size_t)out->n_groups * rows * 3;
        return 0;
    }
    int rc = model_find_role(w, r, layer, &t, name, sizeof name, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor %s", w->what, name);
    size_t row_bytes;
    if (check_matrix(&t, name, 1, rows, cols, &row_bytes, st)) return LLMI_E_RUNTIME;
    return view_matrix(&t, name, rows, cols, row_bytes, out, bytes, st);
}

/* Binds a fused matrix of role r, parts (rows[i], cols) stacked in that order (Phi-3's
 * qkv_proj: q, k, v; gate_up_proj: gate, up), as one view per part into its rows; the
 * first part owns the bytes where they had to be copied, the others only point in. */
static int bind_fused(const weight_src *w, weight_role r, int layer, int n_parts, const int64_t *rows, int64_t cols,
                      llmi_tensor *const *parts, size_t *bytes, llmi_status *st) {
    if (w->qc)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: GPTQ/AWQ checkpoints with fused q/k/v or gate/up projections "
                         "(Phi-3) are not supported", w->what);
    int64_t total = 0;
    for (int i = 0; i < n_parts; i++) total += rows[i];
    llmi_tensor all;
    if (bind_matrix(w, r, layer, total, cols, &all, bytes, st)) return LLMI_E_RUNTIME;
    int64_t at = 0;
    for (int i = 0; i < n_parts; i++) {
        *parts[i] = all;
        parts[i]->rows = rows[i];
        parts[i]->data = (const uint8_t *)all.data + (size_t)at * all.row_bytes;
        parts[i]->owned = i == 0 ? all.owned : NULL;
        at += rows[i];
    }
    return 0;
}

/* Binds one MoE matrix of a layer's n_exp experts, (rows, cols) each, as one tensor of
 * (n_exp * rows, cols): the format's stacked tensor where it has one (a view of the
 * mapping), else its per-expert tensors copied together in expert order (their mapped
 * pages dropped after the copy, so the weights are resident once). */
static int bind_experts(const weight_src *w, weight_role stacked, weight_role one, int layer, int n_exp, int64_t rows,
                        int64_t cols, llmi_tensor *out, size_t *bytes, llmi_status *st) {
    src_tensor t;
    char name[128];
    size_t row_bytes;
    int rc = find_named(w, stacked, layer, 0, &t, name, sizeof name, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc > 0)
        return check_matrix(&t, name, n_exp, rows, cols, &row_bytes, st) ||
               view_matrix(&t, name, (int64_t)n_exp * rows, cols, row_bytes, out, bytes, st) ? LLMI_E_RUNTIME : 0;
    memset(out, 0, sizeof *out);
    for (int e = 0; e < n_exp; e++) {
        rc = find_named(w, one, layer, e, &t, name, sizeof name, st);
        if (rc < 0) return LLMI_E_RUNTIME;
        if (rc == 0) {
            if (e == 0 && w->names[stacked]) weight_name(w, stacked, layer, 0, name, sizeof name);
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor %s", w->what, name);
        }
        if (check_matrix(&t, name, 1, rows, cols, &row_bytes, st)) return LLMI_E_RUNTIME;
        if (e == 0) {
            out->dtype = t.dtype;
            out->rows = (int64_t)n_exp * rows;
            out->cols = cols;
            out->row_bytes = row_bytes;
            out->owned = malloc((size_t)n_exp * t.n_bytes);
            if (!out->owned) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory copying %s", t.file, name);
            out->data = out->owned;
        } else if (t.dtype != out->dtype) {
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s is %s, expert 0's is %s", t.file, name, t.type_name,
                             dtype_name(out->dtype));
        }
        memcpy((uint8_t *)out->owned + (size_t)e * t.n_bytes, t.data, t.n_bytes);
        mapfile_drop_pages(t.data, t.n_bytes);
        *bytes += t.n_bytes;
    }
    return 0;
}

/* GraniteMoe's experts' gate and up (W_GATE_UP_EXPS: n_exp stacked (2 ffn, dim) matrices, gate
 * rows first) copied apart into the (n_exp * ffn, dim) stacks the MoE paths read, as
 * bind_experts lays them out; the mapped pages dropped after. */
static int bind_experts_gate_up(const weight_src *w, int layer, int n_exp, int64_t ffn, int64_t dim, llmi_tensor *gate,
                                llmi_tensor *up, size_t *bytes, llmi_status *st) {
    src_tensor t;
    char name[128];
    size_t row_bytes;
    int rc = find_named(w, W_GATE_UP_EXPS, layer, 0, &t, name, sizeof name, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor %s", w->what, name);
    if (check_matrix(&t, name, n_exp, 2 * ffn, dim, &row_bytes, st)) return LLMI_E_RUNTIME;
    const size_t half = (size_t)ffn * row_bytes;   /* one expert's gate (or up) rows */
    llmi_tensor *const parts[2] = {gate, up};
    for (int i = 0; i < 2; i++) {
        memset(parts[i], 0, sizeof *parts[i]);
        parts[i]->dtype = t.dtype;
        parts[i]->rows = (int64_t)n_exp * ffn;
        parts[i]->cols = dim;
        parts[i]->row_bytes = row_bytes;
        parts[i]->owned = malloc((size_t)n_exp * half);
        if (!parts[i]->owned) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory copying %s", t.file, name);
        parts[i]->data = parts[i]->owned;
        for (int e = 0; e < n_exp; e++)
            memcpy((uint8_t *)parts[i]->owned + (size_t)e * half, t.data + (2 * (size_t)e + (size_t)i) * half, half);
    }
    mapfile_drop_pages(t.data, t.n_bytes);
    *bytes += t.n_bytes;
    return 0;
}

/* Binds a vector (norm weight or bias) as an owned f32 array, from any float dtype. */
static int bind_vector(const weight_src *w, weight_role r, int layer, int64_t n, float **out, size_t *bytes,
                       llmi_status *st) {
    src_tensor t;
    char name[128];
    int rc = model_find_role(w, r, layer, &t, name, sizeof name, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor %s", w->what, name);
    if (!t.dtype_ok || (t.dtype != LLMI_F32 && t.dtype != LLMI_F16 && t.dtype != LLMI_BF16))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported tensor type %s in %s (vectors must be F32, F16 or BF16)",
                         t.file, t.type_name, name);
    if (t.n_dims != 1 || t.shape[0] != n) return shape_error(&t, name, 0, n, st);
    size_t es = dtype_block_bytes(t.dtype);
    if (t.n_bytes != (uint64_t)n * es)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s holds %llu bytes, expected %llu", t.file, name,
                         (unsigned long long)t.n_bytes, (unsigned long long)((uint64_t)n * es));
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory reading %s", t.file, name);
    for (int64_t i = 0; i < n; i++) {
        if (t.dtype == LLMI_F32) {
            memcpy(&v[i], t.data + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, t.data + 2 * i, 2);
            v[i] = t.dtype == LLMI_F16 ? fp16_to_f32(h) : bf16_to_f32(h);
        }
    }
    const bool is_norm = r == W_OUT_NORM || r == W_ATTN_NORM || r == W_FFN_NORM || r == W_Q_NORM || r == W_K_NORM ||
                         r == W_POST_ATTN_NORM || r == W_POST_FFN_NORM;
    for (int64_t i = 0; is_norm && w->norm_shift != 0 && i < n; i++) v[i] += w->norm_shift;   /* in fp32, as HF's 1 + w.float() */
    *out = v;
    *bytes += t.n_bytes;
    return 0;
}

/* Puts a GGUF llama Q or K matrix back into HF rotate-half row order (whole rows, so any
 * block dtype works). */
static int unpermute_matrix(llmi_tensor *t, int n_head, int head_dim, const char *what, llmi_status *st) {
    size_t total = (size_t)t->rows * t->row_bytes;
    void *dst = malloc(total ? total : 1);
    if (!dst) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory un-permuting Q/K", what);
    gguf_unpermute_rows(t->data, dst, n_head, head_dim, t->row_bytes);
    free(t->owned);
    t->owned = dst;
    t->data = dst;
    return 0;
}

static int unpermute_vector(float **v, int n_head, int head_dim, const char *what, llmi_status *st) {
    float *dst = malloc((size_t)n_head * head_dim * sizeof *dst);
    if (!dst) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory un-permuting Q/K bias", what);
    gguf_unpermute_rows(*v, dst, n_head, head_dim, sizeof(float));
    free(*v);
    *v = dst;
    return 0;
}

int model_bind_weights(const weight_src *w, llmi_model *m, bool permute_qk, llmi_status *st) {
    const llmi_config *c = &m->cfg;
    if (w->qc && c->n_experts > 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: GPTQ/AWQ checkpoints of mixture-of-experts models are not supported",
                         w->what);
    int64_t q_rows = (int64_t)c->n_heads * c->head_dim, kv_rows = (int64_t)c->n_kv_heads * c->head_dim;
    size_t bytes = 0;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", w->what);
    if (bind_matrix(w, W_EMBD, -1, c->n_vocab, c->dim, &m->tok_embd, &bytes, st)) return LLMI_E_RUNTIME;
    if (bind_vector(w, W_OUT_NORM, -1, c->dim, &m->out_norm, &bytes, st)) return LLMI_E_RUNTIME;
    if (c->tie_embeddings) {
        m->lm_head = m->tok_embd;
        m->lm_head.owned = NULL; /* the data belongs to tok_embd */
    } else if (bind_matrix(w, W_LM_HEAD, -1, c->n_vocab, c->dim, &m->lm_head, &bytes, st)) {
        return LLMI_E_RUNTIME;
    }
    for (int l = 0; l < c->n_layers; l++) {
        llmi_layer *L = &m->layers[l];
        const bool fused = c->arch == LLMI_ARCH_PHI3;
        const int64_t qkv[3] = {q_rows, kv_rows, kv_rows}, gu[2] = {c->ffn_dim, c->ffn_dim};
        llmi_tensor *const qkv_t[3] = {&L->wq, &L->wk, &L->wv}, *const gu_t[2] = {&L->w_gate, &L->w_up};
        if (bind_vector(w, W_ATTN_NORM, l, c->dim, &L->attn_norm, &bytes, st) ||
            (fused ? bind_fused(w, W_QKV, l, 3, qkv, c->dim, qkv_t, &bytes, st)
                   : bind_matrix(w, W_Q, l, q_rows, c->dim, &L->wq, &bytes, st) ||
                     bind_matrix(w, W_K, l, kv_rows, c->dim, &L->wk, &bytes, st) ||
                     bind_matrix(w, W_V, l, kv_rows, c->dim, &L->wv, &bytes, st)) ||
            bind_matrix(w, W_O, l, c->dim, q_rows, &L->wo, &bytes, st) ||
            bind_vector(w, W_FFN_NORM, l, c->dim, &L->ffn_norm, &bytes, st))
            return LLMI_E_RUNTIME;
        if (fused && (bind_fused(w, W_GATE_UP, l, 2, gu, c->dim, gu_t, &bytes, st) ||
                      bind_matrix(w, W_DOWN, l, c->dim, c->ffn_dim, &L->w_down, &bytes, st)))
            return LLMI_E_RUNTIME;
        if (!fused && c->n_experts == 0 && (bind_matrix(w, W_GATE, l, c->ffn_dim, c->dim, &L->w_gate, &bytes, st) ||
                                  bind_matrix(w, W_UP, l, c->ffn_dim, c->dim, &L->w_up, &bytes, st) ||
                                  bind_matrix(w, W_DOWN, l, c->dim, c->ffn_dim, &L->w_down, &bytes, st)))
            return LLMI_E_RUNTIME;
        if (c->n_experts > 0) {
            const int E = c->n_experts;
            if (bind_matrix(w, W_ROUTER, l, E, c->dim, &L->w_router, &bytes, st)) return LLMI_E_RUNTIME;
            if (w->names[W_GATE_UP_EXPS]) {   /* the format stores each expert's gate|up together */
                if (bind_experts_gate_up(w, l, E, c->ffn_dim, c->dim, &L->w_gate, &L->w_up, &bytes, st))
                    return LLMI_E_RUNTIME;
            } else if (bind_experts(w, W_GATE_EXPS, W_GATE_EXP, l, E, c->ffn_dim, c->dim, &L->w_gate, &bytes, st) ||
                       bind_experts(w, W_UP_EXPS, W_UP_EXP, l, E, c->ffn_dim, c->dim, &L->w_up, &bytes, st)) {
                return LLMI_E_RUNTIME;
            }
            if (bind_experts(w, W_DOWN_EXPS, W_DOWN_EXP, l, E, c->dim, c->ffn_dim, &L->w_down, &bytes, st))
                return LLMI_E_RUNTIME;
        }
        if (c->qkv_bias && (bind_vector(w, W_BQ, l, q_rows, &L->bq, &bytes, st) ||
                            bind_vector(w, W_BK, l, kv_rows, &L->bk, &bytes, st) ||
                            bind_vector(w, W_BV, l, kv_rows, &L->bv, &bytes, st)))
            return LLMI_E_RUNTIME;
        src_tensor t;
        char name[128];
        int rc = model_find_role(w, W_BO, l, &t, name, sizeof name, st);
        if (rc < 0) return LLMI_E_RUNTIME;
        if (rc > 0 && bind_vector(w, W_BO, l, c->dim, &L->bo, &bytes, st)) return LLMI_E_RUNTIME;
        if (c->qk_norm && (bind_vector(w, W_Q_NORM, l, c->head_dim, &L->q_norm, &bytes, st) ||
                           bind_vector(w, W_K_NORM, l, c->head_dim, &L->k_norm, &bytes, st)))
            return LLMI_E_RUNTIME;
        if (c->post_norms && (bind_vector(w, W_POST_ATTN_NORM, l, c->dim, &L->post_attn_norm, &bytes, st) ||
                              bind_vector(w, W_POST_FFN_NORM, l, c->dim, &L->post_ffn_norm, &bytes, st)))
            return LLMI_E_RUNTIME;
        if (permute_qk) {
            if (unpermute_matrix(&L->wq, c->n_heads, c->head_dim, w->what, st) ||
                unpermute_matrix(&L->wk, c->n_kv_heads, c->head_dim, w->what, st))
                return LLMI_E_RUNTIME;
            if (c->qkv_bias && (unpermute_vector(&L->bq, c->n_heads, c->head_dim, w->what, st) ||
                                unpermute_vector(&L->bk, c->n_kv_heads, c->head_dim, w->what, st)))
                return LLMI_E_RUNTIME;
        }
    }
    m->weight_bytes = bytes;
    return 0;
}

int model_add_map(llmi_model *m, void *addr, size_t len, const char *what, llmi_status *st) {
    if (m->n_maps >= (int)(sizeof m->maps / sizeof m->maps[0])) {
        munmap(addr, len);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: too many files to map (limit %zu)", what,
                         sizeof m->maps / sizeof m->maps[0]);
    }
    m->maps[m->n_maps++] = (llmi_mapping){addr, len, true};
    return 0;
}

bool model_weights_from_file(const llmi_model *m) {
    for (int i = 0; i < m->n_maps; i++)
        if (!m->maps[i].from_file) return false;
    return m->n_maps > 0;
}

void model_release_pages(const llmi_model *m, const void *p, size_t len) {
    const char *a = p;
    if (!a || !len) return;
    for (int i = 0; i < m->n_maps; i++) {
        const char *m0 = m->maps[i].addr;
        if (a >= m0 && a + len <= m0 + m->maps[i].len) {
            if (m->maps[i].from_file) mapfile_drop_pages(p, len);
            return;
        }
    }
}

int model_head_dim(llmi_config *c, const char *what, const char *dim_key, const char *heads_key, llmi_status *st) {
    if (c->dim % c->n_heads != 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s %d is not a multiple of %s %d", what, dim_key, c->dim, heads_key,
                         c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    return 0;
}

void model_set_name(char *dst, size_t cap, const char *path) {
    const char *end = path + strlen(path);
    while (end > path + 1 && end[-1] == '/') end--;
    const char *b = end;
    while (b > path && b[-1] != '/') b--;
    snprintf(dst, cap, "%.*s", (int)(end - b), b);
}

int model_tok_check(const llmi_model *m, int rc, const llmi_status *tst, const char *what, llmi_status *st) {
    if (rc) {
        /* tokenizer errors come from another module; the message must name our file */
        if (strstr(tst->msg, what)) return llmi_fail(st, LLMI_E_RUNTIME, "%s", tst->msg);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s", what, tst->msg[0] ? tst->msg : "tokenizer failed");
    }
    if (tok_n_vocab(m->tok) > m->cfg.n_vocab)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tokenizer has %d tokens but the embedding only %d rows", what,
                         tok_n_vocab(m->tok), m->cfg.n_vocab);
    return 0;
}

/* ================================================================ dispatch */

int model_load(const char *path, const llmi_load_opts *opts, llmi_model *m, llmi_status *st) {
    memset(m, 0, sizeof *m);
    struct stat sb;
    if (stat(path, &sb) != 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return model_load_hf(path, opts, m, st);
    if (!S_ISREG(sb.st_mode)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: not a regular file or directory", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot open: %s", path, strerror(errno));
    char magic[4] = {0};
    ssize_t n = read(fd, magic, 4);
    close(fd);
    if (n == 4 && memcmp(magic, "GGUF", 4) == 0) return model_load_gguf(path, opts, m, st);
    size_t len = strlen(path);
    if (len >= 12 && strcmp(path + len - 12, ".safetensors") == 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: pass the directory holding config.json and the safetensors, not the file",
                         path);
    return llmi_fail(st, LLMI_E_RUNTIME, "%s: not a GGUF file (no GGUF magic) and not a model directory", path);
}
