/* lora.h — owns merging LoRA adapters into a loaded model's weights: a PEFT adapter
 * directory (adapter_config.json and adapter_model.safetensors, as PEFT's save_pretrained
 * writes them and vLLM and llama.cpp's converter read them) applied the way PEFT's
 * merge_and_unload does, W += scale * s * B A for every adapted linear, s = lora_alpha / r
 * (lora_alpha / sqrt(r) with use_rslora).  llama.cpp's --lora and --lora-scaled name the
 * flags; unlike llama.cpp and vLLM, which keep the adapter apart and add its product at run
 * time, the merge costs nothing per token and needs nothing of the backends, but needs a
 * weight that can hold the sum: f32, f16 and bf16 linears take it in place, quantized ones
 * (GGUF, int4) are dequantized into bf16 first, so an adapted linear of a 4-bit model
 * takes 16 bits a weight.  Adapters use Hugging Face names and row order, which the GGUF
 * loader restores (model.c un-permutes Q/K).
 *
 * The adapter is untrusted input like a model file: every field, name, shape and value is
 * checked before the first weight changes, and anything the merge would not reproduce
 * exactly (DoRA, fan_in_fan_out, trained biases, modules_to_save, per-module ranks,
 * embedding or lm_head adapters) is refused by name. */
#ifndef LLMI_LORA_H
#define LLMI_LORA_H

#include "core/status.h"
#include "model/model.h"

/* Merges the adapter in dir into m's linears with the user's scale (1 for --lora). */
int model_merge_lora(llmi_model *m, const char *dir, float scale, llmi_status *st);

#endif
