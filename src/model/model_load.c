/* model_load.c — the GGUF and Hugging Face loaders behind model.h: they read the
 * hyper-parameters, bind every weight (checking its dtype and shape against the config),
 * undo the GGUF Q/K row permutation, and build the tokenizer last.  Everything read from
 * a file is untrusted (FORMATS.md); errors name the file and what is wrong. */
#include "model/gptq_awq.h"
#include "model/model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fileio.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "tok/tokenizer.h"

#define CFG_MAX_DIM     (1 << 20)
#define CFG_MAX_VOCAB   (1 << 24)
#define CFG_MAX_HEADS   4096
#define CFG_MAX_CTX     (1 << 24)
#define TOK_MAX_TOKENS  (1u << 24)
#define TOK_MAX_MERGES  (1u << 24)
#define HF_MAX_JSON     (64u << 20)   /* config.json / index.json larger than this are not real */

/* ================================================================ config_validate */

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
    if (c->rope_dim != c->head_dim)
        BAD("%s: rope dimension %d differs from head_dim %d (partial rotary is not supported)", what, c->rope_dim,
            c->head_dim);
    if (c->max_ctx < 1 || c->max_ctx > CFG_MAX_CTX)
        BAD("%s: context length %d is outside [1, %d]", what, c->max_ctx, CFG_MAX_CTX);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps) || c->norm_eps >= 1)
        BAD("%s: rms norm epsilon %g must be finite and in (0, 1)", what, (double)c->norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        BAD("%s: rope theta %g must be finite and > 0", what, (double)c->rope_theta);
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
    default: BAD("%s: unknown rope scaling type %d", what, (int)c->rope_scaling);
    }
    return 0;
#undef BAD
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
            tensor_release(&L->wq);
            tensor_release(&L->wk);
            tensor_release(&L->wv);
            tensor_release(&L->wo);
            tensor_release(&L->w_gate);
            tensor_release(&L->w_up);
            tensor_release(&L->w_down);
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

/* Every weight the model reads, named per format by the tables below. */
typedef enum {
    W_EMBD, W_OUT_NORM, W_LM_HEAD, W_ATTN_NORM, W_Q, W_K, W_V, W_O, W_BQ, W_BK, W_BV, W_BO,
    W_FFN_NORM, W_GATE, W_UP, W_DOWN, W_COUNT
} weight_role;

static const char *const gguf_names[W_COUNT] = {
    "token_embd.weight", "output_norm.weight", "output.weight", "blk.%d.attn_norm.weight",
    "blk.%d.attn_q.weight", "blk.%d.attn_k.weight", "blk.%d.attn_v.weight", "blk.%d.attn_output.weight",
    "blk.%d.attn_q.bias", "blk.%d.attn_k.bias", "blk.%d.attn_v.bias", "blk.%d.attn_output.bias",
    "blk.%d.ffn_norm.weight", "blk.%d.ffn_gate.weight", "blk.%d.ffn_up.weight", "blk.%d.ffn_down.weight",
};

static const char *const hf_names[W_COUNT] = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias", "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias", "model.layers.%d.self_attn.o_proj.bias",
    "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight",
};

/* One stored tensor as either format describes it, shape in HF order (shape[0] slowest). */
typedef struct src_tensor {
    const char *file;          /* the file holding it, for messages */
    bool dtype_ok;             /* maps to an llmi_dtype */
    llmi_dtype dtype;
    const char *type_name;     /* the format's own name for its type */
    int n_dims;
    int64_t shape[4];
    const uint8_t *data;       /* (n_bytes) inside a mapping */
    uint64_t n_bytes;
} src_tensor;

typedef struct weight_src weight_src;
struct weight_src {
    const char *const *names;  /* (W_COUNT) printf patterns with the layer as %d */
    const char *what;          /* the file or directory, for messages */
    const void *ctx;
    /* 1 found (out filled), 0 absent, < 0 error (st filled) */
    int (*find)(const weight_src *w, const char *name, src_tensor *out, llmi_status *st);
    const quant_config *qc;    /* GPTQ/AWQ checkpoint: linears are read by quant_load_linear */
    quant_find_fn find_st;     /* its raw tensor lookup (HF only) */
};

static void weight_name(const weight_src *w, weight_role r, int layer, char *buf, size_t cap) {
    snprintf(buf, cap, w->names[r], layer);
}

