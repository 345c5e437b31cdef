/* backend.c — owns what all backends share beyond the interface: op class names. */
#include "backend.h"

const char *op_class_name(llmi_op_class c) {
    static const char *const names[LLMI_OP_COUNT] = {
        "embed", "norm", "qkv", "rope_kv", "attn", "o_proj",
        "mlp_up", "act", "mlp_down", "lm_head", "sample", "host",
    };
    return (c >= 0 && c < LLMI_OP_COUNT) ? names[c] : "unknown";
}
