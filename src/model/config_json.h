/* config_json.h — owns reading a Hugging Face config.json into llmi_config: the one reader
 * behind a model directory (model_hf.c) and `--dummy config.json` (model_dummy.c), so
 * the two can never read the same file two ways.
 *
 * It reads config.json as transformers does: model_type picks the family (AutoConfig:
 * llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, gemma2, gemma3_text); architectures[0]
 * stands in only where model_type is absent, and must agree where both are given.  Absent
 * fields take the defaults of that family's config class (rms_norm_eps 1e-6,
 * max_position_embeddings, num_key_value_heads, head_dim, Gemma's sliding_window 4096 and
 * Gemma 2's soft caps 50 and 30).  Sliding windows are read where the family applies one
 * (Mistral's sliding_window, default 4096; Qwen2/Qwen3 only with use_sliding_window, on the
 * layers of layer_types or past max_window_layers; Gemma's sliding layers), into
 * sliding_window and layer_sliding; max_ctx stays the model's.  The result is
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