/* Reads the optional tensor of a role: 1 found, 0 absent, < 0 error. */
static int find_role(const weight_src *w, weight_role r, int layer, src_tensor *t, char *name, size_t cap,
                     llmi_status *st) {
    weight_name(w, r, layer, name, cap);
    memset(t, 0, sizeof *t);
    return w->find(w, name, t, st);
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

/* Binds a (rows, cols) matrix; the data stays in the mapping unless it is misaligned for
 * its element type, in which case it is copied so backends may load it directly. */
static int bind_matrix(const weight_src *w, weight_role r, int layer, int64_t rows, int64_t cols, llmi_tensor *out,
                       size_t *bytes, llmi_status *st) {
    src_tensor t;
    char name[128];
    if (w->qc && r >= W_Q && r <= W_DOWN && r != W_BQ && r != W_BK && r != W_BV && r != W_BO) {
        weight_name(w, r, layer, name, sizeof name);
        char *dot = strrchr(name, '.'); /* "....q_proj.weight" -> "....q_proj" */
        if (dot) *dot = '\0';
        llmi_status qst = {0};
        if (quant_load_linear(w->qc, w->find_st, (void *)w->ctx, name, rows, cols, out, &qst))
            return llmi_fail(st, qst.code, "%s: %s", w->what, qst.msg);
        *bytes += (size_t)rows * cols / 2 + (size_t)out->n_groups * rows * 3;
        return 0;
    }
    int rc = find_role(w, r, layer, &t, name, sizeof name, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor %s", w->what, name);
    if (!t.dtype_ok) return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported tensor type %s in %s", t.file, t.type_name, name);
    if (t.n_dims != 2 || t.shape[0] != rows || t.shape[1] != cols) return shape_error(&t, name, rows, cols, st);
    int64_t be = dtype_block_elems(t.dtype);
    if (cols % be != 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: %lld columns are not a multiple of the %s block", t.file,
                         name, (long long)cols, dtype_name(t.dtype));
    size_t row_bytes = (size_t)(cols / be) * dtype_block_bytes(t.dtype);
    if ((uint64_t)rows * row_bytes != t.n_bytes)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s holds %llu bytes, expected %llu", t.file, name,
                         (unsigned long long)t.n_bytes, (unsigned long long)((uint64_t)rows * row_bytes));
    memset(out, 0, sizeof *out);
    out->dtype = t.dtype;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = row_bytes;
    out->data = t.data;
    if ((uintptr_t)t.data % 4 != 0) {
        out->owned = malloc(t.n_bytes ? t.n_bytes : 1);
        if (!out->owned) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory copying %s", t.file, name);
        memcpy(out->owned, t.data, t.n_bytes);
        out->data = out->owned;
    }
    *bytes += t.n_bytes;
    return 0;
}

/* Binds a vector (norm weight or bias) as an owned f32 array, from any float dtype. */
static int bind_vector(const weight_src *w, weight_role r, int layer, int64_t n, float **out, size_t *bytes,
                       llmi_status *st) {
    src_tensor t;
    char name[128];
    int rc = find_role(w, r, layer, &t, name, sizeof name, st);
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

/* Binds every weight of m (cfg already validated).  permute_qk: the source is a llama-arch
 * GGUF whose Q/K rows (and biases) are in the converter's interleaved order. */
static int load_weights(const weight_src *w, llmi_model *m, bool permute_qk, llmi_status *st) {
    const llmi_config *c = &m->cfg;
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
        if (bind_vector(w, W_ATTN_NORM, l, c->dim, &L->attn_norm, &bytes, st) ||
            bind_matrix(w, W_Q, l, q_rows, c->dim, &L->wq, &bytes, st) ||
            bind_matrix(w, W_K, l, kv_rows, c->dim, &L->wk, &bytes, st) ||
            bind_matrix(w, W_V, l, kv_rows, c->dim, &L->wv, &bytes, st) ||
            bind_matrix(w, W_O, l, c->dim, q_rows, &L->wo, &bytes, st) ||
            bind_vector(w, W_FFN_NORM, l, c->dim, &L->ffn_norm, &bytes, st) ||
            bind_matrix(w, W_GATE, l, c->ffn_dim, c->dim, &L->w_gate, &bytes, st) ||
            bind_matrix(w, W_UP, l, c->ffn_dim, c->dim, &L->w_up, &bytes, st) ||
            bind_matrix(w, W_DOWN, l, c->dim, c->ffn_dim, &L->w_down, &bytes, st))
            return LLMI_E_RUNTIME;
        if (c->qkv_bias && (bind_vector(w, W_BQ, l, q_rows, &L->bq, &bytes, st) ||
                            bind_vector(w, W_BK, l, kv_rows, &L->bk, &bytes, st) ||
                            bind_vector(w, W_BV, l, kv_rows, &L->bv, &bytes, st)))
            return LLMI_E_RUNTIME;
        src_tensor t;
        char name[128];
        int rc = find_role(w, W_BO, l, &t, name, sizeof name, st);
        if (rc < 0) return LLMI_E_RUNTIME;
        if (rc > 0 && bind_vector(w, W_BO, l, c->dim, &L->bo, &bytes, st)) return LLMI_E_RUNTIME;
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

static void set_name(char *dst, size_t cap, const char *path) {
    const char *end = path + strlen(path);
    while (end > path + 1 && end[-1] == '/') end--;
    const char *b = end;
    while (b > path && b[-1] != '/') b--;
    snprintf(dst, cap, "%.*s", (int)(end - b), b);
}

/* Tokenizer errors come from another module; make sure the message names our file. */
static int tok_error(const char *what, const llmi_status *tst, llmi_status *st) {
    if (strstr(tst->msg, what)) return llmi_fail(st, LLMI_E_RUNTIME, "%s", tst->msg);
    return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s", what, tst->msg[0] ? tst->msg : "tokenizer failed");
}

/* Values read as double and stored as float must not overflow the conversion. */
static float to_f32(double d) {
    if (isnan(d)) return NAN;
    return d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : (float)d;
}

/* ================================================================ GGUF */

static int gguf_find_src(const weight_src *w, const char *name, src_tensor *out, llmi_status *st) {
    const gguf_file *g = w->ctx;
    const gguf_tensor_info *ti = gguf_find_tensor(g, name);
    if (!ti) return 0;
    out->file = g->path;
    out->type_name = gguf_type_name(ti->type);
    out->dtype_ok = true;
    switch (ti->type) {
    case GGUF_TYPE_F32: out->dtype = LLMI_F32; break;
    case GGUF_TYPE_F16: out->dtype = LLMI_F16; break;
    case GGUF_TYPE_BF16: out->dtype = LLMI_BF16; break;
    case GGUF_TYPE_Q8_0: out->dtype = LLMI_Q8_0; break;
    case GGUF_TYPE_Q4_0: out->dtype = LLMI_Q4_0; break;
    case GGUF_TYPE_Q4_1: out->dtype = LLMI_Q4_1; break;
    default: out->dtype_ok = false; break;
    }
    /* trailing unit dims carry no shape; GGUF lists dims fastest first, HF slowest first */
    int nd = (int)ti->n_dims;
    while (nd > 1 && ti->dims[nd - 1] == 1) nd--;
    out->n_dims = nd;
    for (int d = 0; d < nd; d++) out->shape[d] = ti->dims[nd - 1 - d];
    out->data = ti->data;
    out->n_bytes = ti->n_bytes;
    (void)st;
    return 1;
}

/* gguf_get_* wrappers with the architecture prefix: 1 set, 0 absent, < 0 error. */
static int arch_int(const gguf_file *g, const char *arch, const char *suffix, bool required, int64_t lo, int64_t hi,
                    int *out, llmi_status *st) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    int rc = gguf_get_int(g, key, lo, hi, &v, st);
    if (rc < 0) return rc;
    if (rc == 0) {
        if (required) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key %s", g->path, key);
            return -LLMI_E_RUNTIME;
        }
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int arch_float(const gguf_file *g, const char *arch, const char *suffix, bool required, float *out,
                      llmi_status *st) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v;
    int rc = gguf_get_float(g, key, &v, st);
    if (rc < 0) return rc;
    if (rc == 0) {
        if (required) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key %s", g->path, key);
            return -LLMI_E_RUNTIME;
        }
        return 0;
    }
    *out = to_f32(v);
    return 1;
}

/* Llama-3 GGUFs carry their rope scaling as rope_freqs.weight (per-frequency divisors)
 * instead of keys.  We recognise the llama3 pattern with the parameters every Llama 3.x
 * release uses and reject anything else rather than run with wrong positions. */
static int gguf_rope_freqs(const gguf_file *g, llmi_config *c, llmi_status *st) {
    const gguf_tensor_info *ti = gguf_find_tensor(g, "rope_freqs.weight");
    if (!ti) return 0;
    int64_t half = c->head_dim / 2;
    if (ti->type != GGUF_TYPE_F32 || ti->n_elements != half)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_freqs.weight must be %lld F32 values", g->path, (long long)half);
    float mx = 0;
    bool all_one = true;
    for (int64_t i = 0; i < half; i++) {
        float f;
        memcpy(&f, ti->data + 4 * i, 4);
        if (!(f > 0) || !isfinite(f))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_freqs.weight[%lld] = %g is not a positive factor", g->path,
                             (long long)i, (double)f);
        if (f != 1.0f) all_one = false;
        if (f > mx) mx = f;
    }
    if (all_one) return 0;
    if (c->rope_scaling != LLMI_ROPE_SCALING_NONE)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_freqs.weight together with linear rope scaling is not supported",
                         g->path);
    llmi_config t = *c;
    t.rope_scaling = LLMI_ROPE_SCALING_LLAMA3;
    t.rope_factor = mx;
    t.rope_low_freq_factor = 1.0f;
    t.rope_high_freq_factor = 4.0f;
    if (t.rope_orig_max_pos <= 0) t.rope_orig_max_pos = 8192;
    double lo_wl = t.rope_orig_max_pos / t.rope_low_freq_factor, hi_wl = t.rope_orig_max_pos / t.rope_high_freq_factor;
    for (int64_t i = 0; i < half; i++) {
        double freq = pow(t.rope_theta, -(double)(2 * i) / c->head_dim), wl = 2 * M_PI / freq, want;
        if (wl < hi_wl) want = 1;
        else if (wl > lo_wl) want = t.rope_factor;
        else {
            double smooth = (t.rope_orig_max_pos / wl - t.rope_low_freq_factor) /
                            (t.rope_high_freq_factor - t.rope_low_freq_factor);
            want = 1 / ((1 - smooth) / t.rope_factor + smooth);
        }
        float f;
        memcpy(&f, ti->data + 4 * i, 4);
        if (fabs(f - want) > 1e-3 * want)
            return llmi_fail(st, LLMI_E_RUNTIME,
                             "%s: rope_freqs.weight does not match llama3 scaling (factor %g, low 1, high 4, original "
                             "context %d); not supported", g->path, (double)t.rope_factor, t.rope_orig_max_pos);
    }
    *c = t;
    return 0;
}

