/* model_dummy.c — synthetic weights for `--dummy` (like vLLM's dummy load format):
 * the shapes and dtypes of a real model from a built-in preset or a config.json, values
 * from a counter-based hash so any tensor element is reproducible without state.
 *
 * Every weight matrix lives in one anonymous mapping registered in m->maps, so model_free
 * releases it like a mmap'ed file; tensors own nothing (owned == NULL).  Values are
 * uniform in +-1/sqrt(cols) (a Kaiming-like init: each linear keeps activations O(1)),
 * norm weights are 1 and biases small, so a forward stays finite at any depth. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/mman.h>
#include "model/config_json.h"
#include "model/model_dummy.h"

typedef struct dummy_preset {
    const char *name;
    llmi_config cfg;
} dummy_preset;

/* Published hyper-parameters (the models' Hugging Face config.json files). */
static const dummy_preset k_presets[] = {
    {"smollm2-135m", {.arch = LLMI_ARCH_LLAMA, .arch_name = "llama", .n_vocab = 49152, .dim = 576, .n_layers = 30,
                      .n_heads = 9, .n_kv_heads = 3, .head_dim = 64, .ffn_dim = 1536, .max_ctx = 8192,
                      .norm_eps = 1e-5f, .rope_theta = 100000.f, .rope_dim = 64, .tie_embeddings = true}},
    {"smollm2-360m", {.arch = LLMI_ARCH_LLAMA, .arch_name = "llama", .n_vocab = 49152, .dim = 960, .n_layers = 32,
                      .n_heads = 15, .n_kv_heads = 5, .head_dim = 64, .ffn_dim = 2560, .max_ctx = 8192,
                      .norm_eps = 1e-5f, .rope_theta = 100000.f, .rope_dim = 64, .tie_embeddings = true}},
    {"tinyllama-1.1b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "llama", .n_vocab = 32000, .dim = 2048, .n_layers = 22,
                        .n_heads = 32, .n_kv_heads = 4, .head_dim = 64, .ffn_dim = 5632, .max_ctx = 2048,
                        .norm_eps = 1e-5f, .rope_theta = 10000.f, .rope_dim = 64}},
    {"llama-3.2-1b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "llama", .n_vocab = 128256, .dim = 2048, .n_layers = 16,
                      .n_heads = 32, .n_kv_heads = 8, .head_dim = 64, .ffn_dim = 8192, .max_ctx = 131072,
                      .norm_eps = 1e-5f, .rope_theta = 500000.f, .rope_dim = 64,
                      .rope_scaling = LLMI_ROPE_SCALING_LLAMA3, .rope_factor = 32.f, .rope_low_freq_factor = 1.f,
                      .rope_high_freq_factor = 4.f, .rope_orig_max_pos = 8192, .tie_embeddings = true}},
    {"llama-2-7b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "llama", .n_vocab = 32000, .dim = 4096, .n_layers = 32,
                    .n_heads = 32, .n_kv_heads = 32, .head_dim = 128, .ffn_dim = 11008, .max_ctx = 4096,
                    .norm_eps = 1e-5f, .rope_theta = 10000.f, .rope_dim = 128}},
    {"llama-3-8b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "llama", .n_vocab = 128256, .dim = 4096, .n_layers = 32,
                    .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .ffn_dim = 14336, .max_ctx = 8192,
                    .norm_eps = 1e-5f, .rope_theta = 500000.f, .rope_dim = 128}},
    {"mistral-7b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "mistral", .n_vocab = 32000, .dim = 4096, .n_layers = 32,
                    .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .ffn_dim = 14336, .max_ctx = 32768,
                    .norm_eps = 1e-5f, .rope_theta = 10000.f, .rope_dim = 128}},
    {"qwen2.5-7b", {.arch = LLMI_ARCH_QWEN2, .arch_name = "qwen2", .n_vocab = 152064, .dim = 3584, .n_layers = 28,
                    .n_heads = 28, .n_kv_heads = 4, .head_dim = 128, .ffn_dim = 18944, .max_ctx = 131072,
                    .norm_eps = 1e-6f, .rope_theta = 1000000.f, .rope_dim = 128, .qkv_bias = true}},
    {"qwen3-0.6b", {.arch = LLMI_ARCH_QWEN3, .arch_name = "qwen3", .n_vocab = 151936, .dim = 1024, .n_layers = 28,
                    .n_heads = 16, .n_kv_heads = 8, .head_dim = 128, .ffn_dim = 3072, .max_ctx = 40960,
                    .norm_eps = 1e-6f, .rope_theta = 1000000.f, .rope_dim = 128, .tie_embeddings = true,
                    .qk_norm = true}},
    {"qwen3-8b", {.arch = LLMI_ARCH_QWEN3, .arch_name = "qwen3", .n_vocab = 151936, .dim = 4096, .n_layers = 36,
                  .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .ffn_dim = 12288, .max_ctx = 40960,
                  .norm_eps = 1e-6f, .rope_theta = 1000000.f, .rope_dim = 128, .qk_norm = true}},
    /* HuggingFaceTB/SmolLM3-3B: llama's layers, every 4th without RoPE (set by
     * model_dummy_config) */
    {"smollm3-3b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "smollm3", .n_vocab = 128256, .dim = 2048, .n_layers = 36,
                    .n_heads = 16, .n_kv_heads = 4, .head_dim = 128, .ffn_dim = 11008, .max_ctx = 65536,
                    .norm_eps = 1e-6f, .rope_theta = 5000000.f, .rope_dim = 128, .tie_embeddings = true}},
    /* ibm-granite/granite-3.3-2b-instruct and -8b-instruct: llama's layers and Granite's
     * multipliers (embeddings x12, q.k x1/128 or x1/64, residual x0.22, logits /8 or /16) */
    {"granite-3.3-2b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "granite", .n_vocab = 49159, .dim = 2048, .n_layers = 40,
                        .n_heads = 32, .n_kv_heads = 8, .head_dim = 64, .ffn_dim = 8192, .max_ctx = 131072,
                        .norm_eps = 1e-5f, .rope_theta = 10000000.f, .rope_dim = 64, .tie_embeddings = true,
                        .embed_scale = 12.f, .attn_scale = 0.015625f, .residual_scale = 0.22f, .logit_scale = 8.f}},
    {"granite-3.3-8b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "granite", .n_vocab = 49159, .dim = 4096, .n_layers = 40,
                        .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .ffn_dim = 12800, .max_ctx = 131072,
                        .norm_eps = 1e-5f, .rope_theta = 10000000.f, .rope_dim = 128, .tie_embeddings = true,
                        .embed_scale = 12.f, .attn_scale = 0.0078125f, .residual_scale = 0.22f, .logit_scale = 16.f}},
    /* microsoft/Phi-3-mini-4k-instruct (a 2047-key window on every layer) and microsoft/phi-4;
     * llama's layers (the checkpoints' fused projections are a storage matter) */
    {"phi-3-mini", {.arch = LLMI_ARCH_PHI3, .arch_name = "phi3", .n_vocab = 32064, .dim = 3072, .n_layers = 32,
                    .n_heads = 32, .n_kv_heads = 32, .head_dim = 96, .ffn_dim = 8192, .max_ctx = 4096,
                    .norm_eps = 1e-5f, .rope_theta = 10000.f, .rope_dim = 96, .sliding_window = 2047}},
    {"phi-4", {.arch = LLMI_ARCH_PHI3, .arch_name = "phi3", .n_vocab = 100352, .dim = 5120, .n_layers = 40,
               .n_heads = 40, .n_kv_heads = 10, .head_dim = 128, .ffn_dim = 17920, .max_ctx = 16384,
               .norm_eps = 1e-5f, .rope_theta = 250000.f, .rope_dim = 128}},
    /* microsoft/Phi-4-mini-instruct: 96 of each head's 128 values rotated; its longrope factors
     * (48 published numbers each, which move RoPE angles, not cost) are left out */
    {"phi-4-mini", {.arch = LLMI_ARCH_PHI3, .arch_name = "phi3", .n_vocab = 200064, .dim = 3072, .n_layers = 32,
                    .n_heads = 24, .n_kv_heads = 8, .head_dim = 128, .ffn_dim = 8192, .max_ctx = 131072,
                    .norm_eps = 1e-5f, .rope_theta = 10000.f, .rope_dim = 96, .tie_embeddings = true}},
    /* google/gemma-2-2b-it and -9b-it; their sliding layers and embedding scale are set by
     * model_dummy_config */
    {"gemma-2-2b", {.arch = LLMI_ARCH_GEMMA2, .arch_name = "gemma2", .n_vocab = 256000, .dim = 2304,
                    .n_layers = 26, .n_heads = 8, .n_kv_heads = 4, .head_dim = 256, .ffn_dim = 9216, .max_ctx = 8192,
                    .norm_eps = 1e-6f, .rope_theta = 10000.f, .rope_dim = 256, .tie_embeddings = true,
                    .act = LLMI_ACT_GELU_TANH, .attn_scale = 0.0625f, .post_norms = true, .sliding_window = 4096,
                    .attn_softcap = 50.f, .final_softcap = 30.f}},
    {"gemma-2-9b", {.arch = LLMI_ARCH_GEMMA2, .arch_name = "gemma2", .n_vocab = 256000, .dim = 3584,
                    .n_layers = 42, .n_heads = 16, .n_kv_heads = 8, .head_dim = 256, .ffn_dim = 14336, .max_ctx = 8192,
                    .norm_eps = 1e-6f, .rope_theta = 10000.f, .rope_dim = 256, .tie_embeddings = true,
                    .act = LLMI_ACT_GELU_TANH, .attn_scale = 0.0625f, .post_norms = true, .sliding_window = 4096,
                    .attn_softcap = 50.f, .final_softcap = 30.f}},
    /* google/gemma-3-1b-it and -4b-it (its text model); their sliding layers and embedding scale are
     * set by model_dummy_config */
    {"gemma-3-1b", {.arch = LLMI_ARCH_GEMMA3, .arch_name = "gemma3_text", .n_vocab = 262144, .dim = 1152,
                    .n_layers = 26, .n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .ffn_dim = 6912, .max_ctx = 32768,
                    .norm_eps = 1e-6f, .rope_theta = 1000000.f, .rope_dim = 256, .tie_embeddings = true,
                    .qk_norm = true, .act = LLMI_ACT_GELU_TANH, .attn_scale = 0.0625f, .post_norms = true,
                    .sliding_window = 512, .rope_theta_local = 10000.f}},
    {"gemma-3-4b", {.arch = LLMI_ARCH_GEMMA3, .arch_name = "gemma3_text", .n_vocab = 262208, .dim = 2560,
                    .n_layers = 34, .n_heads = 8, .n_kv_heads = 4, .head_dim = 256, .ffn_dim = 10240, .max_ctx = 131072,
                    .norm_eps = 1e-6f, .rope_theta = 1000000.f, .rope_dim = 256, .tie_embeddings = true,
                    .rope_scaling = LLMI_ROPE_SCALING_LINEAR, .rope_factor = 8.f,
                    .qk_norm = true, .act = LLMI_ACT_GELU_TANH, .attn_scale = 0.0625f, .post_norms = true,
                    .sliding_window = 1024, .rope_theta_local = 10000.f}},
    /* Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1: mixtures of experts */
    {"qwen3-30b-a3b", {.arch = LLMI_ARCH_QWEN3, .arch_name = "qwen3_moe", .n_vocab = 151936, .dim = 2048,
                       .n_layers = 48, .n_heads = 32, .n_kv_heads = 4, .head_dim = 128, .ffn_dim = 768,
                       .max_ctx = 40960, .norm_eps = 1e-6f, .rope_theta = 1000000.f, .rope_dim = 128, .qk_norm = true,
                       .n_experts = 128, .n_experts_used = 8, .moe_norm_topk = true}},
    /* ibm-granite/granite-3.1-3b-a800m-instruct's shapes: 40 experts of 512, top-8; rms_norm_eps
     * and Granite's multipliers (which move no cost) left at GraniteMoeConfig's defaults */
    {"granite-3.1-3b-a800m", {.arch = LLMI_ARCH_LLAMA, .arch_name = "granitemoe", .n_vocab = 49155, .dim = 1536,
                              .n_layers = 32, .n_heads = 24, .n_kv_heads = 8, .head_dim = 64, .ffn_dim = 512,
                              .max_ctx = 131072, .norm_eps = 1e-6f, .rope_theta = 10000000.f, .rope_dim = 64,
                              .tie_embeddings = true, .attn_scale = 1.0f, .n_experts = 40, .n_experts_used = 8,
                              .moe_norm_topk = true}},
    {"mixtral-8x7b", {.arch = LLMI_ARCH_LLAMA, .arch_name = "mixtral", .n_vocab = 32000, .dim = 4096, .n_layers = 32,
                      .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .ffn_dim = 14336, .max_ctx = 32768,
                      .norm_eps = 1e-5f, .rope_theta = 1000000.f, .rope_dim = 128, .n_experts = 8,
                      .n_experts_used = 2, .moe_norm_topk = true}},
};
#define N_PRESETS ((int)(sizeof k_presets / sizeof k_presets[0]))

