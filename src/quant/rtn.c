/* quant_rtn.c — owns round-to-nearest quantization, the baseline GPTQ and AWQ must beat. */
#include "quant/quant.h"

int quant_rtn(const float *w, int rows, int cols, int group_size, bool sym, quant_style style, quant_grid *g,
              llmi_status *st) {
    if (quant_grid_alloc(g, rows, cols, group_size, false, st)) return st->code;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        for (int gi = 0; gi < g->n_groups; gi++) {
            uint16_t sh;
            uint8_t z;
            quant_group_params(wr + (size_t)gi * group_size, group_size, sym, style, &sh, &z);
            g->scales[(size_t)gi * rows + r] = sh;
            g->zeros[(size_t)gi * rows + r] = z;
            float s = fp16_to_f32(sh);
            for (int k = gi * group_size; k < (gi + 1) * group_size; k++)
                g->q[(size_t)r * cols + k] = (uint8_t)quant_q(wr[k], s, z);
        }
    }
    return 0;
}
