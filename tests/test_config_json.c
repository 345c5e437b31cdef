/* test_config_json.c — the one config.json reader (model/config_json.c): a model directory
 * (-m DIR) and `--dummy config.json` read the same file to the same llmi_config, with
 * transformers' defaults for absent keys (LlamaConfig, MistralConfig, Qwen2Config), its
 * model_type/architectures rule, and each family's sliding-window rule.  The directories
 * reuse the weights of the tiny testdata/hf checkpoints with an edited config.json. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config_json.h"
#include "model/model.h"
#include "model/model_dummy.h"
#include "test.h"

static const char *cj_testdata(void) {
    const char *d = getenv("TESTDATA");
    return d && *d ? d : "testdata";
}

static void cj_write(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); abort(); }
    fputs(text, f);
    fclose(f);
}

/* A model directory: the weights of testdata/hf/<model> (linked) beside a new config.json. */
static char *cj_model_dir(const char *model, const char *config) {
    char *d = strdup("/tmp/llmi-cfgjson-XXXXXX"), src[1024], dst[1024];
    if (!d || !mkdtemp(d)) abort();
    const char *files[] = {"model.safetensors", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
                           "model-00002-of-00002.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "%s/hf/%s/%s", cj_testdata(), model, files[i]);
        if (access(src, R_OK) != 0) continue;
        char *abs = realpath(src, NULL);
        snprintf(dst, sizeof dst, "%s/%s", d, files[i]);
        if (!abs || symlink(abs, dst) != 0) abort();
        free(abs);
    }
    snprintf(dst, sizeof dst, "%s/config.json", d);
    cj_write(dst, config);
    return d;
}

static void cj_rm_dir(char *d) {
    const char *files[] = {"config.json", "model.safetensors", "model.safetensors.index.json",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char p[1024];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", d, files[i]);
        unlink(p);
    }
    rmdir(d);
    free(d);
}

/* Every field but the name (which each caller sets its own way). */
static bool cj_same(const llmi_config *a, const llmi_config *b) {
    return a->arch == b->arch && !strcmp(a->arch_name, b->arch_name) && a->n_vocab == b->n_vocab &&
           a->dim == b->dim && a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->ffn_dim == b->ffn_dim &&
           a->max_ctx == b->max_ctx && a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta &&
           a->rope_dim == b->rope_dim && a->rope_scaling == b->rope_scaling && a->rope_factor == b->rope_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_orig_max_pos == b->rope_orig_max_pos && a->tie_embeddings == b->tie_embeddings &&
           a->qkv_bias == b->qkv_bias && a->qk_norm == b->qk_norm && a->act == b->act &&
           a->embed_scale == b->embed_scale && a->attn_scale == b->attn_scale && a->post_norms == b->post_norms &&
           a->sliding_window == b->sliding_window && a->rope_theta_local == b->rope_theta_local &&
           !memcmp(a->layer_sliding, b->layer_sliding, sizeof a->layer_sliding);
}

/* Loads dir as a model (weights, no tokenizer) and as a --dummy spec: both must succeed
 * and agree on every field but the name; *out gets the loader's config. */
static void cj_both(test_ctx *t_, const char *dir, llmi_config *out) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    llmi_status st = {0};
    llmi_model m;
    llmi_load_opts o = {.no_tokenizer = true};
    memset(out, 0, sizeof *out);
    if (model_load_hf(dir, &o, &m, &st) != 0) {
        CHECK_MSG(false, "model_load_hf: %s", st.msg);
        return;
    }
    *out = m.cfg;
    model_free(&m);
    llmi_config d;
    CHECK_MSG(model_dummy_config(cfg, &d, &st) == 0, "--dummy: %s", st.msg);
    CHECK_MSG(cj_same(out, &d), "%s: -m and --dummy read config.json differently", dir);
}

#define LLAMA_BASE \
    "\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, " \
    "\"head_dim\": 16, \"intermediate_size\": 96, \"vocab_size\": 320"

/* No rms_norm_eps, no max_position_embeddings: LlamaConfig's 1e-6 and 2048 through both
 * callers (--dummy used 1e-5 before there was one reader). */
