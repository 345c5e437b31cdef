/* quant_stats.c — owns the calibration statistics file: "LLMIQST1", u32 n_layers and
 * the four input dims, then per layer and set mean|x| (cols f32) and the upper triangle
 * of X^T X / n (cols*(cols+1)/2 f32), all one zstd stream. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include "quant/calib_stats.h"

int quant_stats_init(quant_stats *s, const llmi_config *c, llmi_status *st) {
    memset(s, 0, sizeof *s);
    s->n_layers = c->n_layers;
    s->cols[QS_ATTN] = c->dim;
    s->cols[QS_O] = c->n_heads * c->head_dim;
    s->cols[QS_MLP] = c->dim;
    s->cols[QS_DOWN] = c->ffn_dim;
    s->gram = calloc((size_t)c->n_layers, sizeof *s->gram);
    s->xmean = calloc((size_t)c->n_layers, sizeof *s->xmean);
    if (!s->gram || !s->xmean) {
        quant_stats_free(s);
        return llmi_fail(st, LLMI_E_RUNTIME, "quantize: out of memory for statistics");
    }
    return 0;
}

void quant_stats_free(quant_stats *s) {
    for (int l = 0; l < s->n_layers; l++)
        for (int k = 0; k < QS_COUNT; k++) {
            if (s->gram) free(s->gram[l][k]);
            if (s->xmean) free(s->xmean[l][k]);
        }
    free(s->gram), free(s->xmean);
    memset(s, 0, sizeof *s);
}

typedef struct qs_out { FILE *f; ZSTD_CCtx *z; uint8_t buf[1 << 16]; } qs_out;

static int qs_put(qs_out *o, const void *p, size_t n, ZSTD_EndDirective end) {
    ZSTD_inBuffer in = {p, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {o->buf, sizeof o->buf, 0};
        size_t r = ZSTD_compressStream2(o->z, &out, &in, end);
        if (ZSTD_isError(r)) return -1;
        if (out.pos && fwrite(o->buf, 1, out.pos, o->f) != out.pos) return -1;
        if (end == ZSTD_e_end ? r == 0 : in.pos == in.size) return 0;
    }
}

int quant_stats_save(const char *path, const quant_stats *s, llmi_status *st) {
    qs_out *o = calloc(1, sizeof *o);
    if (!o) return llmi_fail(st, LLMI_E_RUNTIME, "--save-stats %s: out of memory", path);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.part", path);
    o->f = fopen(tmp, "wb");
    o->z = ZSTD_createCCtx();
    int ok = o->f && o->z;
    if (ok) ZSTD_CCtx_setParameter(o->z, ZSTD_c_compressionLevel, 3);
    uint32_t hdr[5] = {(uint32_t)s->n_layers, (uint32_t)s->cols[0], (uint32_t)s->cols[1], (uint32_t)s->cols[2],
                       (uint32_t)s->cols[3]};
    ok = ok && qs_put(o, "LLMIQST1", 8, ZSTD_e_continue) == 0 && qs_put(o, hdr, sizeof hdr, ZSTD_e_continue) == 0;
    float *tri = NULL;
    for (int l = 0; l < s->n_layers && ok; l++)
        for (int k = 0; k < QS_COUNT && ok; k++) {
            int n = s->cols[k];
            if (!s->gram[l][k] || !s->xmean[l][k]) {
                ok = 0;
                break;
            }
            free(tri);
            tri = malloc((size_t)n * (n + 1) / 2 * sizeof(float));
            if (!tri) { ok = 0; break; }
            size_t t = 0;
            for (int i = 0; i < n; i++)
                for (int j = i; j < n; j++) tri[t++] = s->gram[l][k][(size_t)i * n + j];
            ok = qs_put(o, s->xmean[l][k], (size_t)n * sizeof(float), ZSTD_e_continue) == 0 &&
                 qs_put(o, tri, t * sizeof(float), ZSTD_e_continue) == 0;
        }
    free(tri);
    ok = ok && qs_put(o, NULL, 0, ZSTD_e_end) == 0;
    if (o->f && fclose(o->f) != 0) ok = 0;
    ZSTD_freeCCtx(o->z);
    free(o);
    if (ok && rename(tmp, path) != 0) ok = 0;
    if (!ok) {
        remove(tmp);
        return llmi_fail(st, LLMI_E_RUNTIME, "--save-stats %s: write failed", path);
    }
    return 0;
}

typedef struct qs_in { FILE *f; ZSTD_DCtx *z; uint8_t buf[1 << 16]; ZSTD_inBuffer in; } qs_in;

static int qs_get(qs_in *i, void *p, size_t n) {
    ZSTD_outBuffer out = {p, n, 0};
    while (out.pos < out.size) {
        if (i->in.pos == i->in.size) {
            size_t r = fread(i->buf, 1, sizeof i->buf, i->f);
            if (r == 0) return -1;
            i->in = (ZSTD_inBuffer){i->buf, r, 0};
        }
        size_t r = ZSTD_decompressStream(i->z, &out, &i->in);
        if (ZSTD_isError(r)) return -1;
    }
    return 0;
}

int quant_stats_load(const char *path, const llmi_config *c, quant_stats *s, llmi_status *st) {
    if (quant_stats_init(s, c, st)) return st->code;
    qs_in *in = calloc(1, sizeof *in);
    if (!in) return llmi_fail(st, LLMI_E_RUNTIME, "--load-stats %s: out of memory", path);
    in->f = fopen(path, "rb");
    in->z = ZSTD_createDCtx();
    int rc = 0;
    char magic[8];
    uint32_t hdr[5];
    if (!in->f) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--load-stats %s: cannot open", path);
    } else if (!in->z || qs_get(in, magic, 8) || memcmp(magic, "LLMIQST1", 8) || qs_get(in, hdr, sizeof hdr)) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "--load-stats %s: not an llmi statistics file", path);
    } else if ((int)hdr[0] != s->n_layers || (int)hdr[1] != s->cols[0] || (int)hdr[2] != s->cols[1] ||
               (int)hdr[3] != s->cols[2] || (int)hdr[4] != s->cols[3]) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--load-stats %s: statistics of a different model (%u layers, dims %u/%u/%u/%u)",
                       path, hdr[0], hdr[1], hdr[2], hdr[3], hdr[4]);
    }
    for (int l = 0; l < s->n_layers && !rc; l++)
        for (int k = 0; k < QS_COUNT && !rc; k++) {
            int n = s->cols[k];
            float *g = s->gram[l][k] = malloc((size_t)n * n * sizeof(float));
            float *x = s->xmean[l][k] = malloc((size_t)n * sizeof(float));
            if (!g || !x) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "--load-stats %s: out of memory", path);
                break;
            }
            if (qs_get(in, x, (size_t)n * sizeof(float))) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "--load-stats %s: truncated or corrupt", path);
                break;
            }
            for (int i = 0; i < n && !rc; i++) {
                if (qs_get(in, g + (size_t)i * n + i, (size_t)(n - i) * sizeof(float)))
                    rc = llmi_fail(st, LLMI_E_RUNTIME, "--load-stats %s: truncated or corrupt", path);
                for (int j = i + 1; j < n && !rc; j++) g[(size_t)j * n + i] = g[(size_t)i * n + j];
            }
            /* a NaN or infinity here would become NaN scales in the quantized model */
            bool finite = true;
            for (size_t i = 0; i < (size_t)n && finite; i++) finite = isfinite(x[i]);
            for (size_t i = 0; i < (size_t)n * n && finite && !rc; i++) finite = isfinite(g[i]);
            if (!rc && !finite)
                rc = llmi_fail(st, LLMI_E_RUNTIME, "--load-stats %s: layer %d holds a non-finite statistic", path, l);
        }
    uint8_t extra;
    if (!rc && qs_get(in, &extra, 1) == 0)
        rc = llmi_fail(st, LLMI_E_RUNTIME, "--load-stats %s: data past the end of the statistics", path);
    if (in->f) fclose(in->f);
    ZSTD_freeDCtx(in->z);
    free(in);
    if (rc) quant_stats_free(s);
    return rc;
}
