/* TEMPORARY stub until synthetic weights land; removed by their author. */
#include "model.h"
int model_load_dummy(const char *spec, llmi_dtype dtype, llmi_model *m, llmi_status *st) { (void)spec; (void)dtype; (void)m; return llmi_fail(st, LLMI_E_RUNTIME, "--dummy: not built yet"); }