TEST(config_json_llama_defaults_agree) {
    char *d = cj_model_dir("llama-attn-bias", "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], "
                                              LLAMA_BASE ", \"attention_bias\": true}");
    llmi_config c;
    cj_both(t_, d, &c);
    CHECK(c.norm_eps == 1e-6f && c.max_ctx == 2048 && c.rope_theta == 10000.f && c.qkv_bias && !c.tie_embeddings);
    CHECK(c.arch == LLMI_ARCH_LLAMA && !strcmp(c.arch_name, "llama"));
    cj_rm_dir(d);
    /* a sliding_window key means nothing to LlamaConfig: no cap */
    d = cj_model_dir("llama-attn-bias", "{\"model_type\": \"llama\", " LLAMA_BASE
                                        ", \"attention_bias\": true, \"sliding_window\": 64}");
    cj_both(t_, d, &c);
    CHECK(c.max_ctx == 2048);
    cj_rm_dir(d);
}

/* MistralConfig: max_position_embeddings 4096*32, sliding_window 4096 when absent (on every
 * layer; the context stays the model's), none when null, num_key_value_heads 8 when absent. */
TEST(config_json_mistral_window) {
    const char *base = "{\"model_type\": \"mistral\", " LLAMA_BASE;
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "%s}", base);
    char *d = cj_model_dir("mistral-sharded", cfg);
    llmi_config c;
    cj_both(t_, d, &c);
    CHECK_MSG(c.max_ctx == 4096 * 32 && c.sliding_window == 4096 && c.norm_eps == 1e-6f &&
              !strcmp(c.arch_name, "mistral"), "max_ctx %d window %d", c.max_ctx, c.sliding_window);
    for (int l = 0; l < c.n_layers; l++) CHECK(config_layer_window(&c, l) == 4096 && !config_layer_rope_local(&c, l));
    cj_rm_dir(d);
    snprintf(cfg, sizeof cfg, "%s, \"sliding_window\": null}", base);
    d = cj_model_dir("mistral-sharded", cfg);
    cj_both(t_, d, &c);
    CHECK(c.max_ctx == 4096 * 32 && c.sliding_window == 0 && config_layer_window(&c, 0) == 0);
    cj_rm_dir(d);
    snprintf(cfg, sizeof cfg, "%s, \"sliding_window\": 100, \"max_position_embeddings\": 256}", base);
    d = cj_model_dir("mistral-sharded", cfg);
    cj_both(t_, d, &c);
    CHECK(c.max_ctx == 256 && config_layer_window(&c, 0) == 100 && config_layer_window(&c, c.n_layers - 1) == 100);
    cj_rm_dir(d);
    /* num_key_value_heads: 8 when absent, all heads when null */
    llmi_status st = {0};
    char *t = cj_model_dir("mistral-sharded", "{\"model_type\": \"mistral\", \"hidden_size\": 512, "
                                              "\"num_hidden_layers\": 1, \"num_attention_heads\": 32, "
                                              "\"intermediate_size\": 64, \"vocab_size\": 32}");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", t);
    CHECK(config_json_read(p, NULL, &c, NULL, &st) == 0 && c.n_kv_heads == 8 && c.head_dim == 16);
    cj_write(p, "{\"model_type\": \"mistral\", \"hidden_size\": 512, \"num_hidden_layers\": 1, "
                "\"num_attention_heads\": 32, \"num_key_value_heads\": null, \"intermediate_size\": 64, "
                "\"vocab_size\": 32}");
    CHECK(config_json_read(p, NULL, &c, NULL, &st) == 0 && c.n_kv_heads == 32);
    cj_rm_dir(t);
}

/* Qwen2Config: a window only with use_sliding_window, on the layers layer_types names (else
 * the layers from max_window_layers on); max_position_embeddings 32768, never capped. */