static int gguf_config(const gguf_file *g, llmi_config *c, bool *has_output, llmi_status *st) {
    const char *path = g->path;
    gguf_str a;
    int rc = gguf_get_str(g, "general.architecture", &a, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key general.architecture", path);
    if (gguf_str_eq(a, "llama")) c->arch = LLMI_ARCH_LLAMA;
    else if (gguf_str_eq(a, "qwen2")) c->arch = LLMI_ARCH_QWEN2;
    else {
        char b[40];
        size_t n = 0;
        for (uint64_t i = 0; i < a.len && n < sizeof b - 1; i++)
            b[n++] = (a.p[i] >= 0x20 && a.p[i] < 0x7f) ? a.p[i] : '?';
        b[n] = '\0';
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported architecture %s (supported: llama, qwen2)", path, b);
    }
    const char *arch = c->arch == LLMI_ARCH_LLAMA ? "llama" : "qwen2";
    snprintf(c->arch_name, sizeof c->arch_name, "%s", arch);
    gguf_str nm;
    rc = gguf_get_str(g, "general.name", &nm, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc > 0) {
        size_t n = 0;
        for (uint64_t i = 0; i < nm.len && n < sizeof c->name - 1; i++)
            c->name[n++] = ((unsigned char)nm.p[i] >= 0x20 && nm.p[i] != 0x7f) ? nm.p[i] : '?';
        c->name[n] = '\0';
    } else {
        set_name(c->name, sizeof c->name, path);
    }
    const int64_t I = INT32_MAX;
    if (arch_int(g, arch, "embedding_length", true, 1, I, &c->dim, st) < 0 ||
        arch_int(g, arch, "block_count", true, 1, I, &c->n_layers, st) < 0 ||
        arch_int(g, arch, "feed_forward_length", true, 1, I, &c->ffn_dim, st) < 0 ||
        arch_int(g, arch, "attention.head_count", true, 1, I, &c->n_heads, st) < 0 ||
        arch_int(g, arch, "context_length", true, 1, I, &c->max_ctx, st) < 0 ||
        arch_float(g, arch, "attention.layer_norm_rms_epsilon", true, &c->norm_eps, st) < 0)
        return LLMI_E_RUNTIME;
    c->n_kv_heads = c->n_heads;
    if (arch_int(g, arch, "attention.head_count_kv", false, 1, I, &c->n_kv_heads, st) < 0) return LLMI_E_RUNTIME;
    if (c->n_layers > LLMI_MAX_LAYERS)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.block_count %d exceeds the limit of %d layers", path, arch,
                         c->n_layers, LLMI_MAX_LAYERS);
    rc = arch_int(g, arch, "attention.key_length", false, 1, I, &c->head_dim, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) {
        if (c->dim % c->n_heads != 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: embedding_length %d is not a multiple of head_count %d", path,
                             c->dim, c->n_heads);
        c->head_dim = c->dim / c->n_heads;
    }
    int vlen = c->head_dim;
    if (arch_int(g, arch, "attention.value_length", false, 1, I, &vlen, st) < 0) return LLMI_E_RUNTIME;
    if (vlen != c->head_dim)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s.attention.value_length %d differs from key_length %d", path, arch,
                         vlen, c->head_dim);
    c->rope_dim = c->head_dim;
    if (arch_int(g, arch, "rope.dimension_count", false, 1, I, &c->rope_dim, st) < 0) return LLMI_E_RUNTIME;
    c->rope_theta = 10000.0f;
    if (arch_float(g, arch, "rope.freq_base", false, &c->rope_theta, st) < 0) return LLMI_E_RUNTIME;

    /* rope scaling: linear is expressible; yarn/longrope are not */
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    gguf_str stype;
    rc = gguf_get_str(g, key, &stype, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (arch_int(g, arch, "rope.scaling.original_context_length", false, 1, I, &c->rope_orig_max_pos, st) < 0)
        return LLMI_E_RUNTIME;
    /* llama.cpp's reading: the type defaults to linear, which only matters with a factor */
    if (rc > 0 && !gguf_str_eq(stype, "none") && !gguf_str_eq(stype, "linear"))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope scaling type %.*s is not supported", path,
                         (int)(stype.len > 32 ? 32 : stype.len), stype.p);
    if (rc == 0 || gguf_str_eq(stype, "linear")) {
        float f = 0;
        int frc = arch_float(g, arch, "rope.scaling.factor", false, &f, st);
        if (frc == 0) frc = arch_float(g, arch, "rope.scale_linear", false, &f, st);
        if (frc < 0) return LLMI_E_RUNTIME;
        if (frc > 0 && f != 0 && f != 1) {
            c->rope_scaling = LLMI_ROPE_SCALING_LINEAR;
            c->rope_factor = f;
        }
    }

    /* vocab: the key, else the embedding's rows; checked against the tensor later */
    const gguf_tensor_info *emb = gguf_find_tensor(g, "token_embd.weight");
    rc = arch_int(g, arch, "vocab_size", false, 1, I, &c->n_vocab, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) {
        if (emb && emb->n_dims == 2 && emb->dims[1] <= INT32_MAX) c->n_vocab = (int)emb->dims[1];
        else {
            const gguf_kv *kv = gguf_find_kv(g, "tokenizer.ggml.tokens");
            if (kv && kv->type == GGUF_ARRAY && kv->n <= CFG_MAX_VOCAB) c->n_vocab = (int)kv->n;
        }
    }
    c->qkv_bias = c->arch == LLMI_ARCH_QWEN2 || gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    *has_output = gguf_find_tensor(g, "output.weight") != NULL;
    c->tie_embeddings = !*has_output;
    if (config_validate(c, path, st)) return LLMI_E_RUNTIME;
    if (gguf_rope_freqs(g, c, st)) return LLMI_E_RUNTIME;
    return config_validate(c, path, st);
}

