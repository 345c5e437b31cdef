/* TEMPORARY stub so the tree links while the CPU backend is written; removed by it. */
#include "backend.h"
#include "tensor.h"
#include "cpu/ops.h"
int backend_cpu_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st) { (void)m; (void)o; *out = 0; return llmi_fail(st, LLMI_E_RUNTIME, "cpu backend: not built yet"); }
void tensor_dequant_row(const llmi_tensor *t, int64_t r, float *out) { (void)t; (void)r; (void)out; }
const char *dtype_name(llmi_dtype t) { (void)t; return "?"; }
const char *op_class_name(llmi_op_class c) { (void)c; return "?"; }
