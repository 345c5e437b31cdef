/* model_dummy.h — owns the built-in presets of `--dummy` (real published hyper-parameters);
 * a config.json spec is read by config_json_read, as a model directory's is.
 * model_load_dummy itself is declared in model.h. */
#ifndef LLMI_MODEL_DUMMY_H
#define LLMI_MODEL_DUMMY_H

#include "model/model.h"

/* Comma-separated list of the preset names, for help and error messages. */
const char *model_dummy_preset_names(void);
/* The configuration a --dummy spec (preset or config.json path) describes, without weights. */
int model_dummy_config(const char *spec, llmi_config *c, llmi_status *st);

#endif