/* Arrays gathered for tok_create; freed after the call (tok_spec borrows them). */
typedef struct gguf_tok_arrays {
    const char **tokens; uint32_t *token_lens;
    float *scores; int32_t *types;
    const char **merges; uint32_t *merge_lens;
    int32_t *eog;
    char *chat_template;
} gguf_tok_arrays;

static void gguf_tok_arrays_free(gguf_tok_arrays *a) {
    free(a->tokens); free(a->token_lens); free(a->scores); free(a->types);
    free(a->merges); free(a->merge_lens); free(a->eog); free(a->chat_template);
}

/* bos/eos must name real tokens (prompts and stopping depend on them).  The optional ids
 * (unk, pad, eot, eom) are dropped when out of range, as llama.cpp does: files in the wild
 * store "none" as -1 or as the vocabulary size. */
static int gguf_special_id(const gguf_file *g, const char *key, int n_tokens, bool strict, int *id, llmi_status *st) {
    int64_t v;
    int rc = gguf_get_int(g, key, INT64_MIN, INT64_MAX, &v, st);
    if (rc < 0) return LLMI_E_RUNTIME;
    if (rc == 0) return 0;
    if (v < 0 || v >= n_tokens) {
        if (!strict) {
            *id = -1;
            return 0;
        }
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: %s = %lld is outside the %d tokens", g->path, key, (long long)v,
                         n_tokens);
    }
    *id = (int)v;
    return 0;
}