const char *model_dummy_preset_names(void) {
    return "smollm2-135m, smollm2-360m, tinyllama-1.1b, llama-3.2-1b, llama-2-7b, llama-3-8b, mistral-7b, "
           "qwen2.5-7b, qwen3-0.6b, qwen3-8b, smollm3-3b, granite-3.3-2b, granite-3.3-8b, phi-3-mini, phi-4, phi-4-mini, gemma-2-2b, gemma-2-9b, gemma-3-1b, gemma-3-4b, "
           "qwen3-30b-a3b, granite-3.1-3b-a800m, mixtral-8x7b";
}

/* ---------------------------------------------------------------- config.json */

/* The shapes a config.json describes, read as a model directory's would be; the name
 * is the one the file gives itself (_name_or_path), else the path. */
static int dummy_config_from_json(const char *path, llmi_config *c, llmi_status *st) {
    cJSON *root;
    if (config_json_read(path, "--dummy", c, &root, st)) return st->code;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "_name_or_path");
    snprintf(c->name, sizeof c->name, "%s", cJSON_IsString(nm) && nm->valuestring[0] ? nm->valuestring : path);
    cJSON_Delete(root);
    return 0;
}

/* Bounds of its own, so a dummy model never depends on another loader being strict:
 * the weight-size arithmetic below must not overflow. */
