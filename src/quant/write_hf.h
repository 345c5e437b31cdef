/* write_hf.h — owns writing quantized models as Hugging Face directories (write_hf.c). */
#ifndef LLMI_QUANT_WRITE_H
#define LLMI_QUANT_WRITE_H

#include <stdbool.h>
#include "quant/quantize.h"
#include "tok/tokenizer.h"

/* Fails (exit 2) when out exists and force is false. */
int quant_check_outdir(const char *out, bool force, llmi_status *st);
/* The streaming writer: quant_writer_open creates OUT.partXXXXXX beside out, writes the
 * safetensors header (every tensor's place is known from the config), the embeddings,
 * the config and tokenizer files; quant_writer_layer (a quant_layer_sink) writes one
 * layer's tensors as soon as it is quantized; quant_writer_finish renames the directory
 * into place; quant_writer_abort (any failure) removes it.  input is the model's source:
 * an HF directory (config and tokenizer files are taken from it) or a GGUF file (config
 * and tokenizer.json are generated from it). */
typedef struct quant_writer quant_writer;
int quant_writer_open(quant_writer **w, const char *out, bool force, const llmi_model *m, const quant_opts *o,
                      const char *input, llmi_status *st);
int quant_writer_layer(void *w, int layer, quant_grid grids[QL_COUNT], quant_block *b, llmi_status *st);
int quant_writer_finish(quant_writer *w, llmi_status *st);
void quant_writer_abort(quant_writer *w);
/* Bytes the writer holds at most (one packed linear or one chunk of fp16 rows). */
size_t quant_writer_bytes(const llmi_config *c, const quant_opts *o);
/* Writes a whole result (open, every layer, finish). */
int quant_write_hf(const char *out, bool force, const llmi_model *m, const quant_result *r, const quant_opts *o,
                   const char *input, llmi_status *st);
/* tokenizer.json, tokenizer_config.json, generation_config.json from a GGUF's vocabulary. */
int quant_write_gguf_tokenizer(const char *gguf_path, const char *dir, llmi_status *st);
/* rm -r dir (no symlinks followed). */
int quant_rmtree(const char *dir);

#endif
