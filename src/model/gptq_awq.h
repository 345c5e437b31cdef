/* gptq_awq.h — owns reading GPTQ (v1/v2) and AWQ-GEMM checkpoints: config.json's
 * quantization_config and the qweight/qzeros/scales/g_idx tensors of each linear, into
 * LLMI_I4G tensors (core/int4.h). */
#ifndef LLMI_GPTQ_AWQ_H
#define LLMI_GPTQ_AWQ_H

#include <stdbool.h>
#include <stdint.h>
#include "core/int4.h"
#include "core/status.h"
#include "core/tensor.h"

typedef enum { QUANT_FMT_GPTQ = 0, QUANT_FMT_GPTQ_V2, QUANT_FMT_AWQ_GEMM } quant_format;
typedef struct quant_config {
    quant_format format;
    int bits;
    int group_size;          /* -1 in the file ("per channel") is rejected */
    bool desc_act;
    bool sym;
    bool lm_head;
} quant_config;
struct cJSON;
/* Parses config.json's quantization_config object; what names the file for errors. */
int quant_config_parse(const struct cJSON *qc, quant_config *out, const char *what, llmi_status *st);
struct safetensors_tensor;
typedef const struct safetensors_tensor *(*quant_find_fn)(void *ctx, const char *name);
/* Reads prefix.{qweight,qzeros,scales[,g_idx]} for a linear layer of shape (rows, cols)
 * and fills t (LLMI_I4G, owned), checking every shape and dtype against qc. */
int quant_load_linear(const quant_config *qc, quant_find_fn find, void *ctx, const char *prefix, int64_t rows,
                      int64_t cols, llmi_tensor *t, llmi_status *st);

#endif
