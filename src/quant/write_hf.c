/* write_hf.c — owns writing a quantized model as a Hugging Face directory that
 * transformers, vLLM and llmi load: model.safetensors (GPTQ v1 or AWQ-GEMM linears,
 * fp16 everything else), config.json with quantization_config, quantize_config.json
 * (GPTQ), and the tokenizer files (copied from an HF input; generated from the GGUF
 * vocabulary for a GGUF input).  Everything goes to a temporary directory beside the
 * output that is renamed into place at the end, so a failure leaves nothing behind. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/fileio.h"
#include "model/gguf.h"
#include "quant/write_hf.h"
#include "tok/tokenizer.h"

/* ---- the streaming safetensors writer ---------------------------------------------------
 * Every tensor's name, dtype, shape and offset follow from the config and the options, so
 * the header is written first and each layer's tensors go to their place as soon as the
 * layer is quantized: the writer holds one linear's packing, never the model. */
#define QW_CHUNK (8u << 20)      /* bytes of fp16 rows converted per write */

typedef struct qw_entry {
    char name[128];
    const char *dtype;           /* "F16", "I32" */
    int n_dims;
    int64_t shape[2];
    size_t nbytes;
    size_t offset;               /* from the start of the data section */
} qw_entry;

struct quant_writer {
    const llmi_model *m;
    quant_method method;
    int group_size;
    char out[2048], tmp[2048];   /* the output directory and the temporary one beside it */
    int fd;                      /* tmp/model.safetensors */
    size_t data_start;           /* 8 + the padded header */
    qw_entry *e;                 /* (n) in data order */
    int n, cap;
    int *layer_first;            /* (n_layers + 1) first entry of each layer; [n_layers] = n */
};

static int qw_add(quant_writer *w, const char *name, const char *dtype, int64_t d0, int64_t d1, size_t es,
                  llmi_status *st) {
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 256;
        qw_entry *e = realloc(w->e, (size_t)cap * sizeof *e);
        if (!e) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory");
        w->e = e, w->cap = cap;
    }
    qw_entry *t = &w->e[w->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->n_dims = d1 < 0 ? 1 : 2;
    t->shape[0] = d0, t->shape[1] = d1;
    t->nbytes = (size_t)d0 * (size_t)(d1 < 0 ? 1 : d1) * es;
    t->offset = w->n ? w->e[w->n - 1].offset + w->e[w->n - 1].nbytes : 0;
    w->n++;
    return 0;
}

static const char *const qw_bias_names[3] = {"q_proj", "k_proj", "v_proj"};
static const char *const qw_qk_norm_names[2] = {"q_norm", "k_norm"};

/* Every tensor of the output in data order: embeddings, lm_head, final norm, then per
 * layer its norms, q/k/v biases, Qwen3's q/k norms and the seven linears. */
static int qw_plan(quant_writer *w, llmi_status *st) {
    const llmi_model *m = w->m;
    const llmi_config *c = &m->cfg;
    char name[192];
    w->layer_first = malloc((size_t)(c->n_layers + 1) * sizeof(int));
    if (!w->layer_first) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory");
    if (qw_add(w, "model.embed_tokens.weight", "F16", m->tok_embd.rows, m->tok_embd.cols, 2, st)) return st->code;
    if (!c->tie_embeddings && qw_add(w, "lm_head.weight", "F16", m->lm_head.rows, m->lm_head.cols, 2, st))
        return st->code;
    if (qw_add(w, "model.norm.weight", "F16", c->dim, -1, 2, st)) return st->code;
    const bool awq = w->method == QUANT_AWQ;
    for (int l = 0; l < c->n_layers; l++) {
        const llmi_layer *L = &m->layers[l];
        const float *bias[3] = {L->bq, L->bk, L->bv};
        w->layer_first[l] = w->n;
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        if (qw_add(w, name, "F16", c->dim, -1, 2, st)) return st->code;
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        if (qw_add(w, name, "F16", c->dim, -1, 2, st)) return st->code;
        for (int b = 0; b < 3; b++) {
            if (!bias[b]) continue;
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.bias", l, qw_bias_names[b]);
            if (qw_add(w, name, "F16", (b == 0 ? c->n_heads : c->n_kv_heads) * c->head_dim, -1, 2, st))
                return st->code;
        }
        for (int k = 0; k < 2 && c->qk_norm; k++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, qw_qk_norm_names[k]);
            if (qw_add(w, name, "F16", c->head_dim, -1, 2, st)) return st->code;
        }
        for (int q = 0; q < QL_COUNT; q++) {
            int rows, cols, ng;
            quant_linear_shape(c, q, &rows, &cols);
            ng = cols / w->group_size;
            const char *ln = quant_linear_names[q];
            snprintf(name, sizeof name, "model.layers.%d.%s.qweight", l, ln);
            if (qw_add(w, name, "I32", awq ? cols : cols / 8, awq ? rows / 8 : rows, 4, st)) return st->code;
            snprintf(name, sizeof name, "model.layers.%d.%s.qzeros", l, ln);
            if (qw_add(w, name, "I32", ng, rows / 8, 4, st)) return st->code;
            snprintf(name, sizeof name, "model.layers.%d.%s.scales", l, ln);
            if (qw_add(w, name, "F16", ng, rows, 2, st)) return st->code;
            snprintf(name, sizeof name, "model.layers.%d.%s.g_idx", l, ln);
            if (!awq && qw_add(w, name, "I32", cols, -1, 4, st)) return st->code;
        }
    }
    w->layer_first[c->n_layers] = w->n;
    return 0;
}

