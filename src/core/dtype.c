/* dtype.c — owns the names of llmi's storage types (for reports, flags and error messages). */
#include <string.h>
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
    case LLMI_Q4_K: return "Q4_K";
    case LLMI_Q5_K: return "Q5_K";
    case LLMI_Q6_K: return "Q6_K";
    case LLMI_Q5_0: return "Q5_0";
    case LLMI_Q5_1: return "Q5_1";
    case LLMI_Q3_K: return "Q3_K";
    case LLMI_IQ4_NL: return "IQ4_NL";
    case LLMI_IQ4_XS: return "IQ4_XS";
    case LLMI_Q2_K: return "Q2_K";
    default: return "unknown";
    }
}

static const char *const kv_names[LLMI_KV_DTYPE_COUNT] = {"f32", "f16", "bf16", "q8", "fp8"};

const char *kv_dtype_name(llmi_kv_dtype t) { return t >= 0 && t < LLMI_KV_DTYPE_COUNT ? kv_names[t] : "?"; }

int kv_dtype_parse(const char *s, llmi_kv_dtype *out) {
    for (int i = 0; i < LLMI_KV_DTYPE_COUNT; i++)
        if (!strcmp(s, kv_names[i])) {
            *out = (llmi_kv_dtype)i;
            return 0;
        }
    return -1;
}
