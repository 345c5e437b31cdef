/* TEMPORARY stub until the CUDA backend lands; removed by it. */
#include "backend.h"
bool backend_cuda_compiled(void) { return false; }
int backend_cuda_create(const llmi_model *m, const llmi_backend_opts *o, llmi_backend **out, llmi_status *st) { (void)m; (void)o; *out = 0; return llmi_fail(st, LLMI_E_USAGE, "--device cuda: this llmi was built without CUDA"); }