static int qw_cmp_name(const void *a, const void *b) {
    return strcmp((*(const qw_entry *const *)a)->name, (*(const qw_entry *const *)b)->name);
}

/* The header (keys sorted by name, as the safetensors library writes them). */
static int qw_write_header(quant_writer *w, const char *path, llmi_status *st) {
    const qw_entry **sorted = malloc((size_t)w->n * sizeof *sorted);
    if (!sorted) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory");
    for (int i = 0; i < w->n; i++) sorted[i] = &w->e[i];
    qsort(sorted, (size_t)w->n, sizeof *sorted, qw_cmp_name);
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (int i = 0; i < w->n; i++) {
        const qw_entry *t = sorted[i];
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", t->dtype);
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *of = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)t->offset));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(t->offset + t->nbytes)));
    }
    free(sorted);
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    if (!js) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory for the header", path);
    size_t jl = strlen(js), padded = (jl + 7) / 8 * 8;
    uint8_t *buf = malloc(8 + padded);
    if (!buf) {
        free(js);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory for the header", path);
    }
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, js, jl);
    memset(buf + 8 + jl, ' ', padded - jl);
    free(js);
    w->data_start = 8 + padded;
    size_t total = w->n ? w->e[w->n - 1].offset + w->e[w->n - 1].nbytes : 0;
    int rc = 0;
    if (pwrite(w->fd, buf, 8 + padded, 0) != (ssize_t)(8 + padded) || ftruncate(w->fd, (off_t)(w->data_start + total)))
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: write failed: %s", path, strerror(errno));
    free(buf);
    return rc;
}

/* bytes of entry i at byte `at` inside it. */
static int qw_put(quant_writer *w, int i, size_t at, const void *p, size_t n, llmi_status *st) {
    const uint8_t *b = p;
    off_t off = (off_t)(w->data_start + w->e[i].offset + at);
    while (n > 0) {
        ssize_t k = pwrite(w->fd, b, n, off);
        if (k <= 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: writing %s failed: %s", w->tmp, w->e[i].name, strerror(errno));
        b += k, n -= (size_t)k, off += k;
    }
    return 0;
}

static int qw_find(const quant_writer *w, int from, const char *name) {
    for (int i = from; i < w->n; i++)
        if (!strcmp(w->e[i].name, name)) return i;
    return -1;
}

static int qw_f16_vec(quant_writer *w, int i, const float *v, llmi_status *st) {
    size_t n = w->e[i].nbytes / 2;
    uint16_t *o = malloc(n * sizeof *o);
    if (!o) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for %s", w->e[i].name);
    for (size_t k = 0; k < n; k++) o[k] = f32_to_fp16(v[k]);
    int rc = qw_put(w, i, 0, o, n * 2, st);
    free(o);
    return rc;
}

/* A matrix as fp16, QW_CHUNK bytes of rows at a time; the source rows' pages are dropped
 * once converted (model_release_pages). */
static int qw_f16_mat(quant_writer *w, int i, const llmi_tensor *t, llmi_status *st) {
    int64_t chunk = (int64_t)(QW_CHUNK / ((size_t)t->cols * 2));
    if (chunk < 1) chunk = 1;
    if (chunk > t->rows) chunk = t->rows;
    uint16_t *o = malloc((size_t)chunk * t->cols * sizeof *o);   /* (chunk, cols) */
    float *rows = malloc((size_t)chunk * t->cols * sizeof(float));
    int rc = 0;
    if (!o || !rows) rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory converting %s", w->e[i].name);
    for (int64_t r0 = 0; r0 < t->rows && !rc; r0 += chunk) {
        int64_t nr = t->rows - r0 < chunk ? t->rows - r0 : chunk;
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < nr; r++) {
            float *row = rows + (size_t)r * t->cols;
            tensor_dequant_row(t, r0 + r, row);
            for (int64_t k = 0; k < t->cols; k++) o[(size_t)r * t->cols + k] = f32_to_fp16(row[k]);
        }
        rc = qw_put(w, i, (size_t)r0 * t->cols * 2, o, (size_t)nr * t->cols * 2, st);
        model_release_pages(w->m, (const uint8_t *)t->data + (size_t)r0 * t->row_bytes, (size_t)nr * t->row_bytes);
    }
    free(o), free(rows);
    return rc;
}