static int dummy_check_config(const llmi_config *c, llmi_dtype dt, int group_size, const char *spec, llmi_status *st) {
    if (c->n_vocab < 1 || c->n_vocab > (1 << 22) || c->dim < 1 || c->dim > (1 << 16) || c->n_layers < 1 ||
        c->n_layers > LLMI_MAX_LAYERS || c->n_heads < 1 || c->n_heads > 1024 || c->n_kv_heads < 1 ||
        c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads || c->head_dim < 2 || c->head_dim > 1024 ||
        c->head_dim % 2 || c->ffn_dim < 1 || c->ffn_dim > (1 << 20) || c->max_ctx < 1)
        return llmi_fail(st, LLMI_E_RUNTIME,
                         "--dummy %s: inconsistent shapes (vocab %d, dim %d, layers %d, heads %d/%d, head_dim %d, "
                         "ffn %d, ctx %d)",
                         spec, c->n_vocab, c->dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim,
                         c->max_ctx);
    /* int4: every linear's input width a whole number of groups */
    int blk = dt == LLMI_I4G ? group_size : dtype_block_elems(dt);
    if (c->dim % blk || c->ffn_dim % blk || (c->n_heads * c->head_dim) % blk) {
        if (dt == LLMI_I4G)
            return llmi_fail(st, LLMI_E_USAGE,
                             "--dummy %s: dim %d, ffn %d and q width %d must be multiples of the int4 group size %d "
                             "(--dummy-dtype int4-gN)",
                             spec, c->dim, c->ffn_dim, c->n_heads * c->head_dim, blk);
        return llmi_fail(st, LLMI_E_RUNTIME,
                         "--dummy %s: dim %d, ffn %d and q width %d must be multiples of %d for --dummy-dtype %s", spec,
                         c->dim, c->ffn_dim, c->n_heads * c->head_dim, blk, dtype_name(dt));
    }
    return config_validate(c, spec, st);
}

