/* gptq_awq_load.c — owns reading GPTQ (v1 "gptq", v2 "gptq_v2"; sym/asym; act-order g_idx)
 * and AWQ-GEMM linear layers into LLMI_I4G tensors, after checking that config.json's
 * quantization_config agrees with every tensor's dtype and shape. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "model/gptq_awq.h"
#include "model/safetensors.h"

static int ql_int(const cJSON *o, const char *a, const char *b, int def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (!v && b) v = cJSON_GetObjectItemCaseSensitive(o, b);
    if (!v) return def;
    /* range first: converting a double outside int's range is undefined behaviour */
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !(d >= -1e9 && d <= 1e9) || d != (double)(int)d) return -999999;
    return (int)d;
}

static int ql_bool(const cJSON *o, const char *a, bool def, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v)) return -1;
    *out = cJSON_IsTrue(v);
    return 0;
}

int quant_config_parse(const cJSON *qc, quant_config *out, const char *what, llmi_status *st) {
    memset(out, 0, sizeof *out);
    if (!cJSON_IsObject(qc)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: quantization_config is not an object", what);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    if (!cJSON_IsString(m)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: quantization_config has no quant_method", what);
    bool awq = strcasecmp(m->valuestring, "awq") == 0;
    if (!awq && strcasecmp(m->valuestring, "gptq") != 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: quant_method %.40s is not supported (gptq, awq)", what,
                         m->valuestring);
    out->bits = ql_int(qc, "bits", "w_bit", -1);
    if (out->bits != 4)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: quantization_config bits %d is not supported (only 4)", what,
                         out->bits);
    out->group_size = ql_int(qc, "group_size", "q_group_size", -1);
    if (out->group_size <= 0 || out->group_size % 8 != 0 || out->group_size > (1 << 20))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: quantization_config group_size %d is not supported (a positive "
                         "multiple of 8; per-channel -1 is not)", what, out->group_size);
    if (ql_bool(qc, "desc_act", false, &out->desc_act) || ql_bool(qc, "sym", !awq, &out->sym) ||
        ql_bool(qc, "lm_head", false, &out->lm_head))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: quantization_config desc_act/sym/lm_head must be booleans", what);
    if (out->lm_head)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: a quantized lm_head is not supported", what);
    if (awq) {
        out->format = QUANT_FMT_AWQ_GEMM;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(qc, "version");
        if (v && (!cJSON_IsString(v) || strcasecmp(v->valuestring, "gemm") != 0))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: AWQ version %.20s is not supported (only gemm)", what,
                             cJSON_IsString(v) ? v->valuestring : "?");
        bool zp;
        if (ql_bool(qc, "zero_point", true, &zp) || !zp)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: AWQ without zero_point is not supported", what);
        out->sym = false;
        out->desc_act = false;
    } else {
        out->format = QUANT_FMT_GPTQ;
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(qc, "checkpoint_format");
        if (f) {
            if (cJSON_IsString(f) && strcmp(f->valuestring, "gptq_v2") == 0)
                out->format = QUANT_FMT_GPTQ_V2;
            else if (!cJSON_IsString(f) || strcmp(f->valuestring, "gptq") != 0)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: GPTQ checkpoint_format %.20s is not supported (gptq, "
                                 "gptq_v2)", what, cJSON_IsString(f) ? f->valuestring : "?");
        }
    }
    return 0;
}

/* Finds prefix.suffix and checks dtype and 2-D shape; copies it to an aligned buffer. */
static int ql_get(quant_find_fn find, void *ctx, const char *prefix, const char *suffix, safetensors_dtype dt,
                  int64_t d0, int64_t d1, bool optional, void **out, const quant_config *qc, llmi_status *st) {
    char name[256];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    *out = NULL;
    const safetensors_tensor *t = find(ctx, name);
    if (!t) {
        if (optional) return 0;
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: missing tensor %s (quantization_config says %s)", prefix, name,
                         qc->format == QUANT_FMT_AWQ_GEMM ? "awq" : "gptq");
    }
    int want_dims = d1 < 0 ? 1 : 2;
    if (t->dtype != dt)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s is %s, expected %s", name, suffix,
                         safetensors_dtype_name(t->dtype), safetensors_dtype_name(dt));
    if (t->n_dims != want_dims || t->shape[0] != d0 || (want_dims == 2 && t->shape[1] != d1))
        return llmi_fail(st, LLMI_E_RUNTIME,
                         "%s: shape [%lld, %lld] disagrees with quantization_config (bits %d, group_size %d): "
                         "expected [%lld, %lld]",
                         name, (long long)t->shape[0], t->n_dims > 1 ? (long long)t->shape[1] : 0LL, qc->bits,
                         qc->group_size, (long long)d0, (long long)(d1 < 0 ? 0 : d1));
    size_t es = dt == ST_F16 ? 2 : 4;
    size_t n = (size_t)d0 * (size_t)(d1 < 0 ? 1 : d1) * es;
    if (t->end - t->begin != n) return llmi_fail(st, LLMI_E_RUNTIME, "%s: byte size does not match its shape", name);
    *out = malloc(n ? n : 1);
    if (!*out) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", name);
    memcpy(*out, t->data, n);
    return 0;
}

int quant_load_linear(const quant_config *qc, quant_find_fn find, void *ctx, const char *prefix, int64_t rows,
                      int64_t cols, llmi_tensor *t, llmi_status *st) {
    int gs = qc->group_size;
    if (rows % 8 || cols % 8 || cols % gs || rows > (1 << 24) || cols > (1 << 24))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: a %lldx%lld layer cannot hold int4 groups of %d (quantization_config)",
                         prefix, (long long)rows, (long long)cols, gs);
    int64_t ng = cols / gs;
    void *qw = NULL, *qz = NULL, *sc = NULL, *gi = NULL;
    bool awq = qc->format == QUANT_FMT_AWQ_GEMM;
    int rc;
    if (awq)
        rc = ql_get(find, ctx, prefix, "qweight", ST_I32, cols, rows / 8, false, &qw, qc, st);
    else
        rc = ql_get(find, ctx, prefix, "qweight", ST_I32, cols / 8, rows, false, &qw, qc, st);
    if (!rc) rc = ql_get(find, ctx, prefix, "qzeros", ST_I32, ng, rows / 8, false, &qz, qc, st);
    if (!rc) rc = ql_get(find, ctx, prefix, "scales", ST_F16, ng, rows, false, &sc, qc, st);
    if (!rc && !awq) rc = ql_get(find, ctx, prefix, "g_idx", ST_I32, cols, -1, !qc->desc_act, &gi, qc, st);
    quant_grid g = {0};
    if (!rc) rc = quant_grid_alloc(&g, (int)rows, (int)cols, gs, gi != NULL, st);
    if (!rc) {
        if (awq)
            quant_unpack_awq(qw, qz, sc, &g);
        else
            rc = quant_unpack_gptq(qw, qz, sc, gi, qc->format == QUANT_FMT_GPTQ, &g, prefix, st);
    }
    /* g_idx that is just k / group_size needs no lookup table at run time */
    if (!rc && g.g_idx) {
        bool trivial = true;
        for (int64_t k = 0; k < cols && trivial; k++) trivial = g.g_idx[k] == k / gs;
        if (trivial) {
            free(g.g_idx);
            g.g_idx = NULL;
        }
    }
    if (!rc) rc = quant_tensor_from_grid(&g, t, st);
    quant_grid_free(&g);
    free(qw), free(qz), free(sc), free(gi);
    return rc;
}
