/* model_hf.c — the Hugging Face directory loader behind model.h: config.json (with a
 * GPTQ/AWQ quantization_config), one model.safetensors or the shards a
 * model.safetensors.index.json lists (every tensor in exactly one shard), the weights by
 * their transformers names, and tokenizer.json.  Errors name the file. */
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "model/safetensors.h"
#include "tok/tokenizer.h"

#define HF_MAX_JSON     (64u << 20)   /* config.json / index.json larger than this are not real */

static const char *const hf_names[W_COUNT] = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias", "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias", "model.layers.%d.self_attn.o_proj.bias",
    "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight",
};

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
    *out = model_to_f32(j->valuedouble);
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
    model_set_name(m->cfg.name, sizeof m->cfg.name, dir);
    hf_ctx *h = calloc(1, sizeof *h);
    if (!h) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", dir);
    h->dir = dir;
    weight_src w = {hf_names, dir, h, hf_find_src, quantized ? &qc : NULL, hf_find_st};
    if (hf_open_shards(dir, h, st)) goto fail;
    if (!m->cfg.tie_embeddings) {
        /* an untied config without lm_head would leave the output layer undefined */
        src_tensor t;
        char name[128];
        int rc = model_find_role(&w, W_LM_HEAD, -1, &t, name, sizeof name, st);
        if (rc < 0) goto fail;
        if (rc == 0) { llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor lm_head.weight (tie_word_embeddings is false)", dir); goto fail; }
    }
    if (model_bind_weights(&w, m, false, st)) goto fail;
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
        llmi_status tst = {0};
        if (model_tok_check(m, tok_load_hf(dir, &m->tok, &tst), &tst, dir, st)) goto fail;
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
