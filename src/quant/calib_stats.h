/* quant_stats.h — owns the calibration statistics of a run (per layer and per input set
 * q/k/v, o, gate/up, down: the Gram matrix X^T X / n and mean |x| of the linear inputs),
 * and their zstd file (--save-stats / --load-stats) so a re-run with other settings
 * skips the calibration forward. */
#ifndef LLMI_QUANT_STATS_H
#define LLMI_QUANT_STATS_H

#include "model/model.h"
#include "core/status.h"

enum { QS_ATTN = 0, QS_O, QS_MLP, QS_DOWN, QS_COUNT };

typedef struct quant_stats {
    int n_layers;
    int cols[QS_COUNT];             /* input dim of each set: dim, heads*head_dim, dim, ffn */
    float *(*gram)[QS_COUNT];       /* (n_layers, QS_COUNT) -> (cols, cols) X^T X / n, or NULL */
    float *(*xmean)[QS_COUNT];      /* (n_layers, QS_COUNT) -> (cols) mean |x| */
} quant_stats;

int quant_stats_init(quant_stats *s, const llmi_config *c, llmi_status *st);
void quant_stats_free(quant_stats *s);
int quant_stats_save(const char *path, const quant_stats *s, llmi_status *st);
/* Fails when the file's shapes are not those of c. */
int quant_stats_load(const char *path, const llmi_config *c, quant_stats *s, llmi_status *st);

#endif
