/* TEMPORARY stub so the tree links while the loaders are written; removed by them. */
#include "model.h"
int model_load(const char *p, const llmi_load_opts *o, llmi_model *m, llmi_status *st) { (void)p; (void)o; (void)m; return llmi_fail(st, LLMI_E_RUNTIME, "loader: not built yet"); }
void model_free(llmi_model *m) { (void)m; }
int config_validate(const llmi_config *c, const char *what, llmi_status *st) { (void)c; (void)what; (void)st; return 0; }