/* qweight, qzeros, scales (and g_idx for GPTQ) of one linear from entry i on. */
static int qw_linear(quant_writer *w, int i, const quant_grid *g, llmi_status *st) {
    const bool awq = w->method == QUANT_AWQ;
    void *buf[4];
    for (int k = 0; k < 4; k++) buf[k] = (awq && k == 3) ? NULL : malloc(w->e[i + k].nbytes ? w->e[i + k].nbytes : 1);
    int rc = 0;
    if (!buf[0] || !buf[1] || !buf[2] || (!awq && !buf[3]))
        rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory packing %s", w->e[i].name);
    if (!rc && g->rows * (size_t)g->cols / 2 != w->e[i].nbytes)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "quantize: %s: the grid is %dx%d, not the planned shape", w->e[i].name,
                       g->rows, g->cols);
    if (!rc) {
        if (awq) quant_pack_awq(g, buf[0], buf[1], buf[2]);
        else quant_pack_gptq(g, true, buf[0], buf[1], buf[2], buf[3]);
        for (int k = 0; k < (awq ? 3 : 4) && !rc; k++) rc = qw_put(w, i + k, 0, buf[k], w->e[i + k].nbytes, st);
    }
    for (int k = 0; k < 4; k++) free(buf[k]);
    return rc;
}

int quant_writer_layer(void *ctx, int l, quant_grid grids[QL_COUNT], quant_block *b, llmi_status *st) {
    quant_writer *w = ctx;
    int i = w->layer_first[l], end = w->layer_first[l + 1];
    if (qw_f16_vec(w, i++, b->attn_norm, st) || qw_f16_vec(w, i++, b->ffn_norm, st)) return st->code;
    const float *bias[3] = {b->bq, b->bk, b->bv};
    for (int k = 0; k < 3; k++) {
        char name[192];
        snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.bias", l, qw_bias_names[k]);
        if ((bias[k] != NULL) != (qw_find(w, i, name) == i))
            return llmi_fail(st, LLMI_E_RUNTIME, "quantize: layer %d: %s disagrees with the plan", l, name);
        if (bias[k] && qw_f16_vec(w, i++, bias[k], st)) return st->code;
    }
    /* quantization leaves the q/k norms as they were (AWQ's scales fold into attn_norm) */
    const llmi_layer *L = &w->m->layers[l];
    const float *qk_norm[2] = {L->q_norm, L->k_norm};
    for (int k = 0; k < 2 && w->m->cfg.qk_norm; k++)
        if (qw_f16_vec(w, i++, qk_norm[k], st)) return st->code;
    for (int q = 0; q < QL_COUNT; q++, i += w->method == QUANT_AWQ ? 3 : 4)
        if (qw_linear(w, i, &grids[q], st)) return st->code;
    if (i != end) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: layer %d wrote %d tensors, planned %d", l, i, end);
    return 0;
}

size_t quant_writer_bytes(const llmi_config *c, const quant_opts *o) {
    int rows, cols;
    size_t widest = 0;
    for (int q = 0; q < QL_COUNT; q++) {
        quant_linear_shape(c, q, &rows, &cols);
        size_t ng = (size_t)cols / o->group_size;
        size_t b = (size_t)rows * cols / 2 + ng * rows / 2 + ng * rows * 2 + (size_t)cols * 4;
        if (b > widest) widest = b;
    }
    /* one packed linear, or one chunk of fp16 rows with its fp32 staging; the plan */
    size_t chunk = (size_t)QW_CHUNK * 3 + (size_t)c->dim * 6;
    return (widest > chunk ? widest : chunk) + (size_t)(c->n_layers + 1) * 32 * (sizeof(qw_entry) + 256);
}

/* ---- JSON files ------------------------------------------------------------------------ */
static double qw_round6(double v) {
    char b[32];
    snprintf(b, sizeof b, "%.6g", v);
    return strtod(b, NULL);
}

static cJSON *qw_quant_config(const quant_opts *o, bool for_quantize_config) {
    cJSON *q = cJSON_CreateObject();
    if (o->method == QUANT_AWQ) {
        cJSON_AddStringToObject(q, "quant_method", "awq");
        cJSON_AddNumberToObject(q, "bits", o->bits);
        cJSON_AddNumberToObject(q, "group_size", o->group_size);
        cJSON_AddBoolToObject(q, "zero_point", true);
        cJSON_AddStringToObject(q, "version", "gemm");
        cJSON_AddNullToObject(q, "modules_to_not_convert");
        return q;
    }
    /* RTN is written in GPTQ's format: it is GPTQ with no error feedback. */
    cJSON_AddNumberToObject(q, "bits", o->bits);
    cJSON_AddNumberToObject(q, "group_size", o->group_size);
    cJSON_AddNumberToObject(q, "damp_percent", qw_round6(o->damp_percent));
    cJSON_AddBoolToObject(q, "desc_act", o->desc_act);
    cJSON_AddBoolToObject(q, "static_groups", false);
    cJSON_AddBoolToObject(q, "sym", o->sym);
    cJSON_AddBoolToObject(q, "true_sequential", true);
    cJSON_AddBoolToObject(q, "lm_head", false);
    cJSON_AddStringToObject(q, "checkpoint_format", "gptq");
    cJSON_AddStringToObject(q, "quant_method", "gptq");
    if (for_quantize_config) {
        cJSON_AddStringToObject(q, "model_file_base_name", "model");
        cJSON_AddStringToObject(q, "quantizer", o->method == QUANT_RTN ? "llmi-rtn" : "llmi-gptq");
    }
    return q;
}

