/* cpu/embed.c — owns the token embedding lookup (any weight dtype). */
#include "backend/cpu/ops.h"

void cpu_embed(const llmi_tensor *embd, const int32_t *tokens, int n, float *out) {
    int64_t dim = embd->cols;
#pragma omp parallel for schedule(static) if (n > 8)
    for (int i = 0; i < n; i++) tensor_dequant_row(embd, tokens[i], out + (size_t)i * dim);
}
