/* safetensors.h — owns the safetensors reader: it maps one file, validates the header
 * exactly as huggingface/safetensors does (../shared/docs/FORMATS.md "safetensors") and
 * finds tensors by name.  Pointers it hands out live until safetensors_close (or until the caller takes
 * the mapping over with safetensors_take_map). */
#ifndef LLMI_SAFETENSORS_H
#define LLMI_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

#define SAFETENSORS_MAX_HEADER 100000000ull  /* the reference reader's limit */
#define SAFETENSORS_MAX_DIMS 4

typedef enum {
    ST_F64 = 0, ST_F32, ST_F16, ST_BF16, ST_I64, ST_I32, ST_I16, ST_I8, ST_U64, ST_U32, ST_U16, ST_U8,
    ST_BOOL, ST_F8_E4M3, ST_F8_E5M2, ST_F8_E8M0, ST_F6_E2M3, ST_F6_E3M2, ST_F4, ST_C64, ST_DTYPE_COUNT
} safetensors_dtype;

typedef struct safetensors_tensor {
    char *name;                          /* NUL-terminated, owned */
    safetensors_dtype dtype;
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS]; /* row-major, shape[0] slowest */
    int64_t n_elements;
    uint64_t begin, end;                 /* [begin, end) relative to the data buffer */
    const uint8_t *data;                 /* (end - begin) bytes inside the mapping */
} safetensors_tensor;

typedef struct safetensors_file {
    char path[1024];
    uint8_t *map;                        /* (size) read-only mapping of the whole file */
    size_t size;
    bool map_owned;                      /* false once safetensors_take_map handed it over */
    int n_tensors;
    safetensors_tensor *tensors;         /* (n_tensors) sorted by name */
} safetensors_file;

int safetensors_open(const char *path, safetensors_file *f, llmi_status *st);
void safetensors_close(safetensors_file *f);
void safetensors_take_map(safetensors_file *f, void **addr, size_t *len);
const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name);
const char *safetensors_dtype_name(safetensors_dtype t);

#endif
