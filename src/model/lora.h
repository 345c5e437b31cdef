/* lora.h — owns merging LoRA adapters into a loaded model's weights, from either of the
 * two files adapters travel in:
 *   - a PEFT adapter directory (adapter_config.json and adapter_model.safetensors, as PEFT's
 *     save_pretrained writes them and vLLM reads them), merged the way PEFT's
 *     merge_and_unload does: W += scale * s * B A, s = lora_alpha / r (lora_alpha / sqrt(r)
 *     with use_rslora);
 *   - a GGUF adapter (llama.cpp's convert_lora_to_gguf.py: general.type "adapter"), with
 *     llama.cpp's llama_adapter_lora meaning: s = alpha / r per pair (1 when alpha is 0),
 *     factors F32/F16/BF16/Q8_0, a llama adapter's Q/K rows in the converter's permuted order.
 * llama.cpp's --lora and --lora-scaled name the flags; unlike llama.cpp and vLLM, which keep
 * the adapter apart and add its product at run time, the merge costs nothing per token and
 * needs nothing of the backends, but needs a weight that can hold the sum: f32, f16 and bf16
 * linears take it in place, quantized ones (GGUF, int4) are dequantized into bf16 first, so
 * an adapted linear of a 4-bit model takes 16 bits a weight.  Weights are held in Hugging
 * Face names and row order (model.c un-permutes a llama GGUF's Q/K rows), so a GGUF
 * adapter's B rows are un-permuted the same way.
 *
 * The adapter is untrusted input like a model file: every field, name, shape and value is
 * checked before the first weight changes, and anything the merge would not reproduce
 * exactly (DoRA, fan_in_fan_out, trained biases, modules_to_save, per-module ranks,
 * embedding, lm_head or norm adapters, activated LoRA) is refused by name. */
#ifndef LLMI_LORA_H
#define LLMI_LORA_H

#include "core/status.h"
#include "model/model.h"

/* Merges the adapter at path (a PEFT directory or a GGUF file) into m's linears with the
 * user's scale (1 for --lora). */
int model_merge_lora(llmi_model *m, const char *path, float scale, llmi_status *st);

#endif
