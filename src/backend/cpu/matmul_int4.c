/* cpu/matmul_int4.c — owns the CPU matmul for LLMI_I4G (GPTQ/AWQ int4) weights: each
 * thread dequantizes a row of W into a private fp32 buffer and dots it with every
 * token, so the weight stays int4 in memory and is read once per call. */
#include <stdlib.h>
#include "core/int4.h"
#include "backend/cpu/matmul_int4.h"

void cpu_matmul_i4g(const llmi_tensor *w, const float *x, int n, const float *bias, float *y) {
    int64_t rows = w->rows, cols = w->cols;
#pragma omp parallel
    {
        float *buf = malloc((size_t)cols * sizeof(float)); /* (cols) one dequantized row */
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            float b = bias ? bias[r] : 0.0f;
            if (!buf) { /* no scratch: dequantize one weight at a time, slower but exact */
                for (int i = 0; i < n; i++) {
                    float acc = 0.0f;
                    for (int64_t k = 0; k < cols; k++) {
                        int g = w->g_idx ? w->g_idx[k] : (int)(k / w->group_size);
                        float s = fp16_to_f32(w->qscales[(size_t)g * rows + r]);
                        int q = (((const uint8_t *)w->data)[(size_t)r * w->row_bytes + k / 2] >> (4 * (k & 1))) & 15;
                        acc += x[(size_t)i * cols + k] * (s * (float)(q - w->qzeros[(size_t)g * rows + r]));
                    }
                    y[(size_t)i * rows + r] = acc + b;
                }
                continue;
            }
            quant_dequant_row(w, r, buf);
            for (int i = 0; i < n; i++) {
                const float *xi = x + (size_t)i * cols;
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int64_t k = 0; k < cols; k++) acc += xi[k] * buf[k];
                y[(size_t)i * rows + r] = acc + b;
            }
        }
        free(buf);
    }
}