static int gguf_tokenizer(const gguf_file *g, const llmi_config *c, tokenizer **out, llmi_status *st) {
    const char *path = g->path;
    tok_spec s;
    memset(&s, 0, sizeof s);
    gguf_tok_arrays a;
    memset(&a, 0, sizeof a);
    int ret = LLMI_E_RUNTIME;
    gguf_str model, pre = {0};
    int rc = gguf_get_str(g, "tokenizer.ggml.model", &model, st);
    if (rc < 0) goto done;
    if (rc == 0) { llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key tokenizer.ggml.model", path); goto done; }
    if (gguf_str_eq(model, "gpt2")) s.model = TOK_MODEL_BYTELEVEL_BPE;
    else if (gguf_str_eq(model, "llama")) s.model = TOK_MODEL_SPM_BPE;
    else {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported tokenizer model %.*s (supported: gpt2, llama)", path,
                  (int)(model.len > 32 ? 32 : model.len), model.p);
        goto done;
    }
    rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre, st);
    if (rc < 0) goto done;
    bool bpe = s.model == TOK_MODEL_BYTELEVEL_BPE;
    s.pre = bpe ? TOK_PRE_GPT2 : TOK_PRE_NONE;
    s.add_bos = !bpe;
    if (rc > 0 && !gguf_str_eq(pre, "default")) {
        if (gguf_str_eq(pre, "gpt-2")) s.pre = TOK_PRE_GPT2;
        else if (gguf_str_eq(pre, "smollm")) s.pre = TOK_PRE_SMOLLM;
        else if (gguf_str_eq(pre, "llama-bpe") || gguf_str_eq(pre, "llama3") || gguf_str_eq(pre, "llama-v3")) {
            s.pre = TOK_PRE_LLAMA3;
            s.add_bos = true;
        } else if (gguf_str_eq(pre, "qwen2")) s.pre = TOK_PRE_QWEN2;
        else {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported pre-tokenizer %.*s", path,
                      (int)(pre.len > 32 ? 32 : pre.len), pre.p);
            goto done;
        }
    }
    uint64_t n = 0, n2 = 0;
    rc = gguf_get_str_array(g, "tokenizer.ggml.tokens", TOK_MAX_TOKENS, &a.tokens, &a.token_lens, &n, st);
    if (rc < 0) goto done;
    if (rc == 0 || n == 0) { llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key tokenizer.ggml.tokens", path); goto done; }
    if (n > (uint64_t)c->n_vocab) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: tokenizer has %llu tokens but the embedding only %d rows", path,
                  (unsigned long long)n, c->n_vocab);
        goto done;
    }
    s.n_tokens = (int)n;
    s.tokens = a.tokens;
    s.token_lens = a.token_lens;
    rc = gguf_get_f32_array(g, "tokenizer.ggml.scores", TOK_MAX_TOKENS, &a.scores, &n2, st);
    if (rc < 0) goto done;
    if (rc > 0 && n2 != n) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: tokenizer.ggml.scores has %llu entries, tokens %llu", path,
                  (unsigned long long)n2, (unsigned long long)n);
        goto done;
    }
    s.scores = a.scores;
    rc = gguf_get_i32_array(g, "tokenizer.ggml.token_type", TOK_MAX_TOKENS, &a.types, &n2, st);
    if (rc < 0) goto done;
    if (rc > 0 && n2 != n) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: tokenizer.ggml.token_type has %llu entries, tokens %llu", path,
                  (unsigned long long)n2, (unsigned long long)n);
        goto done;
    }
    s.token_types = a.types;
    n2 = 0; /* stays 0 when the key is absent (SentencePiece files) */
    rc = gguf_get_str_array(g, "tokenizer.ggml.merges", TOK_MAX_MERGES, &a.merges, &a.merge_lens, &n2, st);
    if (rc < 0) goto done;
    if (rc == 0 && bpe) { llmi_fail(st, LLMI_E_RUNTIME, "%s: missing metadata key tokenizer.ggml.merges", path); goto done; }
    s.n_merges = (int)n2;
    s.merges = a.merges;
    s.merge_lens = a.merge_lens;

    /* SentencePiece files default to <unk>=0 <s>=1 </s>=2 (as llama.cpp does) */
    s.bos_id = s.eos_id = s.unk_id = s.pad_id = -1;
    if (!bpe) {
        s.unk_id = 0 < s.n_tokens ? 0 : -1;
        s.bos_id = 1 < s.n_tokens ? 1 : -1;
        s.eos_id = 2 < s.n_tokens ? 2 : -1;
    }
    int eot = -1, eom = -1;
    if (gguf_special_id(g, "tokenizer.ggml.bos_token_id", s.n_tokens, true, &s.bos_id, st) ||
        gguf_special_id(g, "tokenizer.ggml.eos_token_id", s.n_tokens, true, &s.eos_id, st) ||
        gguf_special_id(g, "tokenizer.ggml.unknown_token_id", s.n_tokens, false, &s.unk_id, st) ||
        gguf_special_id(g, "tokenizer.ggml.padding_token_id", s.n_tokens, false, &s.pad_id, st) ||
        gguf_special_id(g, "tokenizer.ggml.eot_token_id", s.n_tokens, false, &eot, st) ||
        gguf_special_id(g, "tokenizer.ggml.eom_token_id", s.n_tokens, false, &eom, st))
        goto done;
    if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &s.add_bos, st) < 0 ||
        gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &s.add_eos, st) < 0)
        goto done;
    gguf_str tmpl;
    rc = gguf_get_str(g, "tokenizer.chat_template", &tmpl, st);
    if (rc < 0) goto done;
    if (rc > 0) {
        a.chat_template = malloc((size_t)tmpl.len + 1);
        if (!a.chat_template) { llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path); goto done; }
        memcpy(a.chat_template, tmpl.p, (size_t)tmpl.len);
        a.chat_template[tmpl.len] = '\0';
        s.chat_template = a.chat_template;
    }

    /* End-of-generation tokens beyond eos, found by text as llama.cpp does: chat models
     * end a turn with these even when eos names another token. */
    static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|endoftext|>", "<|end|>", "</s>",
                                            "<|end_of_text|>", "<|eom_id|>"};
    a.eog = malloc(sizeof(int32_t) * 16);
    if (!a.eog) { llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path); goto done; }
    if (eot >= 0) a.eog[s.n_eog_ids++] = eot;
    if (eom >= 0) a.eog[s.n_eog_ids++] = eom;
    /* llama.cpp marks these end-of-generation whatever their token type says */
    for (int i = 0; i < s.n_tokens && s.n_eog_ids < 16; i++) {
        for (size_t k = 0; k < sizeof eog_texts / sizeof eog_texts[0]; k++) {
            if (a.token_lens[i] == strlen(eog_texts[k]) && memcmp(a.tokens[i], eog_texts[k], a.token_lens[i]) == 0) {
                a.eog[s.n_eog_ids++] = i;
                break;
            }
        }
    }
    s.eog_ids = a.eog;
    llmi_status tst;
    llmi_status_clear(&tst);
    if (tok_create(&s, out, &tst)) { tok_error(path, &tst, st); goto done; }
    ret = 0;
done:
    gguf_tok_arrays_free(&a);
    return ret;
}

static int model_add_map(llmi_model *m, void *addr, size_t len, const char *what, llmi_status *st) {
    if (m->n_maps >= (int)(sizeof m->maps / sizeof m->maps[0])) {
        munmap(addr, len);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: too many files to map (limit %zu)", what,
                         sizeof m->maps / sizeof m->maps[0]);
    }
    m->maps[m->n_maps++] = (llmi_mapping){addr, len};
    return 0;
}