static int qw_write_json(const char *path, const cJSON *j, llmi_status *st) {
    char *s = cJSON_Print(j);
    if (!s) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path);
    FILE *f = fopen(path, "w");
    int ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    free(s);
    return ok ? 0 : llmi_fail(st, LLMI_E_RUNTIME, "%s: write failed: %s", path, strerror(errno));
}


static cJSON *qw_config_from_model(const llmi_model *m) {
    const llmi_config *c = &m->cfg;
    cJSON *j = cJSON_CreateObject();
    bool qwen = c->arch == LLMI_ARCH_QWEN2, smollm3 = false, granite = strcmp(c->arch_name, "granite") == 0;
    for (int l = 0; l < c->n_layers; l++) smollm3 |= c->layer_nope[l];
    const char *cls = qwen ? "Qwen2ForCausalLM" : c->arch == LLMI_ARCH_QWEN3 ? "Qwen3ForCausalLM"
                    : smollm3 ? "SmolLM3ForCausalLM" : granite ? "GraniteForCausalLM" : "LlamaForCausalLM";
    cJSON *a = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(cls));
    cJSON_AddStringToObject(j, "model_type", qwen ? "qwen2" : c->arch == LLMI_ARCH_QWEN3 ? "qwen3"
                                             : smollm3 ? "smollm3" : granite ? "granite" : "llama");
    if (smollm3) {   /* SmolLM3Config: 1 where a layer has RoPE, 0 where it has none */
        cJSON *nr = cJSON_AddArrayToObject(j, "no_rope_layers");
        for (int l = 0; l < c->n_layers; l++) cJSON_AddItemToArray(nr, cJSON_CreateNumber(c->layer_nope[l] ? 0 : 1));
    }
    if (granite) {   /* GraniteConfig's multipliers, each 1 when absent (q.k's too: written as used) */
        cJSON_AddNumberToObject(j, "embedding_multiplier", qw_round6(config_embed_scale(c)));
        cJSON_AddNumberToObject(j, "attention_multiplier", qw_round6(config_attn_scale(c)));
        cJSON_AddNumberToObject(j, "residual_multiplier", qw_round6(config_residual_scale(c)));
        cJSON_AddNumberToObject(j, "logits_scaling", qw_round6(config_logit_scale(c)));
    }
    cJSON_AddNumberToObject(j, "hidden_size", c->dim);
    cJSON_AddNumberToObject(j, "intermediate_size", c->ffn_dim);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(j, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(j, "rms_norm_eps", qw_round6(c->norm_eps));
    cJSON_AddNumberToObject(j, "rope_theta", qw_round6(c->rope_theta));
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_ctx);
    cJSON_AddNumberToObject(j, "vocab_size", c->n_vocab);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    if (!qwen) cJSON_AddBoolToObject(j, "attention_bias", c->qkv_bias);
    if (c->rope_scaling == LLMI_ROPE_SCALING_LLAMA3) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddNumberToObject(rs, "factor", qw_round6(c->rope_factor));
        cJSON_AddNumberToObject(rs, "low_freq_factor", qw_round6(c->rope_low_freq_factor));
        cJSON_AddNumberToObject(rs, "high_freq_factor", qw_round6(c->rope_high_freq_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_max_pos);
    } else if (c->rope_scaling == LLMI_ROPE_SCALING_LINEAR) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddNumberToObject(rs, "factor", qw_round6(c->rope_factor));
    } else if (c->rope_scaling == LLMI_ROPE_SCALING_YARN) {
        /* every parameter but a default attention factor spelled out */
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "yarn");
        cJSON_AddNumberToObject(rs, "factor", qw_round6(c->rope_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_max_pos);
        cJSON_AddNumberToObject(rs, "beta_fast", qw_round6(c->rope_yarn_beta_fast));
        cJSON_AddNumberToObject(rs, "beta_slow", qw_round6(c->rope_yarn_beta_slow));
        /* the default left for the reader to compute exactly (six digits would round it) */
        if (c->rope_attn_factor != (float)config_yarn_mscale(c->rope_factor, 1))
            cJSON_AddNumberToObject(rs, "attention_factor", c->rope_attn_factor);
        cJSON_AddBoolToObject(rs, "truncate", !c->rope_yarn_no_truncate);
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    if (m->tok) {
        if (tok_bos(m->tok) >= 0) cJSON_AddNumberToObject(j, "bos_token_id", tok_bos(m->tok));
        if (tok_eos(m->tok) >= 0) cJSON_AddNumberToObject(j, "eos_token_id", tok_eos(m->tok));
    }
    return j;
}

