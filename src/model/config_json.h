/* config_json.h — owns reading a Hugging Face config.json into llmi_config: the one reader
 * behind a model directory (model_hf.c) and `--dummy config.json` (model_dummy.c), so
 * the two can never read the same file two ways.
 *
 * It reads config.json as transformers does: model_type picks the family (AutoConfig);
 * architectures[0] stands in only where model_type is absent, and must agree where both
 * are given.  Absent fields take the defaults of transformers' LlamaConfig,
 * MistralConfig or Qwen2Config (rms_norm_eps 1e-6; max_position_embeddings 2048,
 * 131072, 32768; num_key_value_heads n_heads, 8, 32).  Sliding-window attention is not
 * implemented: where the family applies a window (Mistral's sliding_window, default 4096;
 * Qwen2's only with use_sliding_window on layers past max_window_layers), max_ctx is
 * capped to it, the range where full attention gives the same result.  The result is
 * checked by config_validate. */
#ifndef LLMI_CONFIG_JSON_H
#define LLMI_CONFIG_JSON_H

#include "model/model.h"

struct cJSON;

/* Reads path (named by flag, e.g. "--dummy", or NULL when a loader found it) into c.
 * root, when not NULL, receives the parsed document for the caller's own keys
 * (quantization_config, _name_or_path); the caller frees it with cJSON_Delete. */
int config_json_read(const char *path, const char *flag, llmi_config *c, struct cJSON **root, llmi_status *st);

#endif