int model_load_gguf(const char *path, const llmi_load_opts *opts, llmi_model *m, llmi_status *st) {
    memset(m, 0, sizeof *m);
    gguf_file g;
    if (gguf_open(path, &g, st)) return LLMI_E_RUNTIME;
    bool has_output = false;
    weight_src w = {gguf_names, path, &g, gguf_find_src, NULL, NULL};
    if (gguf_config(&g, &m->cfg, &has_output, st) ||
        load_weights(&w, m, m->cfg.arch == LLMI_ARCH_LLAMA, st))
        goto fail;
    snprintf(m->source_path, sizeof m->source_path, "%s", path);
    snprintf(m->format, sizeof m->format, "gguf");
    void *addr;
    size_t len;
    gguf_take_map(&g, &addr, &len);
    if (model_add_map(m, addr, len, path, st)) goto fail;
    if (!(opts && opts->no_tokenizer) && gguf_tokenizer(&g, &m->cfg, &m->tok, st)) goto fail;
    gguf_close(&g);
    return 0;
fail:
    model_free(m);
    gguf_close(&g);
    return LLMI_E_RUNTIME;
}

/* ================================================================ Hugging Face directory */

static cJSON *json_item(const cJSON *o, const char *key) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return (j && !cJSON_IsNull(j)) ? (cJSON *)j : NULL;
}

/* 1 set, 0 absent (null counts as absent), < 0 error naming file and field. */
static int json_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int *out, const char *file,
                    llmi_status *st) {
    const cJSON *j = json_item(o, key);
    if (!j) return 0;
    double d = cJSON_IsNumber(j) ? j->valuedouble : NAN;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be an integer in [%lld, %lld]", file, key, (long long)lo,
                  (long long)hi);
        return -LLMI_E_RUNTIME;
    }
    *out = (int)d;
    return 1;
}

static int json_num(const cJSON *o, const char *key, float *out, const char *file, llmi_status *st) {
    const cJSON *j = json_item(o, key);
    if (!j) return 0;
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be a finite number", file, key);
        return -LLMI_E_RUNTIME;
    }
    *out = to_f32(j->valuedouble);
    return 1;
}

static int json_bool(const cJSON *o, const char *key, bool *out, const char *file, llmi_status *st) {
    const cJSON *j = json_item(o, key);
    if (!j) return 0;
    if (!cJSON_IsBool(j)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: %s must be true or false", file, key);
        return -LLMI_E_RUNTIME;
    }
    *out = cJSON_IsTrue(j);
    return 1;
}

static int json_req_int(const cJSON *o, const char *key, int *out, const char *file, llmi_status *st) {
    int rc = json_int(o, key, 1, INT32_MAX, out, file, st);
    if (rc == 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing %s", file, key);
    return rc < 0 ? LLMI_E_RUNTIME : 0;
}

static int hf_rope_scaling(const cJSON *rs, llmi_config *c, const char *file, llmi_status *st) {
    if (!rs) return 0;
    if (!cJSON_IsObject(rs)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling must be an object or null", file);
    const cJSON *t = json_item(rs, "rope_type");
    if (!t) t = json_item(rs, "type");
    if (!t || !cJSON_IsString(t)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling has no rope_type", file);
    if (strcmp(t->valuestring, "default") == 0) return 0;
    if (strcmp(t->valuestring, "linear") == 0) {
        c->rope_scaling = LLMI_ROPE_SCALING_LINEAR;
        if (json_num(rs, "factor", &c->rope_factor, file, st) <= 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling.factor is required for linear scaling", file);
        return 0;
    }
    if (strcmp(t->valuestring, "llama3") == 0) {
        c->rope_scaling = LLMI_ROPE_SCALING_LLAMA3;
        if (json_num(rs, "factor", &c->rope_factor, file, st) <= 0 ||
            json_num(rs, "low_freq_factor", &c->rope_low_freq_factor, file, st) <= 0 ||
            json_num(rs, "high_freq_factor", &c->rope_high_freq_factor, file, st) <= 0 ||
            json_int(rs, "original_max_position_embeddings", 1, INT32_MAX, &c->rope_orig_max_pos, file, st) <= 0)
            return llmi_fail(st, LLMI_E_RUNTIME,
                             "%s: llama3 rope_scaling needs factor, low_freq_factor, high_freq_factor and "
                             "original_max_position_embeddings", file);
        return 0;
    }
    char b[40];
    snprintf(b, sizeof b, "%s", t->valuestring);
    for (char *p = b; *p; p++)
        if ((unsigned char)*p < 0x20) *p = '?';
    return llmi_fail(st, LLMI_E_RUNTIME, "%s: rope_scaling type %s is not supported", file, b);
}

/* Parses a Hugging Face config.json into c (validated). */
static int hf_config(const char *file, llmi_config *c, quant_config *qc, bool *quantized, llmi_status *st) {
    char *buf;
    size_t len;
    if (fileio_read(file, &(fileio_opts){.max_bytes = HF_MAX_JSON}, &buf, &len, st)) return LLMI_E_RUNTIME;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!j) return llmi_fail(st, LLMI_E_RUNTIME, "%s: not valid JSON", file);
    int rc = LLMI_E_RUNTIME;
    if (!cJSON_IsObject(j)) { llmi_fail(st, LLMI_E_RUNTIME, "%s: not a JSON object", file); goto done; }
    const cJSON *archs = json_item(j, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    if (!cJSON_IsString(a0)) { llmi_fail(st, LLMI_E_RUNTIME, "%s: missing architectures[0]", file); goto done; }
    if (strcmp(a0->valuestring, "LlamaForCausalLM") == 0) {
        c->arch = LLMI_ARCH_LLAMA;
        snprintf(c->arch_name, sizeof c->arch_name, "llama");
    } else if (strcmp(a0->valuestring, "MistralForCausalLM") == 0) {
        c->arch = LLMI_ARCH_LLAMA;
        snprintf(c->arch_name, sizeof c->arch_name, "mistral");
    } else if (strcmp(a0->valuestring, "Qwen2ForCausalLM") == 0) {
        c->arch = LLMI_ARCH_QWEN2;
        snprintf(c->arch_name, sizeof c->arch_name, "qwen2");
    } else {
        char b[64];
        snprintf(b, sizeof b, "%s", a0->valuestring);
        for (char *p = b; *p; p++)
            if ((unsigned char)*p < 0x20) *p = '?';
        llmi_fail(st, LLMI_E_RUNTIME,
                  "%s: unsupported architecture %s (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)",
                  file, b);
        goto done;
    }
    const cJSON *q = json_item(j, "quantization_config");
    *quantized = q != NULL;
    if (q && quant_config_parse(q, qc, file, st)) goto done;
    if (json_req_int(j, "hidden_size", &c->dim, file, st) || json_req_int(j, "num_hidden_layers", &c->n_layers, file, st) ||
        json_req_int(j, "num_attention_heads", &c->n_heads, file, st) ||
        json_req_int(j, "intermediate_size", &c->ffn_dim, file, st) ||
        json_req_int(j, "vocab_size", &c->n_vocab, file, st))
        goto done;
    if (c->n_layers > LLMI_MAX_LAYERS) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: num_hidden_layers %d exceeds the limit of %d layers", file, c->n_layers,
                  LLMI_MAX_LAYERS);
        goto done;
    }
    c->n_kv_heads = c->n_heads;
    if (json_int(j, "num_key_value_heads", 1, INT32_MAX, &c->n_kv_heads, file, st) < 0) goto done;
    int hrc = json_int(j, "head_dim", 1, INT32_MAX, &c->head_dim, file, st);
    if (hrc < 0) goto done;
    if (hrc == 0) {
        if (c->dim % c->n_heads != 0) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: hidden_size %d is not a multiple of num_attention_heads %d", file, c->dim,
                      c->n_heads);
            goto done;
        }
        c->head_dim = c->dim / c->n_heads;
    }
    c->rope_dim = c->head_dim;
    /* defaults as in transformers' LlamaConfig / Qwen2Config */
    c->norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->max_ctx = c->arch == LLMI_ARCH_QWEN2 ? 32768 : 2048;
    if (json_num(j, "rms_norm_eps", &c->norm_eps, file, st) < 0 ||
        json_num(j, "rope_theta", &c->rope_theta, file, st) < 0 ||
        json_int(j, "max_position_embeddings", 1, INT32_MAX, &c->max_ctx, file, st) < 0 ||
        json_bool(j, "tie_word_embeddings", &c->tie_embeddings, file, st) < 0)
        goto done;
    /* sliding-window attention is not implemented: stay within the window, where full
     * attention gives the same result */
    int window = 0;
    bool use_window = c->arch != LLMI_ARCH_QWEN2;
    if (json_bool(j, "use_sliding_window", &use_window, file, st) < 0 ||
        json_int(j, "sliding_window", 1, INT32_MAX, &window, file, st) < 0)
        goto done;
    if (use_window && window > 0 && window < c->max_ctx) c->max_ctx = window;
    c->qkv_bias = c->arch == LLMI_ARCH_QWEN2;
    if (c->arch == LLMI_ARCH_LLAMA && json_bool(j, "attention_bias", &c->qkv_bias, file, st) < 0) goto done;
    bool mlp_bias = false;
    if (json_bool(j, "mlp_bias", &mlp_bias, file, st) < 0) goto done;
    if (mlp_bias) { llmi_fail(st, LLMI_E_RUNTIME, "%s: mlp_bias is not supported", file); goto done; }
    const cJSON *hact = json_item(j, "hidden_act");
    if (hact && (!cJSON_IsString(hact) || strcmp(hact->valuestring, "silu") != 0)) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: hidden_act must be silu", file);
        goto done;
    }
    /* transformers v5 moved theta and scaling into rope_parameters */
    const cJSON *rp = json_item(j, "rope_parameters");
    const cJSON *rs = json_item(j, "rope_scaling");
    if (rp && cJSON_IsObject(rp)) {
        if (json_num(rp, "rope_theta", &c->rope_theta, file, st) < 0) goto done;
        if (!rs) rs = rp;
    }
    if (hf_rope_scaling(rs, c, file, st)) goto done;
    rc = config_validate(c, file, st);
