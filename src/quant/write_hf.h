/* write_hf.h — owns writing quantized models as Hugging Face directories (write_hf.c). */
#ifndef LLMI_QUANT_WRITE_H
#define LLMI_QUANT_WRITE_H

#include <stdbool.h>
#include "quant/quantize.h"
#include "tok/tokenizer.h"

/* Fails (exit 2) when out exists and force is false. */
int quant_check_outdir(const char *out, bool force, llmi_status *st);
/* Writes the whole directory to out (via a temporary directory renamed at the end). input
 * is the model's source: an HF directory (config and tokenizer files are taken from it)
 * or a GGUF file (config and tokenizer.json are generated from it). */
int quant_write_hf(const char *out, bool force, const llmi_model *m, const quant_result *r, const quant_opts *o,
                   const char *input, llmi_status *st);
/* tokenizer.json, tokenizer_config.json, generation_config.json from a GGUF's vocabulary. */
int quant_write_gguf_tokenizer(const char *gguf_path, const char *dir, llmi_status *st);
/* rm -r dir (no symlinks followed). */
int quant_rmtree(const char *dir);

#endif
