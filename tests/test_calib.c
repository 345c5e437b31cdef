/* test_calib.c — the quantizer calibrates on the forward that serves the model: the
 * activations it reads at every tap of every layer (quant/calib.h, run one layer at a
 * time over batches of windows) must equal, bit for bit, what the inference forward
 * computes at the same taps when each window is served alone as a prompt.  The model is
 * the Llama-3-style HF test checkpoint with llama3 rope_scaling and GQA, where the old
 * quantizer-private forward (which ignored rope_scaling) differed by up to 0.5 at the
 * o_proj inputs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "model/model.h"
#include "quant/calib.h"
#include "test.h"

enum { CAL_WINDOWS = 3, CAL_LEN = 40, CAL_BS = 16 };

/* Every tap of every layer for all windows: x[layer][tap] (windows * len, width). */
typedef struct tap_rec {
    int width[LLMI_TAP_COUNT];
    float *x[8][LLMI_TAP_COUNT];
    int window;                  /* first window of the forward running now */
    const quant_calib *cal;      /* calibration path: the window comes from here */
} tap_rec;

static int rec_tap(void *ctx, int layer, llmi_tap tap, const float *x, int n, int width, llmi_status *st) {
    tap_rec *r = ctx;
    int w = r->cal ? r->cal->batch_window : r->window;
    if (width != r->width[tap]) return llmi_fail(st, LLMI_E_RUNTIME, "tap %d: width %d, want %d", tap, width, r->width[tap]);
    memcpy(r->x[layer][tap] + (size_t)w * CAL_LEN * width, x, (size_t)n * width * sizeof(float));
    return 0;
}

static int count_tap(void *ctx, int layer, llmi_tap tap, const float *x, int n, int width, llmi_status *st) {
    (void)layer, (void)x, (void)n, (void)width, (void)st;
    ((int *)ctx)[tap]++;
    return 0;
}

static int dev_tap(void *ctx, int layer, llmi_tap tap, const void *x, llmi_dtype dt, int n, int width,
                   llmi_status *st) {
    (void)layer, (void)x, (void)dt, (void)n, (void)width, (void)st;
    ((int *)ctx)[tap]++;
    return 0;
}

static void rec_init(tap_rec *r, const llmi_config *c) {
    memset(r, 0, sizeof *r);
    r->width[LLMI_TAP_ATTN_IN] = c->dim;
    r->width[LLMI_TAP_O_IN] = c->n_heads * c->head_dim;
    r->width[LLMI_TAP_MLP_IN] = c->dim;
    r->width[LLMI_TAP_DOWN_IN] = c->ffn_dim;
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < LLMI_TAP_COUNT; t++)
            r->x[l][t] = calloc((size_t)CAL_WINDOWS * CAL_LEN * r->width[t], sizeof(float));
}

static void rec_free(tap_rec *r, int n_layers) {
    for (int l = 0; l < n_layers; l++)
        for (int t = 0; t < LLMI_TAP_COUNT; t++) free(r->x[l][t]);
}