done:
    cJSON_Delete(j);
    return rc;
}

/* The shards of one checkpoint and, for a sharded one, which shard holds each tensor. */
typedef struct hf_index_entry { char *name; int shard; } hf_index_entry;
typedef struct hf_ctx {
    const char *dir;
    int n_shards;
    safetensors_file shards[64];      /* (n_shards) */
    int n_entries;
    hf_index_entry *entries;          /* (n_entries) sorted by name; NULL for one file */
} hf_ctx;

static int entry_cmp(const void *a, const void *b) {
    return strcmp(((const hf_index_entry *)a)->name, ((const hf_index_entry *)b)->name);
}

static const hf_index_entry *hf_lookup(const hf_ctx *h, const char *name) {
    hf_index_entry key = {(char *)name, 0};
    return bsearch(&key, h->entries, (size_t)h->n_entries, sizeof key, entry_cmp);
}

static void hf_ctx_free(hf_ctx *h) {
    for (int i = 0; i < h->n_shards; i++) safetensors_close(&h->shards[i]);
    for (int i = 0; i < h->n_entries; i++) free(h->entries[i].name);
    free(h->entries);
    h->n_shards = h->n_entries = 0;
    h->entries = NULL;
}

static int hf_find_src(const weight_src *w, const char *name, src_tensor *out, llmi_status *st) {
    const hf_ctx *h = w->ctx;
    const safetensors_file *f = &h->shards[0];
    if (h->entries) {
        const hf_index_entry *e = hf_lookup(h, name);
        if (!e) return 0;
        f = &h->shards[e->shard];
    }
    const safetensors_tensor *t = safetensors_find(f, name);
    if (!t) return 0;
    out->file = f->path;
    out->type_name = safetensors_dtype_name(t->dtype);
    out->dtype_ok = true;
    switch (t->dtype) {
    case ST_F32: out->dtype = LLMI_F32; break;
    case ST_F16: out->dtype = LLMI_F16; break;
    case ST_BF16: out->dtype = LLMI_BF16; break;
    default: out->dtype_ok = false; break;
    }
    out->n_dims = t->n_dims;
    for (int d = 0; d < t->n_dims; d++) out->shape[d] = t->shape[d];
    out->data = t->data;
    out->n_bytes = t->end - t->begin;
    (void)st;
    return 1;
}

