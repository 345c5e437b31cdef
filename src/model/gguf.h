/* gguf.h — owns the GGUF v3 reader: it maps a file, validates the header, every
 * key/value pair and every tensor info against the file's bounds (GGUF v3 as ggml's
 * docs/gguf.md specifies it; ../shared/docs/FORMATS.md "GGUF v3" lists the checks), and
 * answers typed look-ups.  It knows nothing about models; model_gguf.c and tok_gguf.c do.
 *
 * All pointers it hands out point into the read-only mapping and live until gguf_close
 * (or until the caller takes the mapping over with gguf_take_map).  Strings in a GGUF
 * file are not NUL-terminated: they travel as (pointer, length). */
#ifndef LLMI_GGUF_H
#define LLMI_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

/* Value types of a key/value pair (the file's u32 codes). */
typedef enum {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5,
    GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_U64 = 10,
    GGUF_I64 = 11, GGUF_F64 = 12, GGUF_VTYPE_COUNT
} gguf_vtype;

/* ggml tensor type ids this reader knows the block geometry of (every id in use). */
enum { GGUF_TYPE_F32 = 0, GGUF_TYPE_F16 = 1, GGUF_TYPE_Q4_0 = 2, GGUF_TYPE_Q4_1 = 3,
       GGUF_TYPE_Q5_0 = 6, GGUF_TYPE_Q5_1 = 7, GGUF_TYPE_Q8_0 = 8, GGUF_TYPE_Q2_K = 10, GGUF_TYPE_Q3_K = 11, GGUF_TYPE_Q4_K = 12, GGUF_TYPE_Q5_K = 13, GGUF_TYPE_Q6_K = 14, GGUF_TYPE_IQ4_NL = 20, GGUF_TYPE_IQ4_XS = 23, GGUF_TYPE_BF16 = 30,
       GGUF_TYPE_COUNT = 43 };

#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NAME 64          /* tensor names are < 64 bytes, as in ggml */
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_str {
    const char *p;                /* (len) bytes inside the mapping, no NUL */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_vtype type;
    gguf_vtype elem_type;         /* element type when type == GGUF_ARRAY */
    uint64_t n;                   /* element count when type == GGUF_ARRAY, else 1 */
    const uint8_t *val;           /* first byte of the value (or of the first element) */
} gguf_kv;

typedef struct gguf_tensor_info {
    char name[GGUF_MAX_NAME];     /* NUL-terminated copy */
    uint32_t n_dims;
    int64_t dims[GGUF_MAX_DIMS];  /* dims[0] fastest-varying; unused dims are 1 */
    int64_t n_elements;
    uint32_t type;                /* ggml type id, < GGUF_TYPE_COUNT and a known geometry */
    uint64_t offset;              /* relative to the data section */
    uint64_t n_bytes;
    const uint8_t *data;          /* (n_bytes) inside the mapping, bounds-checked */
} gguf_tensor_info;

typedef struct gguf_file {
    char path[1024];
    uint8_t *map;                 /* (size) read-only mapping of the whole file */
    size_t size;
    bool map_owned;               /* false once gguf_take_map handed it over */
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv;                  /* (n_kv) */
    uint64_t n_tensors;
    gguf_tensor_info *tensors;    /* (n_tensors) in file order */
    const gguf_tensor_info **by_name; /* (n_tensors) sorted by name, for look-ups */
    uint64_t alignment;           /* general.alignment, a power of two */
    uint64_t data_start;          /* file offset of the data section */
} gguf_file;

/* Maps and validates path.  On failure g is left closed and st names the file. */
int gguf_open(const char *path, gguf_file *g, llmi_status *st);
void gguf_close(gguf_file *g);
/* Hands the mapping to the caller (who munmaps it); look-ups keep working, and
 * gguf_close then frees only the reader's own arrays. */
void gguf_take_map(gguf_file *g, void **addr, size_t *len);

/* ggml's name for a tensor type ("Q4_1", "Q5_K", ...), "type#N" style for unknown ids. */
const char *gguf_type_name(uint32_t type);
const char *gguf_vtype_name(gguf_vtype t);

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor_info *gguf_find_tensor(const gguf_file *g, const char *name);

/* Typed look-ups.  Each returns 1 when the key is present and has a usable type (value
 * stored), 0 when the key is absent (out untouched), or -LLMI_E_RUNTIME with st filled
 * ("FILE: key K has type T, expected ...") when present but wrong. */
int gguf_get_int(const gguf_file *g, const char *key, int64_t lo, int64_t hi, int64_t *out, llmi_status *st);
int gguf_get_float(const gguf_file *g, const char *key, double *out, llmi_status *st);
int gguf_get_bool(const gguf_file *g, const char *key, bool *out, llmi_status *st);
int gguf_get_str(const gguf_file *g, const char *key, gguf_str *out, llmi_status *st);

/* Arrays.  Output arrays are malloc'ed (caller frees) with *n elements, n <= max_n.
 * Element types are checked: strings must be strings, floats f32/f64, ints any integer
 * type whose every value fits the target. */
int gguf_get_str_array(const gguf_file *g, const char *key, uint64_t max_n, const char ***strs,
                       uint32_t **lens, uint64_t *n, llmi_status *st);
int gguf_get_i32_array(const gguf_file *g, const char *key, uint64_t max_n, int32_t **vals, uint64_t *n,
                       llmi_status *st);
int gguf_get_f32_array(const gguf_file *g, const char *key, uint64_t max_n, float **vals, uint64_t *n,
                       llmi_status *st);
/* Exactly n flags (bools, or integers read as nonzero) into out (n), with the returns of the
 * look-ups above; a present key of another length or type is an error. */
int gguf_get_bool_array(const gguf_file *g, const char *key, bool *out, uint64_t n, llmi_status *st);

/* Undoes the HF->GGUF converter's Q/K row permutation for architecture llama: within
 * each head, GGUF row 2i + t holds HF row t*head_dim/2 + i (t in {0,1}).  src and dst
 * are (n_head*head_dim) rows of row_bytes each and must not overlap. */
void gguf_unpermute_rows(const void *src, void *dst, int64_t n_head, int64_t head_dim, size_t row_bytes);

/* True when s equals the NUL-terminated c. */
bool gguf_str_eq(gguf_str s, const char *c);

#endif