/* The input's config.json, to be rewritten with the quantization_config. */
static int qw_read_json(const char *path, cJSON **out, llmi_status *st) {
    char *buf;
    size_t n;
    fileio_opts fo = {.max_bytes = 64u << 20};   /* a config.json is a few KB */
    if (fileio_read(path, &fo, &buf, &n, st)) return st->code;
    *out = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!*out || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: not a JSON object", path);
    }
    return 0;
}

static int qw_copy_file(const char *src, const char *dst, llmi_status *st) {
    FILE *in = fopen(src, "rb");
    if (!in) return llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot open: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot create: %s", dst, strerror(errno));
    }
    char buf[65536];
    size_t n;
    int ok = 1;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    ok &= !ferror(in);
    fclose(in);
    if (fclose(out) != 0) ok = 0;
    return ok ? 0 : llmi_fail(st, LLMI_E_RUNTIME, "%s: copy failed", dst);
}

/* ---- tokenizer.json from a GGUF vocabulary (byte-level BPE) --------------------------- */
static cJSON *qw_bytelevel(bool add_prefix, bool trim, bool regex) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddBoolToObject(b, "add_prefix_space", add_prefix);
    cJSON_AddBoolToObject(b, "trim_offsets", trim);
    cJSON_AddBoolToObject(b, "use_regex", regex);
    return b;
}

static cJSON *qw_split(const char *regex) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "Split");
    cJSON *p = cJSON_AddObjectToObject(s, "pattern");
    cJSON_AddStringToObject(p, "Regex", regex);
    cJSON_AddStringToObject(s, "behavior", "Isolated");
    cJSON_AddBoolToObject(s, "invert", false);
    return s;
}

static char *qw_strndup(const char *p, size_t n) {
    char *s = malloc(n + 1);
    if (s) memcpy(s, p, n), s[n] = 0;
    return s;
}

/* The vocabulary of a byte-level BPE GGUF, as tokenizer.json needs it. */
typedef struct qw_vocab {
    tok_pre_kind pre;                      /* what tokenizer.ggml.pre stands for (GPT-2's when absent) */
    bool add_bos;                          /* llama.cpp's default for that name */
    const char **toks; uint32_t *tl;       /* (nt) */
    const char **merges; uint32_t *ml;     /* (nm) "a b" */
    int32_t *types;                        /* (ntypes) or NULL */
    uint64_t nt, nm, ntypes;
} qw_vocab;

static void qw_vocab_free(qw_vocab *v) {
    free(v->toks), free(v->tl), free(v->merges), free(v->ml), free(v->types);
}

static int qw_vocab_read(const gguf_file *g, qw_vocab *v, llmi_status *st) {
    gguf_str model = {0};
    if (gguf_get_str(g, "tokenizer.ggml.model", &model, st) != 1 || !gguf_str_eq(model, "gpt2"))
        return st->code ? st->code
                        : llmi_fail(st, LLMI_E_RUNTIME, "%s: tokenizer.ggml.model is not gpt2 (byte-level BPE): "
                                    "writing its tokenizer.json is not supported", g->path);
    gguf_str pre = {0};
    int has_pre = gguf_get_str(g, "tokenizer.ggml.pre", &pre, st);
    if (has_pre < 0) return st->code;
    v->pre = TOK_PRE_GPT2;
    v->add_bos = false;
    if (has_pre > 0 && !gguf_str_eq(pre, "default") && !tok_gguf_pre_of(pre.p, pre.len, &v->pre, &v->add_bos))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tokenizer.ggml.pre %.*s: writing its tokenizer.json is not supported",
                         g->path, (int)(pre.len > 40 ? 40 : pre.len), pre.p);
    if (gguf_get_str_array(g, "tokenizer.ggml.tokens", 1u << 22, &v->toks, &v->tl, &v->nt, st) != 1 ||
        gguf_get_str_array(g, "tokenizer.ggml.merges", 1u << 23, &v->merges, &v->ml, &v->nm, st) != 1 ||
        gguf_get_i32_array(g, "tokenizer.ggml.token_type", 1u << 22, &v->types, &v->ntypes, st) < 0)
        return st->code ? st->code : llmi_fail(st, LLMI_E_RUNTIME, "%s: no tokenizer vocabulary or merges", g->path);
    return 0;
}

