/* dtype.c — owns the names of llmi's storage types (for reports and error messages). */
#include "core/dtype.h"

const char *dtype_name(llmi_dtype t) {
    switch (t) {
    case LLMI_F32: return "F32";
    case LLMI_F16: return "F16";
    case LLMI_BF16: return "BF16";
    case LLMI_Q8_0: return "Q8_0";
    case LLMI_Q4_0: return "Q4_0";
    case LLMI_Q4_1: return "Q4_1";
    case LLMI_I4G: return "I4G";
    default: return "unknown";
    }
}