TEST(config_json_qwen2_window) {
    const char *base = "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, "
                       "\"vocab_size\": 320, \"tie_word_embeddings\": true";
    struct { const char *extra; int window0, window1; } cases[] = {   /* layer 0's and layer 1's windows */
        {"", 0, 0},
        {", \"sliding_window\": 64", 0, 0},                                   /* use_sliding_window false */
        {", \"use_sliding_window\": true, \"sliding_window\": 64", 0, 0},     /* max_window_layers 28 >= 2 */
        {", \"use_sliding_window\": true, \"sliding_window\": 64, \"max_window_layers\": 1", 0, 64},
        {", \"use_sliding_window\": true, \"max_window_layers\": 0", 4096, 4096},    /* default window */
        {", \"use_sliding_window\": true, \"sliding_window\": 64, \"layer_types\": [\"full_attention\", "
         "\"sliding_attention\"]", 0, 64},
        {", \"use_sliding_window\": true, \"sliding_window\": 64, \"max_window_layers\": 0, \"layer_types\": "
         "[\"full_attention\", \"full_attention\"]", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg, "%s%s}", base, cases[i].extra);
        char *d = cj_model_dir("qwen2-bias-tied", cfg);
        llmi_config c;
        cj_both(t_, d, &c);
        CHECK_MSG(c.max_ctx == 32768 && config_layer_window(&c, 0) == cases[i].window0 &&
                  config_layer_window(&c, 1) == cases[i].window1, "case %zu: max_ctx %d, windows %d %d, want %d %d", i,
                  c.max_ctx, config_layer_window(&c, 0), config_layer_window(&c, 1), cases[i].window0,
                  cases[i].window1);
        CHECK(c.arch == LLMI_ARCH_QWEN2 && c.qkv_bias && c.norm_eps == 1e-6f);
        cj_rm_dir(d);
    }
}

/* Qwen3Config's own defaults (transformers 5.24 configuration_qwen3.py): head_dim 128 when
 * absent (not hidden_size / heads), no bias unless attention_bias; q/k norm always. */
/* config.json "{shape extra}" written to p and read into c. */
static int cj_read_case(const char *p, const char *shape, const char *extra, llmi_config *c, llmi_status *st) {
    char cfg[1024];
    snprintf(cfg, sizeof cfg, "{%s%s}", shape, extra);
    cj_write(p, cfg);
    return config_json_read(p, NULL, c, NULL, st);
}