/* added_tokens: the control (special) and user-defined (normalized) tokens. */
static cJSON *qw_added_tokens(const qw_vocab *v) {
    cJSON *added = cJSON_CreateArray();
    for (uint64_t i = 0; v->types && i < v->nt && i < v->ntypes; i++) {
        if (v->types[i] != 3 && v->types[i] != 4) continue; /* control and user-defined tokens */
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", (double)i);
        char *s = qw_strndup(v->toks[i], v->tl[i]);
        cJSON_AddStringToObject(a, "content", s ? s : "");
        free(s);
        cJSON_AddBoolToObject(a, "single_word", false);
        cJSON_AddBoolToObject(a, "lstrip", false);
        cJSON_AddBoolToObject(a, "rstrip", false);
        cJSON_AddBoolToObject(a, "normalized", v->types[i] == 4);
        cJSON_AddBoolToObject(a, "special", v->types[i] == 3);
        cJSON_AddItemToArray(added, a);
    }
    return added;
}

/* The pre_tokenizer of a kind, in tokenizer.json's terms. */
static cJSON *qw_pre_tokenizer(tok_pre_kind kind) {
    cJSON *pt = cJSON_CreateObject(), *list;
    cJSON_AddStringToObject(pt, "type", "Sequence");
    list = cJSON_AddArrayToObject(pt, "pretokenizers");
    if (kind == TOK_PRE_SMOLLM) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "type", "Digits");
        cJSON_AddBoolToObject(d, "individual_digits", true);
        cJSON_AddItemToArray(list, d);
        cJSON_AddItemToArray(list, qw_bytelevel(false, true, true));
    } else if (kind == TOK_PRE_GPT2) {
        cJSON_AddItemToArray(list, qw_bytelevel(false, true, true));
    } else {
        cJSON_AddItemToArray(list, qw_split(tok_pre_regex(kind)));
        cJSON_AddItemToArray(list, qw_bytelevel(false, true, false));
    }
    return pt;
}

/* model: a BPE over the GGUF vocabulary and merges (as [a, b] pairs). */
static cJSON *qw_bpe_model(const qw_vocab *v, const char *gguf_path, llmi_status *st) {
    cJSON *mo = cJSON_CreateObject();
    cJSON_AddStringToObject(mo, "type", "BPE");
    cJSON_AddNullToObject(mo, "dropout");
    cJSON_AddNullToObject(mo, "unk_token");
    cJSON_AddNullToObject(mo, "continuing_subword_prefix");
    cJSON_AddNullToObject(mo, "end_of_word_suffix");
    cJSON_AddBoolToObject(mo, "fuse_unk", false);
    cJSON_AddBoolToObject(mo, "byte_fallback", false);
    cJSON_AddBoolToObject(mo, "ignore_merges", tok_pre_ignores_merges(v->pre));
    cJSON *vocab = cJSON_AddObjectToObject(mo, "vocab");
    for (uint64_t i = 0; i < v->nt; i++) {
        char *s = qw_strndup(v->toks[i], v->tl[i]);
        if (!s) { cJSON_Delete(mo); llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory"); return NULL; }
        cJSON_AddItemToObject(vocab, s, cJSON_CreateNumber((double)i));
        free(s);
    }
    cJSON *mg = cJSON_AddArrayToObject(mo, "merges");
    for (uint64_t i = 0; i < v->nm; i++) {
        const char *sp = memchr(v->merges[i], ' ', v->ml[i]);
        if (!sp) {
            cJSON_Delete(mo);
            llmi_fail(st, LLMI_E_RUNTIME, "%s: merge %llu has no space", gguf_path, (unsigned long long)i);
            return NULL;
        }
        char *a = qw_strndup(v->merges[i], (size_t)(sp - v->merges[i]));
        char *b = qw_strndup(sp + 1, v->ml[i] - (size_t)(sp - v->merges[i]) - 1);
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(a ? a : ""));
        cJSON_AddItemToArray(pair, cJSON_CreateString(b ? b : ""));
        cJSON_AddItemToArray(mg, pair);
        free(a), free(b);
    }
    return mo;
}

/* tokenizer.json: the same tokenizer as the GGUF's, for byte-level BPE. */
static cJSON *qw_tokenizer_json(const qw_vocab *v, const char *gguf_path, llmi_status *st) {
    cJSON *pt = qw_pre_tokenizer(v->pre), *mo = NULL;
    if (!(mo = qw_bpe_model(v, gguf_path, st))) {
        cJSON_Delete(pt);
        return NULL;
    }
    cJSON *tj = cJSON_CreateObject();
    cJSON_AddStringToObject(tj, "version", "1.0");
    cJSON_AddNullToObject(tj, "truncation");
    cJSON_AddNullToObject(tj, "padding");
    cJSON_AddItemToObject(tj, "added_tokens", qw_added_tokens(v));
    if (v->pre == TOK_PRE_QWEN2) {
        cJSON *n = cJSON_CreateObject();
        cJSON_AddStringToObject(n, "type", "NFC");
        cJSON_AddItemToObject(tj, "normalizer", n);
    } else {
        cJSON_AddNullToObject(tj, "normalizer");
    }
    cJSON_AddItemToObject(tj, "pre_tokenizer", pt);
    cJSON_AddItemToObject(tj, "post_processor", qw_bytelevel(true, false, true));
    cJSON_AddItemToObject(tj, "decoder", qw_bytelevel(true, true, true));
    cJSON_AddItemToObject(tj, "model", mo);
    return tj;
}

