#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include "model/control_vector.h"
#include "model/gguf.h"

/* The layer of a tensor named "direction.N" (N decimal digits and nothing after), else -1. */
static long direction_layer(const char *name) {
    static const char prefix[] = "direction.";
    if (strncmp(name, prefix, sizeof prefix - 1)) return -1;
    const char *p = name + sizeof prefix - 1;
    if (!isdigit((unsigned char)*p)) return -1;
    long v = 0;
    for (; isdigit((unsigned char)*p); p++)
        if ((v = v * 10 + (*p - '0')) > 1L << 24) return -1;
    return *p ? -1 : v;
}

/* One file's directions times scale into file (n_layers, dim), zeroed first; has[N] set for
 * each layer N it names. */
static int read_file(const llmi_model *m, const char *path, float scale, float *file, bool *has, llmi_status *st) {
    const int dim = m->cfg.dim, n_layers = m->cfg.n_layers;
    gguf_file g;
    if (gguf_open(path, &g, st)) {
        char why[sizeof st->msg];
        snprintf(why, sizeof why, "%s", st->msg);
        llmi_status_clear(st);
        return llmi_fail(st, LLMI_E_USAGE, "--control-vector %s", why);
    }
    memset(file, 0, (size_t)n_layers * dim * sizeof *file);
    gguf_str arch = {0};
    int rc = gguf_get_str(&g, "general.architecture", &arch, st);
    if (rc < 0) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s", path);
    } else if (rc > 0 && !gguf_str_eq(arch, "controlvector")) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: not a control vector (general.architecture is \"%.*s\", "
                       "not \"controlvector\")", path, (int)(arch.len < 40 ? arch.len : 40), arch.p);
    } else if (g.n_tensors == 0) {
        rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: no direction tensors in the file", path);
    } else {
        rc = 0;
    }
    for (uint64_t i = 0; i < g.n_tensors && !rc; i++) {
        const gguf_tensor_info *t = &g.tensors[i];
        const long layer = direction_layer(t->name);
        if (layer < 0)
            rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: tensor \"%s\" is not a direction (direction.N, N a "
                           "layer number)", path, t->name);
        else if (layer == 0)
            rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: %s: layer 0 takes no control vector (directions "
                           "start at 1)", path, t->name);
        else if (t->type != GGUF_TYPE_F32 || t->n_dims != 1)
            rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: %s must be a 1-d F32 tensor (is %u-d %s)", path,
                           t->name, t->n_dims, gguf_type_name(t->type));
        else if (t->dims[0] != dim)
            rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: %s has %lld values; the model's hidden size is %d",
                           path, t->name, (long long)t->dims[0], dim);
        else if (layer >= n_layers)
            rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: %s is for layer %ld; the model has layers 0..%d "
                           "(the file is for a deeper model)", path, t->name, layer, n_layers - 1);
        for (int j = 0; j < dim && !rc; j++) {
            float v;
            memcpy(&v, t->data + (size_t)j * sizeof v, sizeof v);   /* the data section need not be aligned */
            if (!isfinite(v))
                rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector %s: %s value %d is not finite", path, t->name, j);
            /* llama.cpp's sum: several tensors for one layer add up */
            file[(size_t)layer * dim + j] += v * scale;
        }
        if (!rc) has[layer] = true;
    }
    gguf_close(&g);
    return rc;
}

int model_add_control_vectors(llmi_model *m, const char *const *paths, const float *scales, int n, int start, int end,
                              llmi_status *st) {
    const int dim = m->cfg.dim, n_layers = m->cfg.n_layers;
    if (n <= 0) return llmi_fail(st, LLMI_E_USAGE, "--control-vector-layer-range: no --control-vector to apply");
    if (start <= 0) start = 1;
    if (end <= 0) end = n_layers;
    if (start > end)
        return llmi_fail(st, LLMI_E_USAGE, "--control-vector-layer-range: START %d is after END %d", start, end);
    const size_t cells = (size_t)n_layers * dim;
    float *sum = calloc(cells, sizeof *sum), *file = malloc(cells * sizeof *file);
    bool *has = calloc((size_t)n_layers, sizeof *has);
    int rc = sum && file && has ? 0 : llmi_fail(st, LLMI_E_RUNTIME, "--control-vector: out of memory");
    for (int i = 0; i < n && !rc; i++) {
        if ((rc = read_file(m, paths[i], scales[i], file, has, st))) break;
        for (size_t k = 0; k < cells; k++) sum[k] += file[k];   /* file by file, as llama.cpp sums them */
    }
    int applied = 0;
    for (int l = start; l <= end && l < n_layers && !rc; l++) {
        if (!has[l]) continue;
        for (int j = 0; j < dim && !rc; j++)
            if (!isfinite(sum[(size_t)l * dim + j]))
                rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector: layer %d's scaled sum overflows float (a scale is "
                               "far too large)", l);
        applied++;
    }
    if (!rc && applied == 0)
        rc = llmi_fail(st, LLMI_E_USAGE, "--control-vector-layer-range %d %d: no direction of the file%s falls in it "
                       "(the model has layers 0..%d)", start, end, n > 1 ? "s" : "", n_layers - 1);
    /* Checked: now set the layers (only running out of memory can stop it half way, and then
     * the caller ends anyway). */
    for (int l = start; l <= end && l < n_layers && !rc; l++) {
        if (!has[l]) continue;
        const float *v = sum + (size_t)l * dim;
        llmi_layer *L = &m->layers[l];
        if (!L->control) {
            if (!(L->control = malloc((size_t)dim * sizeof *L->control))) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "--control-vector: out of memory");
                break;
            }
            memcpy(L->control, v, (size_t)dim * sizeof *v);
        } else {
            for (int j = 0; j < dim; j++) L->control[j] += v[j];
        }
    }
    free(sum), free(file), free(has);
    return rc;
}
