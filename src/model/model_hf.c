/* model_hf.c — the Hugging Face directory loader behind model.h: config.json (with a
 * GPTQ/AWQ quantization_config), one model.safetensors or the shards a
 * model.safetensors.index.json lists (every tensor in exactly one shard), the weights by
 * their transformers names, and tokenizer.json.  Errors name the file. */
#include "model/model_internal.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fileio.h"
#include "model/config_json.h"
#include "model/safetensors.h"
#include "tok/tokenizer.h"

#define HF_MAX_JSON     (64u << 20)   /* an index.json larger than this is not real */

static const char *const hf_names[W_COUNT] = {
    "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", "model.layers.%d.input_layernorm.weight",
    "model.layers.%d.self_attn.q_proj.weight", "model.layers.%d.self_attn.k_proj.weight",
    "model.layers.%d.self_attn.v_proj.weight", "model.layers.%d.self_attn.o_proj.weight",
    "model.layers.%d.self_attn.q_proj.bias", "model.layers.%d.self_attn.k_proj.bias",
    "model.layers.%d.self_attn.v_proj.bias", "model.layers.%d.self_attn.o_proj.bias",
    "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.mlp.gate_proj.weight",
    "model.layers.%d.mlp.up_proj.weight", "model.layers.%d.mlp.down_proj.weight",
    "model.layers.%d.self_attn.q_norm.weight", "model.layers.%d.self_attn.k_norm.weight",
    "model.layers.%d.post_attention_layernorm.weight", "model.layers.%d.post_feedforward_layernorm.weight",
    "model.layers.%d.mlp.gate.weight", NULL, NULL, NULL,   /* Qwen3-MoE's router; experts one tensor each: */
    "model.layers.%d.mlp.experts.%d.gate_proj.weight", "model.layers.%d.mlp.experts.%d.up_proj.weight",
    "model.layers.%d.mlp.experts.%d.down_proj.weight",
    "model.layers.%d.self_attn.qkv_proj.weight", "model.layers.%d.mlp.gate_up_proj.weight", NULL,
};
/* Mixtral's names for its router and experts (w1 gate, w3 up, w2 down) */
static const char *const hf_mixtral_moe_names[4] = {
    "model.layers.%d.block_sparse_moe.gate.weight", "model.layers.%d.block_sparse_moe.experts.%d.w1.weight",
    "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", "model.layers.%d.block_sparse_moe.experts.%d.w2.weight",
};
/* GraniteMoe's router and experts (JetMoe's parallel experts): gate|up of every expert in
 * one input_linear (n_exp, 2 ffn, dim), down in one output_linear (n_exp, dim, ffn) */
static const char *const hf_granitemoe_names[3] = {
    "model.layers.%d.block_sparse_moe.router.layer.weight", "model.layers.%d.block_sparse_moe.input_linear.weight",
    "model.layers.%d.block_sparse_moe.output_linear.weight",
};
/* Llama's post_attention_layernorm is its MLP input's norm (W_FFN_NORM); Gemma 3 names its
 * norms by place: post_attention_layernorm is the attention output's (W_POST_ATTN_NORM, read
 * only with post_norms), the MLP input's is pre_feedforward_layernorm. */
#define HF_GEMMA_FFN_NORM "model.layers.%d.pre_feedforward_layernorm.weight"

/* Reads config.json: the hyper-parameters (config_json_read, validated), then a GPTQ/AWQ
 * quantization_config when the checkpoint has one. */
static int hf_config(const char *file, llmi_config *c, quant_config *qc, bool *quantized, llmi_status *st) {
    cJSON *j;
    if (config_json_read(file, NULL, c, &j, st)) return LLMI_E_RUNTIME;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    *quantized = q && !cJSON_IsNull(q);
    int rc = *quantized ? quant_config_parse(q, qc, file, st) : 0;
    cJSON_Delete(j);
    return rc ? LLMI_E_RUNTIME : 0;
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
    const bool gemma = config_is_gemma(&m->cfg);
    const char *names[W_COUNT];
    memcpy(names, hf_names, sizeof names);
    if (gemma) names[W_FFN_NORM] = HF_GEMMA_FFN_NORM;
    if (m->cfg.n_experts > 0 && strcmp(m->cfg.arch_name, "granitemoe") == 0) {
        names[W_ROUTER] = hf_granitemoe_names[0];
        names[W_GATE_UP_EXPS] = hf_granitemoe_names[1];
        names[W_DOWN_EXPS] = hf_granitemoe_names[2];
    } else if (m->cfg.n_experts > 0 && m->cfg.arch == LLMI_ARCH_LLAMA) {
        names[W_ROUTER] = hf_mixtral_moe_names[0];
        names[W_GATE_EXP] = hf_mixtral_moe_names[1];
        names[W_UP_EXP] = hf_mixtral_moe_names[2];
        names[W_DOWN_EXP] = hf_mixtral_moe_names[3];
    }
    weight_src w = {names, dir, h, hf_find_src, quantized ? &qc : NULL, hf_find_st,
                    gemma ? 1.0f : 0.0f};   /* Gemma's norms multiply by 1 + w */
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