/* tokenizer_config.json: special tokens by name, add_bos, the chat template. */
static cJSON *qw_tokenizer_config(const gguf_file *g, const qw_vocab *v, int64_t bos, int64_t eos, bool add_bos) {
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddBoolToObject(cfg, "add_bos_token", add_bos);
    cJSON_AddBoolToObject(cfg, "add_prefix_space", false);
    if (bos >= 0) {
        char *s = qw_strndup(v->toks[bos], v->tl[bos]);
        cJSON_AddStringToObject(cfg, "bos_token", s ? s : "");
        free(s);
    }
    if (eos >= 0) {
        char *s = qw_strndup(v->toks[eos], v->tl[eos]);
        cJSON_AddStringToObject(cfg, "eos_token", s ? s : "");
        free(s);
    }
    gguf_str tmpl = {0};
    llmi_status ignore = {0};   /* a template that does not read is left out, as before */
    if (gguf_get_str(g, "tokenizer.chat_template", &tmpl, &ignore) == 1) {
        char *s = qw_strndup(tmpl.p, tmpl.len);
        cJSON_AddStringToObject(cfg, "chat_template", s ? s : "");
        free(s);
    }
    cJSON_AddBoolToObject(cfg, "clean_up_tokenization_spaces", false);
    cJSON_AddStringToObject(cfg, "tokenizer_class", "GPT2Tokenizer");
    return cfg;
}

int quant_write_gguf_tokenizer(const char *gguf_path, const char *dir, llmi_status *st) {
    gguf_file g;
    if (gguf_open(gguf_path, &g, st)) return st->code;
    qw_vocab v;
    memset(&v, 0, sizeof v);
    cJSON *tj = NULL, *cfg = NULL;
    char path[4096];
    int64_t bos = -1, eos = -1;
    int rc = qw_vocab_read(&g, &v, st);
    bool add_bos = v.add_bos;   /* the file's add_bos_token, else the pre name's default (as tok_gguf) */
    if (!rc && !(tj = qw_tokenizer_json(&v, gguf_path, st))) rc = st->code;
    if (!rc) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        rc = qw_write_json(path, tj, st);
    }
    if (!rc && (gguf_get_int(&g, "tokenizer.ggml.bos_token_id", 0, (int64_t)v.nt - 1, &bos, st) < 0 ||
                gguf_get_int(&g, "tokenizer.ggml.eos_token_id", 0, (int64_t)v.nt - 1, &eos, st) < 0 ||
                gguf_get_bool(&g, "tokenizer.ggml.add_bos_token", &add_bos, st) < 0))
        rc = st->code;
    if (!rc) {
        cfg = qw_tokenizer_config(&g, &v, bos, eos, add_bos);
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        rc = qw_write_json(path, cfg, st);
        cJSON_Delete(cfg);
    }
    if (!rc) {
        cfg = cJSON_CreateObject();   /* generation_config.json */
        if (bos >= 0) cJSON_AddNumberToObject(cfg, "bos_token_id", (double)bos);
        if (eos >= 0) cJSON_AddNumberToObject(cfg, "eos_token_id", (double)eos);
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        rc = qw_write_json(path, cfg, st);
        cJSON_Delete(cfg);
    }
    cJSON_Delete(tj);
    qw_vocab_free(&v);
    gguf_close(&g);
    return rc;
}

/* ---- the directory ---------------------------------------------------------------------- */
static int qw_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int quant_rmtree(const char *dir) { return nftw(dir, qw_rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int quant_check_outdir(const char *out, bool force, llmi_status *st) {
    struct stat sb;
    if (lstat(out, &sb) == 0 && !force)
        return llmi_fail(st, LLMI_E_USAGE, "-o %s: output directory exists (use --force to replace it)", out);
    return 0;
}

void quant_writer_abort(quant_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp[0]) quant_rmtree(w->tmp);
    free(w->e), free(w->layer_first), free(w);
}

/* config.json, quantize_config.json and the tokenizer files into tmp. */
static int qw_side_files(const quant_writer *w, const quant_opts *o, const char *input, llmi_status *st) {
    char path[4096];
    struct stat sb;
    cJSON *cfg = NULL;
    int rc = 0;
    bool in_dir = stat(input, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (in_dir) {
        snprintf(path, sizeof path, "%s/config.json", input);
        rc = qw_read_json(path, &cfg, st);
        if (!rc) cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    } else {
        cfg = qw_config_from_model(w->m);
    }
    if (!rc) {
        cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
        cJSON_AddStringToObject(cfg, "torch_dtype", "float16");
        cJSON_AddItemToObject(cfg, "quantization_config", qw_quant_config(o, false));
        snprintf(path, sizeof path, "%s/config.json", w->tmp);
        rc = qw_write_json(path, cfg, st);
    }
    cJSON_Delete(cfg);
    if (!rc && o->method != QUANT_AWQ) {
        cJSON *q = qw_quant_config(o, true);
        snprintf(path, sizeof path, "%s/quantize_config.json", w->tmp);
        rc = qw_write_json(path, q, st);
        cJSON_Delete(q);
    }
    if (!rc && in_dir) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                            "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model"};
        for (size_t i = 0; i < sizeof files / sizeof *files && !rc; i++) {
            snprintf(path, sizeof path, "%s/%s", input, files[i]);
            if (stat(path, &sb) != 0) continue;
            char dst[4096];
            snprintf(dst, sizeof dst, "%s/%s", w->tmp, files[i]);
            rc = qw_copy_file(path, dst, st);
        }
    } else if (!rc && strcmp(w->m->format, "gguf") == 0) {
        rc = quant_write_gguf_tokenizer(input, w->tmp, st);
    }
    return rc;
}

