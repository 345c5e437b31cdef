/* control_vector.h — owns llama.cpp's control vectors: GGUF files of per-layer directions
 * (tensors "direction.N", 1-d F32 of the model's hidden size, as llama-cvector-generator and
 * repeng write them) added to the residual stream after decoder layer N, as llama.cpp's
 * --control-vector, --control-vector-scaled and --control-vector-layer-range do
 * (common_control_vector_load, llama_adapter_cvec):
 *   - each file's directions times its scale, summed over the files (and over repeated
 *     layers within one file);
 *   - layer N (0-based) gets direction N for N in [START, END] (default 1 and n_layers, so
 *     every layer but the first); there is never one for layer 0;
 *   - the vector joins the layer's output: h_{N+1} = h_N + block_N(h_N) + v_N.
 * Unlike a LoRA adapter it changes no weight: the backends add layers[N].control per token,
 * so it works on every weight type.
 *
 * The files are untrusted: every tensor name, type, shape and value is checked, and a
 * direction for a layer the model does not have, a layer 0 direction, sizes that differ from
 * the model's or between files, a range that reaches no direction, and a file with no
 * directions are refused by name, where llama.cpp would skip or ignore some of them. */
#ifndef LLMI_CONTROL_VECTOR_H
#define LLMI_CONTROL_VECTOR_H

#include "core/status.h"
#include "model/model.h"

/* Adds the n files' directions (paths[i] scaled by scales[i]) to m's layers start..end
 * (inclusive; 0 or less: the defaults above), setting layers[l].control.  Nothing in m
 * changes unless every file checks out. */
int model_add_control_vectors(llmi_model *m, const char *const *paths, const float *scales, int n, int start, int end,
                              llmi_status *st);

#endif