TEST(calib_taps_equal_inference_forward) {
    llmi_model m;
    llmi_status st = {0};
    if (test_load_hf("llama-gqa-rope3", &m, &st)) {
        CHECK_MSG(0, "%s", st.msg);
        return;
    }
    const llmi_config *c = &m.cfg;
    CHECK(c->rope_scaling == LLMI_ROPE_SCALING_LLAMA3 && c->n_kv_heads < c->n_heads && c->n_layers <= 8);
    int32_t tokens[CAL_WINDOWS * CAL_LEN];
    test_random_tokens(tokens, CAL_WINDOWS * CAL_LEN, c->n_vocab);

    /* Inference: each window alone, as `llmi generate` would prefill it. */
    tap_rec inf, cal;
    rec_init(&inf, c);
    rec_init(&cal, c);
    llmi_backend_opts bo = {.kv_dtype = LLMI_KV_F32, .block_size = CAL_BS, .max_batch_tokens = CAL_LEN, .max_seqs = 1};
    llmi_backend *b = NULL;
    int nb = (CAL_LEN + CAL_BS - 1) / CAL_BS;
    CHECK(backend_cpu_create(&m, &bo, &b, &st) == 0 && b->kv_alloc(b, nb, &st) == 0);
    b->tap = rec_tap;
    b->tap_ctx = &inf;
    int32_t pos[CAL_LEN], slot[CAL_LEN], seq[CAL_LEN], qs[2] = {0, CAL_LEN}, table[8], row = CAL_LEN - 1;
    for (int i = 0; i < nb; i++) table[i] = nb - 1 - i;   /* any blocks will do */
    for (int i = 0; i < CAL_LEN; i++) {
        pos[i] = i;
        slot[i] = table[i / CAL_BS] * CAL_BS + i % CAL_BS;
        seq[i] = 0;
    }
    float *logits = malloc((size_t)c->n_vocab * sizeof(float));
    for (int w = 0; w < CAL_WINDOWS; w++) {
        inf.window = w;
        llmi_batch bt = {.n_tokens = CAL_LEN, .tokens = tokens + w * CAL_LEN, .positions = pos, .slot_mapping = slot,
                         .seq_of_token = seq, .n_seqs = 1, .query_start = qs, .block_tables = table,
                         .max_blocks_per_seq = nb, .n_logits = 1, .logit_rows = &row};
        CHECK(b->forward(b, &bt, logits, &st) == 0);
    }
    /* tap_skip: the taps it names are not handed over (the cuda backend would copy each
     * one to the host), every other one is, at every layer */
    {
        int calls[LLMI_TAP_COUNT] = {0};
        unsigned skip = 1u << LLMI_TAP_ATTN_IN | 1u << LLMI_TAP_DOWN_IN;
        b->tap = count_tap, b->tap_ctx = calls, b->tap_skip = skip;
        llmi_batch bt = {.n_tokens = CAL_LEN, .tokens = tokens, .positions = pos, .slot_mapping = slot,
                         .seq_of_token = seq, .n_seqs = 1, .query_start = qs, .block_tables = table,
                         .max_blocks_per_seq = nb, .n_logits = 1, .logit_rows = &row};
        CHECK(b->forward(b, &bt, logits, &st) == 0);
        for (int t = 0; t < LLMI_TAP_COUNT; t++)
            CHECK_MSG(calls[t] == (skip >> t & 1u ? 0 : c->n_layers), "tap %d: %d calls, skip mask %#x", t, calls[t],
                      skip);
        /* a tap on the device is the cuda backend's: the CPU says so and runs nothing */
        b->tap = NULL, b->tap_skip = 0, b->tap_device = dev_tap;
        memset(calls, 0, sizeof calls);
        llmi_status es = {0};
        CHECK(b->forward(b, &bt, logits, &es) == LLMI_E_USAGE && strstr(es.msg, "device") != NULL);
        CHECK(calls[0] == 0);
        b->tap_device = NULL;
        /* and so are hidden states in a device's memory */
        float dummy = 0;
        llmi_layer_run run = {.first_layer = 0, .last_layer = 1, .hidden_device = &dummy, .hidden_dtype = LLMI_BF16};
        es = (llmi_status){0};
        CHECK(b->forward_layers(b, &bt, &run, &es) == LLMI_E_USAGE && strstr(es.msg, "device") != NULL);
        CHECK(dummy == 0);
    }
    b->destroy(b);

    /* Calibration: all windows at once, one layer at a time, on the served view. */
    quant_view v;
    quant_calib qc;
    CHECK(quant_view_init(&v, &m, &st) == 0);
    CHECK(quant_calib_init(&qc, &v, tokens, CAL_WINDOWS, CAL_LEN, LLMI_F32, NULL, &st) == 0);
    CHECK(qc.windows_per_batch == CAL_WINDOWS);   /* batched: several windows per forward */
    cal.cal = &qc;
    for (int l = 0; l < c->n_layers; l++) CHECK(quant_calib_run(&qc, rec_tap, &cal, 0, true, &st) == 0);

    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < LLMI_TAP_COUNT; t++) {
            size_t n = (size_t)CAL_WINDOWS * CAL_LEN * inf.width[t];
            long diff = 0;
            for (size_t i = 0; i < n; i++) diff += memcmp(&inf.x[l][t][i], &cal.x[l][t][i], sizeof(float)) != 0;
            CHECK_MSG(diff == 0, "layer %d tap %d: %ld of %zu values differ", l, t, diff, n);
        }
    quant_calib_free(&qc);
    quant_view_free(&v);
    rec_free(&inf, c->n_layers);
    rec_free(&cal, c->n_layers);
    free(logits);
    model_free(&m);
}