/* The raw safetensors entry of a tensor (quant_load_linear checks its dtype and shape). */
static const safetensors_tensor *hf_find_st(void *ctx, const char *name) {
    const hf_ctx *h = ctx;
    const safetensors_file *f = &h->shards[0];
    if (h->entries) {
        const hf_index_entry *e = hf_lookup(h, name);
        if (!e) return NULL;
        f = &h->shards[e->shard];
    }
    return safetensors_find(f, name);
}

/* A shard name from the index must be a plain file name in the model directory. */
static bool shard_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 255 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) return false;
    for (const char *p = s; *p; p++)
        if (*p == '/' || (unsigned char)*p < 0x20) return false;
    return true;
}

static int hf_open_shards(const char *dir, hf_ctx *h, llmi_status *st) {
    char path[2048], ipath[2048];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    if (stat(ipath, &sb) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (stat(path, &sb) != 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: no model.safetensors or model.safetensors.index.json", dir);
        if (safetensors_open(path, &h->shards[0], st)) return LLMI_E_RUNTIME;
        h->n_shards = 1;
        return 0;
    }
    char *buf;
    size_t len;
    if (fileio_read(ipath, &(fileio_opts){.max_bytes = HF_MAX_JSON}, &buf, &len, st)) return LLMI_E_RUNTIME;
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    if (!j) return llmi_fail(st, LLMI_E_RUNTIME, "%s: not valid JSON", ipath);
    int rc = LLMI_E_RUNTIME;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(j, "weight_map");
    if (!cJSON_IsObject(wm)) { llmi_fail(st, LLMI_E_RUNTIME, "%s: missing weight_map object", ipath); goto done; }
    int n = cJSON_GetArraySize(wm);
    h->entries = calloc(n ? (size_t)n : 1, sizeof *h->entries);
    if (!h->entries) { llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", ipath); goto done; }
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring)) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: weight_map entry for a tensor is not a plain file name", ipath);
            goto done;
        }
        int s;
        for (s = 0; s < h->n_shards; s++)
            if (strcmp(strrchr(h->shards[s].path, '/') + 1, e->valuestring) == 0) break;
        if (s == h->n_shards) {
            if (h->n_shards == 64) { llmi_fail(st, LLMI_E_RUNTIME, "%s: more than 64 shards", ipath); goto done; }
            snprintf(path, sizeof path, "%s/%s", dir, e->valuestring);
            if (safetensors_open(path, &h->shards[s], st)) goto done;
            h->n_shards++;
        }
        h->entries[h->n_entries].name = strdup(e->string);
        if (!h->entries[h->n_entries].name) { llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", ipath); goto done; }
        h->entries[h->n_entries++].shard = s;
    }
    qsort(h->entries, (size_t)h->n_entries, sizeof *h->entries, entry_cmp);
    for (int i = 1; i < h->n_entries; i++) {
        if (strcmp(h->entries[i - 1].name, h->entries[i].name) == 0) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %.100s is listed twice in weight_map", ipath, h->entries[i].name);
            goto done;
        }
    }
    /* every tensor exactly once: each listed tensor is in its shard, each shard tensor is
     * listed for that shard (so no tensor hides in two shards) */
    for (int i = 0; i < h->n_entries; i++) {
        if (!safetensors_find(&h->shards[h->entries[i].shard], h->entries[i].name)) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: weight_map puts %.100s in %s, which has no such tensor", ipath,
                      h->entries[i].name, h->shards[h->entries[i].shard].path);
            goto done;
        }
    }
    for (int s = 0; s < h->n_shards; s++) {
        for (int i = 0; i < h->shards[s].n_tensors; i++) {
            const hf_index_entry *x = hf_lookup(h, h->shards[s].tensors[i].name);
            if (!x || x->shard != s) {
                llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %.100s is not mapped to this shard by %s", h->shards[s].path,
                          h->shards[s].tensors[i].name, ipath);
                goto done;
            }
        }
    }
    rc = 0;
done:
    cJSON_Delete(j);
    return rc;
}

int model_load_hf(const char *dir, const llmi_load_opts *opts, llmi_model *m, llmi_status *st) {
    memset(m, 0, sizeof *m);
    char file[2048];
    snprintf(file, sizeof file, "%s/config.json", dir);
    quant_config qc;
    bool quantized = false;
    if (hf_config(file, &m->cfg, &qc, &quantized, st)) return LLMI_E_RUNTIME;
    set_name(m->cfg.name, sizeof m->cfg.name, dir);
    hf_ctx *h = calloc(1, sizeof *h);
    if (!h) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", dir);
    h->dir = dir;
    weight_src w = {hf_names, dir, h, hf_find_src, quantized ? &qc : NULL, hf_find_st};
    if (hf_open_shards(dir, h, st)) goto fail;
    if (!m->cfg.tie_embeddings) {
        /* an untied config without lm_head would leave the output layer undefined */
        src_tensor t;
        char name[128];
        int rc = find_role(&w, W_LM_HEAD, -1, &t, name, sizeof name, st);
        if (rc < 0) goto fail;
        if (rc == 0) { llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor lm_head.weight (tie_word_embeddings is false)", dir); goto fail; }
    }
    if (load_weights(&w, m, false, st)) goto fail;
    snprintf(m->source_path, sizeof m->source_path, "%s", dir);
    snprintf(m->format, sizeof m->format, "safetensors");
    for (int i = 0; i < h->n_shards; i++) {
        void *addr;
        size_t len;
        safetensors_take_map(&h->shards[i], &addr, &len);
        if (model_add_map(m, addr, len, dir, st)) goto fail;
    }
    hf_ctx_free(h);
    free(h);
    h = NULL;
    if (!(opts && opts->no_tokenizer)) {
        llmi_status tst;
        llmi_status_clear(&tst);
        if (tok_load_hf(dir, &m->tok, &tst)) { tok_error(dir, &tst, st); goto fail; }
        if (tok_n_vocab(m->tok) > m->cfg.n_vocab) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: tokenizer has %d tokens but the embedding only %d rows", dir,
                      tok_n_vocab(m->tok), m->cfg.n_vocab);
            goto fail;
        }
    }
    return 0;
fail:
    model_free(m);
    if (h) {
        hf_ctx_free(h);
        free(h);
    }
    return LLMI_E_RUNTIME;
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