/* ---------------------------------------------------------------- values */

/* splitmix64's finaliser: a bijective mix, so (tensor, counter) pairs never collide. */
static inline uint64_t dummy_hash(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Uniform in (-1, 1) from 16 random bits. */
static inline float dummy_unit16(uint64_t bits) { return ((float)(bits & 0xffff) + 0.5f) * (2.f / 65536.f) - 1.f; }

/* Fills rows x cols of dtype dt at dst with uniform +-scale values; the tensor's key
 * selects an independent stream. */
static void dummy_fill(void *dst, llmi_dtype dt, int64_t rows, int64_t cols, float scale, uint64_t key) {
    const int64_t n = rows * cols;
    const uint64_t base = dummy_hash(key) << 1;
    switch (dt) {
    case LLMI_F32: case LLMI_F16: case LLMI_BF16: {
        /* one hash gives four 16-bit draws */
        #pragma omp parallel for schedule(static)
        for (int64_t g = 0; g < (n + 3) / 4; g++) {
            uint64_t h = dummy_hash(base + (uint64_t)g);
            for (int j = 0; j < 4 && g * 4 + j < n; j++, h >>= 16) {
                float v = dummy_unit16(h) * scale;
                int64_t i = g * 4 + j;
                if (dt == LLMI_F32) ((float *)dst)[i] = v;
                else if (dt == LLMI_F16) ((uint16_t *)dst)[i] = f32_to_fp16(v);
                else ((uint16_t *)dst)[i] = f32_to_bf16(v);
            }
        }
        break;
    }
    case LLMI_Q8_0: case LLMI_Q4_0: case LLMI_Q4_1: {
        /* Random quants with a scale chosen so the dequantized range is +-scale: this is
         * what quantizing the float init would give, at a fraction of the cost. */
        const int64_t nblk = n / 32;
        const size_t bb = dtype_block_bytes(dt);
        const uint16_t d8 = f32_to_fp16(scale / 127.f), d40 = f32_to_fp16(scale / 8.f);
        const uint16_t d41 = f32_to_fp16(2.f * scale / 15.f), m41 = f32_to_fp16(-scale);
        #pragma omp parallel for schedule(static)
        for (int64_t b = 0; b < nblk; b++) {
            uint8_t *p = (uint8_t *)dst + (size_t)b * bb;
            uint64_t h[4];
            for (int j = 0; j < 4; j++) h[j] = dummy_hash(base + (uint64_t)b * 4 + (uint64_t)j);
            if (dt == LLMI_Q8_0) {
                memcpy(p, &d8, 2);
                uint8_t *q = p + 2;
                memcpy(q, h, 32);
                for (int j = 0; j < 32; j++) if (q[j] == 0x80) q[j] = 0x81;  /* keep within +-127 */
            } else if (dt == LLMI_Q4_0) {
                memcpy(p, &d40, 2);
                memcpy(p + 2, h, 16);
            } else {
                memcpy(p, &d41, 2);
                memcpy(p + 2, &m41, 2);
                memcpy(p + 4, h, 16);
            }
        }
        break;
    }
    default:
        break;
    }
}

/* Fills an int4 linear (LLMI_I4G, its pointers placed): random nibbles, and per (group,
 * row) an fp16 scale of 2 scale / 15 and a zero of 7 or 8, what round-to-nearest of
 * uniform +-scale values gives (GPTQ's and AWQ's asymmetric grid), so that the dequantized
 * range is about +-scale. */
static void dummy_fill_i4g(llmi_tensor *t, float scale, uint64_t key) {
    const uint64_t base = dummy_hash(key) << 1;
    const size_t n_bytes = t->row_bytes * (size_t)t->rows, n_par = (size_t)t->n_groups * (size_t)t->rows;
    uint8_t *q = (uint8_t *)t->data, *zeros = (uint8_t *)t->qzeros;
    uint16_t *scales = (uint16_t *)t->qscales;
    const uint16_t s16 = f32_to_fp16(2.f * scale / 15.f);
    #pragma omp parallel for schedule(static)
    for (size_t w = 0; w < (n_bytes + 7) / 8; w++) {
        uint64_t h = dummy_hash(base + w);
        for (size_t j = 0; j < 8 && w * 8 + j < n_bytes; j++, h >>= 8) q[w * 8 + j] = (uint8_t)h;
    }
    for (size_t i = 0; i < n_par; i++) {
        scales[i] = s16;
        zeros[i] = 7 + (uint8_t)(dummy_hash(base - 1 - i) & 1);
    }
}

/* ---------------------------------------------------------------- layout */

typedef struct dummy_layout {
    size_t off;       /* running offset into the mapping */
} dummy_layout;

static size_t dummy_take(dummy_layout *l, size_t bytes) {
    size_t at = (l->off + 63) & ~(size_t)63;  /* 64-byte alignment: a cache line, any SIMD width */
    l->off = at + bytes;
    return at;
}

/* A tensor of rows x cols in dt placed in the mapping; an int4 one (group_size > 0 with
 * LLMI_I4G) also gets its scales and zeros there, after its nibbles. */
static void dummy_tensor(llmi_tensor *t, llmi_dtype dt, int group_size, int64_t rows, int64_t cols, dummy_layout *l,
                         uint8_t *base) {
    t->dtype = dt;
    t->rows = rows;
    t->cols = cols;
    t->row_bytes = (size_t)(cols / dtype_block_elems(dt)) * dtype_block_bytes(dt);
    t->owned = NULL;
    size_t at = dummy_take(l, t->row_bytes * (size_t)rows);
    t->data = base ? base + at : NULL;
    if (dt != LLMI_I4G) return;
    t->group_size = group_size;
    t->n_groups = (int)(cols / group_size);
    t->g_idx = NULL;
    const size_t n_par = (size_t)t->n_groups * (size_t)rows;
    const size_t at_s = dummy_take(l, n_par * sizeof(uint16_t)), at_z = dummy_take(l, n_par);
    t->qscales = base ? (const uint16_t *)(base + at_s) : NULL;
    t->qzeros = base ? base + at_z : NULL;
}

/* Norm weights and biases are malloc'ed on their own: model_free() frees them one by one
 * (loaders convert them to f32 copies), while the mapping holds only the matrices. */
static float *dummy_vec(int64_t n, dummy_layout *l, uint8_t *base) {
    (void)l;
    return base ? malloc((size_t)n * sizeof(float)) : NULL;
}

/* Embeddings and lm_head of an int4 model stay bf16, as GPTQ and AWQ checkpoints keep them. */
static llmi_dtype dummy_embd_dtype(llmi_dtype dt) { return dt == LLMI_I4G ? LLMI_BF16 : dt; }

/* Lays out every tensor; with base == NULL it only measures the mapping's size. */
static void dummy_place(llmi_model *m, llmi_dtype dt, int gs, dummy_layout *l, uint8_t *base) {
    const llmi_config *c = &m->cfg;
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    l->off = 0;
    dummy_tensor(&m->tok_embd, dummy_embd_dtype(dt), 0, c->n_vocab, c->dim, l, base);
    for (int i = 0; i < c->n_layers; i++) {
        llmi_layer *L = &m->layers[i];
        L->attn_norm = dummy_vec(c->dim, l, base);
        dummy_tensor(&L->wq, dt, gs, qd, c->dim, l, base);
        dummy_tensor(&L->wk, dt, gs, kvd, c->dim, l, base);
        dummy_tensor(&L->wv, dt, gs, kvd, c->dim, l, base);
        dummy_tensor(&L->wo, dt, gs, c->dim, qd, l, base);
        if (c->qkv_bias) {
            L->bq = dummy_vec(qd, l, base);
            L->bk = dummy_vec(kvd, l, base);
            L->bv = dummy_vec(kvd, l, base);
        } else {
            L->bq = L->bk = L->bv = NULL;
        }
        L->q_norm = c->qk_norm ? dummy_vec(c->head_dim, l, base) : NULL;
        L->k_norm = c->qk_norm ? dummy_vec(c->head_dim, l, base) : NULL;
        L->ffn_norm = dummy_vec(c->dim, l, base);
        L->post_attn_norm = c->post_norms ? dummy_vec(c->dim, l, base) : NULL;
        L->post_ffn_norm = c->post_norms ? dummy_vec(c->dim, l, base) : NULL;
        const int64_t ne = config_experts(c);   /* a MoE layer's experts stacked */
        dummy_tensor(&L->w_gate, dt, gs, ne * c->ffn_dim, c->dim, l, base);
        dummy_tensor(&L->w_up, dt, gs, ne * c->ffn_dim, c->dim, l, base);
        dummy_tensor(&L->w_down, dt, gs, ne * c->dim, c->ffn_dim, l, base);
        if (c->n_experts > 0) dummy_tensor(&L->w_router, dummy_embd_dtype(dt), 0, c->n_experts, c->dim, l, base);
    }
    m->out_norm = dummy_vec(c->dim, l, base);
    if (c->tie_embeddings) m->lm_head = m->tok_embd;
    else dummy_tensor(&m->lm_head, dummy_embd_dtype(dt), 0, c->n_vocab, c->dim, l, base);
}

static size_t tensor_bytes(const llmi_tensor *t) { return t->row_bytes * (size_t)t->rows; }

int model_dummy_config(const char *spec, llmi_config *c, llmi_status *st) {
    if (!spec || !spec[0]) return llmi_fail(st, LLMI_E_USAGE, "--dummy: empty preset name");
    for (int i = 0; i < N_PRESETS; i++) {
        if (!strcmp(spec, k_presets[i].name)) {
            *c = k_presets[i].cfg;
            snprintf(c->name, sizeof c->name, "%s", k_presets[i].name);
            if (!strcmp(c->arch_name, "smollm3"))   /* SmolLM3Config's no_rope_layer_interval 4 */
                config_nope_every(c, 4);
            if (c->arch == LLMI_ARCH_PHI3)   /* Phi3Config's window covers every layer */
                for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = true;
            if (config_is_gemma(c)) {   /* Gemma 2: every 2nd layer global; Gemma 3: every 6th */
                const int period = c->arch == LLMI_ARCH_GEMMA3 ? 6 : 2;
                c->embed_scale = sqrtf((float)c->dim);
                for (int l = 0; l < c->n_layers; l++) c->layer_sliding[l] = (l + 1) % period != 0;
            }
            return 0;
        }
    }
    /* Anything that looks like a preset name, not a path, gets the list of presets. */
    if (!strchr(spec, '/') && !strstr(spec, ".json"))
        return llmi_fail(st, LLMI_E_USAGE, "--dummy %s: unknown preset (known: %s; or a config.json path)", spec,
                         model_dummy_preset_names());
    return dummy_config_from_json(spec, c, st);
}

int model_load_dummy(const char *spec, llmi_dtype dtype, int group_size, llmi_model *m, llmi_status *st) {
    memset(m, 0, sizeof *m);
    if (dtype != LLMI_F32 && dtype != LLMI_F16 && dtype != LLMI_BF16 && dtype != LLMI_Q8_0 && dtype != LLMI_Q4_0 &&
        dtype != LLMI_Q4_1 && dtype != LLMI_I4G)
        return llmi_fail(st, LLMI_E_USAGE,
                         "--dummy-dtype: synthetic weights come in f32, f16, bf16, q8_0, q4_0, q4_1, int4[-gN]");
    if (dtype == LLMI_I4G && group_size <= 0) group_size = 128;
    if (dtype == LLMI_I4G && (group_size < 2 || group_size % 2))
        return llmi_fail(st, LLMI_E_USAGE, "--dummy-dtype int4-g%d: the group size must be even", group_size);
    int rc = model_dummy_config(spec, &m->cfg, st);
    if (rc) return rc;
    if ((rc = dummy_check_config(&m->cfg, dtype, group_size, spec, st))) return rc;
    const llmi_config *c = &m->cfg;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return llmi_fail(st, LLMI_E_RUNTIME, "--dummy %s: out of memory", spec);

    dummy_layout l;
    dummy_place(m, dtype, group_size, &l, NULL);
    size_t total = l.off;
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        free(m->layers);
        m->layers = NULL;
        return llmi_fail(st, LLMI_E_RUNTIME, "--dummy %s: cannot allocate %.2f GiB of weights: %s", spec,
                         (double)total / (1 << 30), strerror(errno));
    }
    madvise(base, total, MADV_HUGEPAGE);  /* fewer page faults while filling 16 GB; advisory only */
    m->maps[0] = (llmi_mapping){base, total, false};
    m->n_maps = 1;
    dummy_place(m, dtype, group_size, &l, base);
    bool vec_ok = m->out_norm != NULL;
    for (int i = 0; i < c->n_layers; i++) {
        const llmi_layer *L = &m->layers[i];
        vec_ok &= L->attn_norm && L->ffn_norm && (!c->qkv_bias || (L->bq && L->bk && L->bv)) &&
                  (!c->qk_norm || (L->q_norm && L->k_norm)) && (!c->post_norms || (L->post_attn_norm && L->post_ffn_norm));
    }
    if (!vec_ok) {
        model_free(m);
        return llmi_fail(st, LLMI_E_RUNTIME, "--dummy %s: out of memory", spec);
    }

    /* Each tensor gets its own stream: key = (layer + 1) << 8 | slot. */
    uint64_t seed = 0x6C6C6D69ull;  /* "llmi" */
    dummy_fill((void *)m->tok_embd.data, m->tok_embd.dtype, m->tok_embd.rows, m->tok_embd.cols,
               1.f / sqrtf((float)c->dim), seed ^ 1);
    size_t wbytes = tensor_bytes(&m->tok_embd);
    for (int i = 0; i < c->n_layers; i++) {
        llmi_layer *L = &m->layers[i];
        uint64_t k = seed ^ ((uint64_t)(i + 1) << 8);
        llmi_tensor *ts[8] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->w_router};
        for (int j = 0; j < 8 && ts[j]->data; j++) {
            const float scale = 1.f / sqrtf((float)ts[j]->cols);
            if (ts[j]->dtype == LLMI_I4G) {
                dummy_fill_i4g(ts[j], scale, k + (uint64_t)j + 2);
                wbytes += (size_t)ts[j]->n_groups * (size_t)ts[j]->rows * (sizeof(uint16_t) + 1);
            } else {
                dummy_fill((void *)ts[j]->data, ts[j]->dtype, ts[j]->rows, ts[j]->cols, scale, k + (uint64_t)j + 2);
            }
            wbytes += tensor_bytes(ts[j]);
        }
        for (int d = 0; d < c->dim; d++) L->attn_norm[d] = L->ffn_norm[d] = 1.f;
        wbytes += 2 * (size_t)c->dim * sizeof(float);
        if (c->qkv_bias) {
            int qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
            dummy_fill(L->bq, LLMI_F32, 1, qd, 0.02f, k + 10);
            dummy_fill(L->bk, LLMI_F32, 1, kvd, 0.02f, k + 11);
            dummy_fill(L->bv, LLMI_F32, 1, kvd, 0.02f, k + 12);
            wbytes += (size_t)(qd + 2 * kvd) * sizeof(float);
        }
        if (c->qk_norm) {
            for (int d = 0; d < c->head_dim; d++) L->q_norm[d] = L->k_norm[d] = 1.f;
            wbytes += 2 * (size_t)c->head_dim * sizeof(float);
        }
        if (c->post_norms) {
            for (int d = 0; d < c->dim; d++) L->post_attn_norm[d] = L->post_ffn_norm[d] = 1.f;
            wbytes += 2 * (size_t)c->dim * sizeof(float);
        }
    }
    for (int d = 0; d < c->dim; d++) m->out_norm[d] = 1.f;
    wbytes += (size_t)c->dim * sizeof(float);
    if (!c->tie_embeddings) {
        dummy_fill((void *)m->lm_head.data, m->lm_head.dtype, m->lm_head.rows, m->lm_head.cols,
                   1.f / sqrtf((float)c->dim), seed ^ 3);
        wbytes += tensor_bytes(&m->lm_head);
    }
    m->weight_bytes = wbytes;
    m->tok = NULL;
    snprintf(m->source_path, sizeof m->source_path, "%s", spec);
    snprintf(m->format, sizeof m->format, "dummy");
    return 0;
}