int quant_writer_open(quant_writer **out_w, const char *out, bool force, const llmi_model *m, const quant_opts *o,
                      const char *input, llmi_status *st) {
    *out_w = NULL;
    if (quant_check_outdir(out, force, st)) return st->code;
    size_t ol = strlen(out);
    while (ol > 1 && out[ol - 1] == '/') ol--;
    if (ol > 1500) return llmi_fail(st, LLMI_E_USAGE, "-o: path longer than 1500 bytes");
    quant_writer *w = calloc(1, sizeof *w);
    if (!w) return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory");
    w->m = m, w->method = o->method, w->group_size = o->group_size, w->fd = -1;
    snprintf(w->out, sizeof w->out, "%.*s", (int)ol, out);
    snprintf(w->tmp, sizeof w->tmp, "%.*s.partXXXXXX", (int)ol, out);
    if (!mkdtemp(w->tmp)) {
        int e = errno;
        w->tmp[0] = '\0';
        quant_writer_abort(w);
        return llmi_fail(st, LLMI_E_RUNTIME, "-o %s: cannot create %.*s.partXXXXXX: %s", out, (int)ol, out, strerror(e));
    }
    chmod(w->tmp, 0755); /* mkdtemp makes it private; the result is an ordinary model directory */
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", w->tmp);
    int rc = qw_plan(w, st);
    if (!rc && (w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644)) < 0)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot create: %s", path, strerror(errno));
    if (!rc) rc = qw_write_header(w, path, st);
    /* what does not depend on the quantization goes first: a bad input fails before the run */
    if (!rc) rc = qw_side_files(w, o, input, st);
    if (!rc) rc = qw_f16_mat(w, qw_find(w, 0, "model.embed_tokens.weight"), &m->tok_embd, st);
    if (!rc && !m->cfg.tie_embeddings) rc = qw_f16_mat(w, qw_find(w, 0, "lm_head.weight"), &m->lm_head, st);
    if (!rc) rc = qw_f16_vec(w, qw_find(w, 0, "model.norm.weight"), m->out_norm, st);
    if (rc) {
        quant_writer_abort(w);
        return rc;
    }
    *out_w = w;
    return 0;
}

int quant_writer_finish(quant_writer *w, llmi_status *st) {
    int rc = 0;
    if (fsync(w->fd) != 0 || close(w->fd) != 0)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s/model.safetensors: write failed: %s", w->tmp, strerror(errno));
    w->fd = -1;
    if (!rc) {
        struct stat sb;
        char old[2100];
        bool replacing = lstat(w->out, &sb) == 0;
        snprintf(old, sizeof old, "%s.oldXXXXXX", w->out);
        if (replacing && (!mkdtemp(old) || rename(w->out, old) != 0)) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "-o %s: cannot move the old directory aside: %s", w->out, strerror(errno));
        } else if (rename(w->tmp, w->out) != 0) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "-o %s: cannot rename %s into place: %s", w->out, w->tmp,
                           strerror(errno));
            if (replacing) rename(old, w->out);
        } else {
            w->tmp[0] = '\0';   /* renamed: nothing to remove */
            if (replacing) quant_rmtree(old);
        }
    }
    quant_writer_abort(w);
    return rc;
}

int quant_write_hf(const char *out, bool force, const llmi_model *m, const quant_result *r, const quant_opts *o,
                   const char *input, llmi_status *st) {
    quant_writer *w;
    if (quant_writer_open(&w, out, force, m, o, input, st)) return st->code;
    for (int l = 0; l < r->n_layers; l++) {
        /* the writer only reads: a block that borrows the result's vectors */
        quant_block b = {.attn_norm = r->attn_norm[l], .ffn_norm = r->ffn_norm[l], .bq = r->bias[0][l],
                         .bk = r->bias[1][l], .bv = r->bias[2][l]};
        if (quant_writer_layer(w, l, r->grids[l], &b, st)) {
            quant_writer_abort(w);
            return st->code;
        }
    }
    return quant_writer_finish(w, st);
}