TEST(config_json_qwen3_defaults) {
    char *d = cj_model_dir("none", "{}");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    const char *shape = "\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_hidden_layers\": 1, "
                        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, "
                        "\"vocab_size\": 32";
    struct { const char *extra; int head_dim; bool bias; } cases[] = {
        {"", 128, false},
        {", \"head_dim\": null", 128, false},
        {", \"head_dim\": 16, \"attention_bias\": true", 16, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_config c;
        llmi_status st = {0};
        int rc = cj_read_case(p, shape, cases[i].extra, &c, &st);
        CHECK_MSG(rc == 0 && c.arch == LLMI_ARCH_QWEN3 && c.qk_norm && c.head_dim == cases[i].head_dim &&
                      c.qkv_bias == cases[i].bias && c.max_ctx == 32768 && c.norm_eps == 1e-6f,
                  "case %zu: rc %d head_dim %d bias %d: %s", i, rc, c.head_dim, c.qkv_bias, st.msg);
    }
    cj_rm_dir(d);
}

/* SmolLM3Config (transformers 5.24) for absent keys: 32768 positions, 4 kv heads, eps 1e-6,
 * tied embeddings, rope_theta 2e6, the last of every 4 layers without RoPE; with
 * use_sliding_window and a window, the NoPE layers slide (its layer_types); an interval of 2. */
TEST(config_json_smollm3_defaults) {
    char *d = cj_model_dir("none", "{}");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    const char *shape = "\"model_type\": \"smollm3\", \"hidden_size\": 64, \"num_hidden_layers\": 8, "
                        "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 32";
    struct { const char *extra; int every, window; } cases[] = {
        {"", 4, 0},
        {", \"use_sliding_window\": true, \"sliding_window\": 16, \"no_rope_layer_interval\": 2", 2, 16},
        {", \"use_sliding_window\": false, \"sliding_window\": 16", 4, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_config c;
        llmi_status st = {0};
        int rc = cj_read_case(p, shape, cases[i].extra, &c, &st);
        CHECK_MSG(rc == 0 && c.arch == LLMI_ARCH_LLAMA && !strcmp(c.arch_name, "smollm3") && c.max_ctx == 32768 &&
                      c.n_kv_heads == 4 && c.norm_eps == 1e-6f && c.tie_embeddings && c.rope_theta == 2e6f &&
                      c.sliding_window == cases[i].window,
                  "case %zu: rc %d: %s", i, rc, st.msg);
        for (int l = 0; l < 8 && rc == 0; l++) {
            const bool nope = (l + 1) % cases[i].every == 0;
            CHECK_MSG(c.layer_nope[l] == nope && config_layer_window(&c, l) == (nope ? cases[i].window : 0),
                      "case %zu layer %d: nope %d window %d", i, l, c.layer_nope[l], config_layer_window(&c, l));
        }
    }
    cj_rm_dir(d);
}

/* Each bad[i][0] (a printf pattern given shape) written to p must be refused by the reader
 * with a message holding bad[i][1]. */
static void cj_expect_refused(test_ctx *t_, const char *p, const char *shape, const char *const (*bad)[2], size_t n) {
    for (size_t i = 0; i < n; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg, bad[i][0], shape);
        cj_write(p, cfg);
        llmi_config c;
        llmi_status st = {0};
        CHECK_MSG(config_json_read(p, NULL, &c, NULL, &st) == LLMI_E_RUNTIME && strstr(st.msg, bad[i][1]),
                  "bad case %zu: %s", i, st.msg);
    }
}

/* GraniteConfig (transformers 5.24): llama's defaults (2048 positions, kv heads = heads,
 * untied, eps 1e-6), each multiplier 1 when absent (q.k's scale then 1, not 1/sqrt(head_dim)),
 * the released 8B's values read as given; a multiplier <= 0 or not a number refused by name,
 * as is a residual or logit scale past the config bounds. */
TEST(config_json_granite) {
    char *d = cj_model_dir("none", "{}");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    const char *shape = "\"model_type\": \"granite\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                        "\"num_attention_heads\": 4, \"intermediate_size\": 96, \"vocab_size\": 32";
    struct { const char *extra; float emb, attn, res, logit; } cases[] = {
        {"", 1, 1, 1, 1},
        {", \"architectures\": [\"GraniteForCausalLM\"], \"embedding_multiplier\": 12.0, "
         "\"attention_multiplier\": 0.0078125, \"residual_multiplier\": 0.22, \"logits_scaling\": 16.0",
         12, 0.0078125f, 0.22f, 16},
        {", \"logits_scaling\": 8.0", 1, 1, 1, 8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_config c;
        llmi_status st = {0};
        int rc = cj_read_case(p, shape, cases[i].extra, &c, &st);
        CHECK_MSG(rc == 0 && c.arch == LLMI_ARCH_LLAMA && !strcmp(c.arch_name, "granite") && c.max_ctx == 2048 &&
                      c.n_kv_heads == 4 && c.norm_eps == 1e-6f && !c.tie_embeddings && config_embed_scale(&c) == cases[i].emb &&
                      config_attn_scale(&c) == cases[i].attn && config_residual_scale(&c) == cases[i].res &&
                      config_logit_scale(&c) == cases[i].logit,
                  "case %zu: rc %d emb %g attn %g res %g logit %g: %s", i, rc, (double)c.embed_scale,
                  (double)c.attn_scale, (double)c.residual_scale, (double)c.logit_scale, st.msg);
    }
    const char *bad[][2] = {
        {"{%s, \"logits_scaling\": 0}", "logits_scaling must be > 0"},
        {"{%s, \"residual_multiplier\": -0.22}", "residual_multiplier must be > 0"},
        {"{%s, \"attention_multiplier\": \"1/128\"}", "attention_multiplier must be a finite number"},
        {"{%s, \"logits_scaling\": 1e-9}", "logit scale"},
        {"{%s, \"residual_multiplier\": 1e9}", "residual scale"},
        {"{%s, \"mlp_bias\": true}", "mlp_bias is not supported"},
        {"{\"model_type\": \"granitemoeshared\"}", "unsupported model_type granitemoeshared"},
        {"{\"model_type\": \"granitemoehybrid\"}", "unsupported model_type granitemoehybrid"},
    };
    cj_expect_refused(t_, p, shape, bad, sizeof bad / sizeof bad[0]);
    /* GraniteMoeConfig: the multipliers as Granite's, Mixtral's experts (8, top-2, renormalised) */
    const char *moe = "\"model_type\": \"granitemoe\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
                      "\"num_attention_heads\": 4, \"intermediate_size\": 32, \"vocab_size\": 32";
    struct { const char *extra; int experts, used; float logit; } mcases[] = {
        {"", 8, 2, 1},
        {", \"num_local_experts\": 40, \"num_experts_per_tok\": 8, \"logits_scaling\": 6.0", 40, 8, 6},
    };
    for (size_t i = 0; i < sizeof mcases / sizeof mcases[0]; i++) {
        llmi_config c;
        llmi_status st = {0};
        int rc = cj_read_case(p, moe, mcases[i].extra, &c, &st);
        CHECK_MSG(rc == 0 && !strcmp(c.arch_name, "granitemoe") && c.n_experts == mcases[i].experts &&
                      c.n_experts_used == mcases[i].used && c.moe_norm_topk && c.ffn_dim == 32 &&
                      config_logit_scale(&c) == mcases[i].logit && config_attn_scale(&c) == 1.0f,
                  "granitemoe case %zu: rc %d experts %d used %d: %s", i, rc, c.n_experts, c.n_experts_used, st.msg);
    }
    cj_rm_dir(d);
}

/* Gemma3TextConfig (transformers 5.24 configuration_gemma3.py): its defaults, both config
 * forms (transformers 4's top-level keys, transformers 5's layer_types and per-type
 * rope_parameters), and what llmi refuses by name. */
TEST(config_json_gemma3) {
    char *d = cj_model_dir("none", "{}");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    const char *shape = "\"model_type\": \"gemma3_text\", \"hidden_size\": 64, \"num_hidden_layers\": 6, "
                        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 96, "
                        "\"vocab_size\": 32";
    struct {
        const char *extra;
        int head_dim, window;
        const char *sliding;              /* per layer: 1 slides */
        float attn_scale, theta, theta_local, factor;
    } cases[] = {
        {"", 256, 4096, "111110", 0.0625f, 1e6f, 1e4f, 0},
        {", \"head_dim\": 32, \"sliding_window\": 8, \"sliding_window_pattern\": 2, \"query_pre_attn_scalar\": 16, "
         "\"rope_theta\": 5e5, \"rope_local_base_freq\": 500, \"rope_scaling\": {\"rope_type\": \"linear\", "
         "\"factor\": 4.0}", 32, 8, "101010", 0.25f, 5e5f, 500.f, 4.f},
        {", \"head_dim\": 32, \"sliding_window\": 5, \"layer_types\": [\"full_attention\", \"sliding_attention\", "
         "\"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"], "
         "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0, \"rope_theta\": 2e5}, "
         "\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1000.0}}", 32, 5, "011010", 0.0625f,
         2e5f, 1000.f, 2.f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        llmi_config c;
        llmi_status st = {0};
        int rc = cj_read_case(p, shape, cases[i].extra, &c, &st);
        CHECK_MSG(rc == 0, "case %zu: %s", i, st.msg);
        if (rc) continue;
        CHECK(c.arch == LLMI_ARCH_GEMMA3 && c.act == LLMI_ACT_GELU_TANH && c.qk_norm && c.post_norms &&
              c.tie_embeddings && c.embed_scale == 8.0f && c.max_ctx == 131072 && c.norm_eps == 1e-6f);
        CHECK_MSG(c.head_dim == cases[i].head_dim && c.sliding_window == cases[i].window &&
                      c.attn_scale == cases[i].attn_scale && c.rope_theta == cases[i].theta &&
                      c.rope_theta_local == cases[i].theta_local,
                  "case %zu: head_dim %d window %d scale %g theta %g local %g", i, c.head_dim, c.sliding_window,
                  (double)c.attn_scale, (double)c.rope_theta, (double)c.rope_theta_local);
        CHECK(cases[i].factor == 0 ? c.rope_scaling == LLMI_ROPE_SCALING_NONE
                                   : c.rope_scaling == LLMI_ROPE_SCALING_LINEAR && c.rope_factor == cases[i].factor);
        for (int l = 0; l < 6; l++) {
            bool slide = cases[i].sliding[l] == '1';
            CHECK_MSG(config_layer_window(&c, l) == (slide ? cases[i].window : 0) &&
                          config_layer_rope_local(&c, l) == slide, "case %zu layer %d", i, l);
        }
    }
    /* Gemma3TextConfig's soft caps default to none; set, they apply as Gemma 2's do */
    {
        char cfg[1024];
        snprintf(cfg, sizeof cfg, "{%s, \"final_logit_softcapping\": 30.0}", shape);
        cj_write(p, cfg);
        llmi_config c;
        llmi_status st = {0};
        CHECK_MSG(config_json_read(p, NULL, &c, NULL, &st) == 0 && c.final_softcap == 30.0f && c.attn_softcap == 0,
                  "gemma3 with a final cap: %s", st.msg);
        snprintf(cfg, sizeof cfg, "{%s}", shape);
        cj_write(p, cfg);
        CHECK(config_json_read(p, NULL, &c, NULL, &st) == 0 && c.final_softcap == 0 && c.attn_softcap == 0);
    }
    const char *bad[][2] = {
        {"{\"model_type\": \"gemma3\", \"architectures\": [\"Gemma3ForConditionalGeneration\"]}", "text-only"},
        {"{%s, \"hidden_activation\": \"gelu\"}", "gelu_pytorch_tanh"},
        {"{%s, \"final_logit_softcapping\": 0}", "final_logit_softcapping must be > 0"},
        {"{%s, \"layer_types\": [\"full_attention\"]}", "one type per layer"},
        {"{%s, \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0}}}",
         "default rope"},
    };
    cj_expect_refused(t_, p, shape, bad, sizeof bad / sizeof bad[0]);
    cj_rm_dir(d);
}

/* model_type decides (AutoConfig); architectures[0] only when model_type is absent, and
 * never against it.  Errors name the file and what is wrong. */
TEST(config_json_family_keys) {
    char *d = cj_model_dir("none", "{}");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    const char *shape = "\"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                        "\"num_key_value_heads\": 2, \"intermediate_size\": 96, \"vocab_size\": 32";
    struct { const char *keys; int arch; const char *name; const char *err; } cases[] = {
        {"\"model_type\": \"qwen2\"", LLMI_ARCH_QWEN2, "qwen2", NULL},
        {"\"architectures\": [\"Qwen3ForCausalLM\"]", LLMI_ARCH_QWEN3, "qwen3", NULL},
        {"\"architectures\": [\"MistralForCausalLM\"]", LLMI_ARCH_LLAMA, "mistral", NULL},
        {"\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"]", LLMI_ARCH_LLAMA, "llama", NULL},
        {"\"model_type\": \"llama\", \"architectures\": [\"Qwen2ForCausalLM\"]", 0, NULL, "does not match model_type"},
        {"\"model_type\": \"gpt2\"", 0, NULL, "unsupported model_type gpt2"},
        {"\"architectures\": [\"GPT2LMHeadModel\"]", 0, NULL, "unsupported architecture GPT2LMHeadModel"},
        {"\"architectures\": []", 0, NULL, "architectures"},
        {"\"model_type\": 7", 0, NULL, "model_type must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg, "{%s, %s}", cases[i].keys, shape);
        cj_write(p, cfg);
        llmi_config c;
        llmi_status st = {0};
        int rc = config_json_read(p, NULL, &c, NULL, &st);
        if (cases[i].err) {
            CHECK_MSG(rc == LLMI_E_RUNTIME && strstr(st.msg, p) && strstr(st.msg, cases[i].err), "case %zu: %s", i,
                      st.msg);
        } else {
            CHECK_MSG(rc == 0 && (int)c.arch == cases[i].arch && !strcmp(c.arch_name, cases[i].name), "case %zu: %s",
                      i, st.msg);
        }
    }
    /* the flag that named the file leads an open error: a usage error */
    unlink(p);
    llmi_config c;
    llmi_status st = {0};
    CHECK(config_json_read(p, "--dummy", &c, NULL, &st) == LLMI_E_USAGE && strstr(st.msg, "--dummy "));
    cj_rm_dir(d);
}

/* MixtralConfig and Qwen3MoeConfig (transformers 5.24): their defaults for absent keys
 * (experts, top-k, renormalisation, Mixtral's rms_norm_eps 1e-5, rope 1e6 and no window,
 * Qwen3-MoE's head_dim from hidden_size / heads and moe_intermediate_size as the experts'
 * width), the keys when given, and dense layers refused. */
TEST(config_json_moe) {
    char *d = cj_model_dir("none", "{}");
    char p[1024];
    snprintf(p, sizeof p, "%s/config.json", d);
    const char *shape = "\"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 8, "
                        "\"intermediate_size\": 96, \"vocab_size\": 32";
    struct {
        const char *cfg;
        llmi_arch arch;
        int experts, used, ffn, head_dim, kv, window;
        bool norm;
        float eps, theta;
    } cases[] = {
        {"{\"model_type\": \"mixtral\", %s}", LLMI_ARCH_LLAMA, 8, 2, 96, 8, 8, 0, true, 1e-5f, 1e6f},
        {"{\"model_type\": \"mixtral\", %s, \"num_local_experts\": 4, \"num_experts_per_tok\": 3, "
         "\"num_key_value_heads\": 2, \"sliding_window\": 7, \"rope_theta\": 5e5}", LLMI_ARCH_LLAMA, 4, 3, 96, 8, 2, 7,
         true, 1e-5f, 5e5f},
        {"{\"model_type\": \"qwen3_moe\", %s}", LLMI_ARCH_QWEN3, 128, 8, 768, 8, 4, 0, false, 1e-6f, 1e4f},
        {"{\"model_type\": \"qwen3_moe\", %s, \"num_local_experts\": 12}", LLMI_ARCH_QWEN3, 12, 8, 768, 8, 4, 0, false,
         1e-6f, 1e4f},
        {"{\"architectures\": [\"Qwen3MoeForCausalLM\"], %s, \"num_experts\": 6, \"num_experts_per_tok\": 2, "
         "\"moe_intermediate_size\": 32, \"norm_topk_prob\": true, \"head_dim\": 32, \"mlp_only_layers\": [], "
         "\"decoder_sparse_step\": 1, \"use_sliding_window\": true, \"sliding_window\": 9}", LLMI_ARCH_QWEN3, 6, 2, 32,
         32, 4, 9, true, 1e-6f, 1e4f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cfg[1024];
        snprintf(cfg, sizeof cfg, cases[i].cfg, shape);
        cj_write(p, cfg);
        llmi_config c;
        llmi_status st = {0};
        int rc = config_json_read(p, NULL, &c, NULL, &st);
        CHECK_MSG(rc == 0, "case %zu: %s", i, st.msg);
        if (rc) continue;
        CHECK_MSG(c.arch == cases[i].arch && c.n_experts == cases[i].experts && c.n_experts_used == cases[i].used &&
                      c.ffn_dim == cases[i].ffn && c.head_dim == cases[i].head_dim && c.n_kv_heads == cases[i].kv &&
                      c.moe_norm_topk == cases[i].norm && c.norm_eps == cases[i].eps && c.rope_theta == cases[i].theta &&
                      c.qk_norm == (cases[i].arch == LLMI_ARCH_QWEN3),
                  "case %zu: experts %d/%d ffn %d head_dim %d kv %d norm %d eps %g theta %g", i, c.n_experts,
                  c.n_experts_used, c.ffn_dim, c.head_dim, c.n_kv_heads, c.moe_norm_topk, (double)c.norm_eps,
                  (double)c.rope_theta);
        CHECK_MSG(config_layer_window(&c, 0) == cases[i].window && config_layer_window(&c, 1) == cases[i].window,
                  "case %zu: window %d", i, config_layer_window(&c, 0));
    }
    const char *bad[][2] = {
        {"{\"model_type\": \"qwen3_moe\", %s, \"mlp_only_layers\": [1]}", "dense MLP layers"},
        {"{\"model_type\": \"qwen3_moe\", %s, \"decoder_sparse_step\": 2}", "dense MLP layers"},
        {"{\"model_type\": \"qwen3_moe\", %s, \"num_experts\": 4, \"num_experts_per_tok\": 5}", "experts per token"},
        {"{\"model_type\": \"mixtral\", %s, \"num_local_experts\": 100000}", "num_local_experts must be"},
        {"{\"model_type\": \"qwen3_moe\", %s, \"num_local_experts\": 8, \"num_experts\": 6}", "disagree"},
        {"{\"model_type\": \"qwen2_moe\", %s}", "unsupported model_type qwen2_moe"},
    };
    cj_expect_refused(t_, p, shape, bad, sizeof bad / sizeof bad[0]);
    cj_rm_dir(d);
}
