/* safetensors.c — safetensors reader: mmap, header validation, look-up (see safetensors.h). */
#include "model/safetensors.h"
#include "core/mapfile.h"
#include "core/utf8.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the safetensors reader assumes a little-endian host"
#endif

static const struct { const char *name; int bits; } st_dtypes[ST_DTYPE_COUNT] = {
    [ST_F64] = {"F64", 64},         [ST_F32] = {"F32", 32},           [ST_F16] = {"F16", 16},
    [ST_BF16] = {"BF16", 16},       [ST_I64] = {"I64", 64},           [ST_I32] = {"I32", 32},
    [ST_I16] = {"I16", 16},         [ST_I8] = {"I8", 8},              [ST_U64] = {"U64", 64},
    [ST_U32] = {"U32", 32},         [ST_U16] = {"U16", 16},           [ST_U8] = {"U8", 8},
    [ST_BOOL] = {"BOOL", 8},        [ST_F8_E4M3] = {"F8_E4M3", 8},    [ST_F8_E5M2] = {"F8_E5M2", 8},
    [ST_F8_E8M0] = {"F8_E8M0", 8},  [ST_F6_E2M3] = {"F6_E2M3", 6},    [ST_F6_E3M2] = {"F6_E3M2", 6},
    [ST_F4] = {"F4", 4},            [ST_C64] = {"C64", 64},
};

const char *safetensors_dtype_name(safetensors_dtype t) {
    return (unsigned)t < ST_DTYPE_COUNT ? st_dtypes[t].name : "unknown";
}

/* Printable, bounded copy of an untrusted name for a one-line error message. */
static const char *clean(const char *s, char *buf, size_t cap) {
    size_t n = 0;
    for (; *s && n + 4 < cap; s++) buf[n++] = ((unsigned char)*s < 0x20 || *s == 0x7f) ? '?' : *s;
    if (*s) { memcpy(buf + n, "...", 3); n += 3; }
    buf[n] = '\0';
    return buf;
}

/* A JSON number that is a whole, non-negative value small enough to be exact in a double. */
static bool json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(((const safetensors_tensor *)a)->name, ((const safetensors_tensor *)b)->name);
}

static int begin_cmp(const void *a, const void *b) {
    const safetensors_tensor *x = *(const safetensors_tensor *const *)a, *y = *(const safetensors_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

/* Fills one tensor entry from its JSON object; the caller checks the layout afterwards. */
static int parse_entry(const char *path, const cJSON *item, safetensors_tensor *t, llmi_status *st) {
    char nbuf[128], dbuf[40];
    const char *name = clean(item->string, nbuf, sizeof nbuf);
    if (!cJSON_IsObject(item))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: needs string dtype, array shape and array data_offsets",
                         path, name);
    int d;
    for (d = 0; d < ST_DTYPE_COUNT; d++)
        if (strcmp(dt->valuestring, st_dtypes[d].name) == 0) break;
    if (d == ST_DTYPE_COUNT)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: unknown dtype %s", path, name,
                         clean(dt->valuestring, dbuf, sizeof dbuf));
    t->dtype = (safetensors_dtype)d;
    int rank = cJSON_GetArraySize(shape);
    if (rank > SAFETENSORS_MAX_DIMS)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: rank %d (limit %d)", path, name, rank,
                         SAFETENSORS_MAX_DIMS);
    t->n_dims = rank;
    uint64_t ne = 1;
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, shape) {
        uint64_t v;
        if (!json_u64(e, &v))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: shape[%d] is not a non-negative integer", path, name, k);
        if (v != 0 && ne > (uint64_t)INT64_MAX / v)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: element count overflows", path, name);
        ne *= v;
        t->shape[k++] = (int64_t)v;
    }
    t->n_elements = (int64_t)ne;
    if (cJSON_GetArraySize(offs) != 2 || !json_u64(cJSON_GetArrayItem(offs, 0), &t->begin) ||
        !json_u64(cJSON_GetArrayItem(offs, 1), &t->end))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: data_offsets must be two non-negative integers", path, name);
    if (t->end < t->begin)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: data_offsets end %llu < begin %llu", path, name,
                         (unsigned long long)t->end, (unsigned long long)t->begin);
    uint64_t bits = (uint64_t)st_dtypes[t->dtype].bits;
    if (ne > UINT64_MAX / bits)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: byte size overflows", path, name);
    if ((ne * bits) % 8 != 0)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: %llu %s values do not fill whole bytes", path, name,
                         (unsigned long long)ne, st_dtypes[t->dtype].name);
    uint64_t want = ne * bits / 8;
    if (t->end - t->begin != want)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: data_offsets span %llu bytes, shape and %s need %llu", path,
                         name, (unsigned long long)(t->end - t->begin), st_dtypes[t->dtype].name,
                         (unsigned long long)want);
    t->name = strdup(item->string);
    if (!t->name) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path);
    return 0;
}

/* JSON values outside strings, counted by their separators: cJSON spends ~64 bytes per
 * value, so a header of "[0,0,0,..." within the 100 MB limit could cost gigabytes.  Real
 * headers hold about 8 values per tensor. */
#define SAFETENSORS_MAX_VALUES 4000000u

static size_t json_value_count(const uint8_t *s, size_t n) {
    size_t count = 0;
    bool in_str = false;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
            count++;
        } else if (c == ',' || c == '[' || c == '{' || c == ':') {
            count++;
        }
    }
    return count;
}

static int parse_header(safetensors_file *f, const uint8_t *hdr, size_t hlen, llmi_status *st) {
    const char *path = f->path;
    /* strict, as Rust's str::from_utf8 that the reference reader uses */
    if (!utf8_valid((const char *)hdr, hlen)) return llmi_fail(st, LLMI_E_RUNTIME, "%s: header is not valid UTF-8", path);
    size_t nv = json_value_count(hdr, hlen);
    if (nv > SAFETENSORS_MAX_VALUES)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: header holds %zu JSON values (limit %u)", path, nv,
                         SAFETENSORS_MAX_VALUES);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)hdr, hlen, &end, false);
    if (!root) return llmi_fail(st, LLMI_E_RUNTIME, "%s: header is not valid JSON", path);
    int rc = 0;
    /* only whitespace may follow the JSON value (writers pad with spaces) */
    for (const char *p = end; p && p < (const char *)hdr + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: header has bytes after its JSON value", path);
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: header is not a JSON object", path);
        goto done;
    }
    int n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(it) && !cJSON_IsNull(it)) {
                rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: __metadata__ is not an object", path);
                goto done;
            }
            const cJSON *m;
            cJSON_ArrayForEach(m, it) {
                if (!cJSON_IsString(m)) {
                    char b[96];
                    rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: __metadata__ value %s is not a string", path,
                                   clean(m->string, b, sizeof b));
                    goto done;
                }
            }
            continue;
        }
        n++;
    }
    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    if (!f->tensors) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path);
        goto done;
    }
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        if ((rc = parse_entry(path, it, &f->tensors[f->n_tensors], st))) goto done;
        f->n_tensors++;
    }
    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, name_cmp);
    for (int i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->tensors[i - 1].name, f->tensors[i].name) == 0) {
            char b[128];
            rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: duplicate tensor %s", path, clean(f->tensors[i].name, b, sizeof b));
            goto done;
        }
    }
done:
    cJSON_Delete(root);
    return rc;
}

/* The data buffer must be covered exactly: sorted by begin, each tensor starts where the
 * previous ended, the first at 0, the last at the end of the file. */
static int check_layout(safetensors_file *f, uint64_t data_start, llmi_status *st) {
    const char *path = f->path;
    safetensors_tensor **order = malloc((f->n_tensors ? (size_t)f->n_tensors : 1) * sizeof *order);
    if (!order) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path);
    for (int i = 0; i < f->n_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->n_tensors, sizeof *order, begin_cmp);
    uint64_t pos = 0;
    int rc = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        if (order[i]->begin != pos) {
            char b[128];
            rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s starts at %llu, expected %llu (%s)", path,
                           clean(order[i]->name, b, sizeof b), (unsigned long long)order[i]->begin, (unsigned long long)pos,
                           order[i]->begin > pos ? "gap" : "overlap");
            goto done;
        }
        pos = order[i]->end;
    }
    if (pos != f->size - data_start) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: tensors cover %llu data bytes but the file holds %llu", path,
                       (unsigned long long)pos, (unsigned long long)(f->size - data_start));
        goto done;
    }
    for (int i = 0; i < f->n_tensors; i++) f->tensors[i].data = f->map + data_start + f->tensors[i].begin;
done:
    free(order);
    return rc;
}

int safetensors_open(const char *path, safetensors_file *f, llmi_status *st) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    if (mapfile_open(path, 8, "safetensors", &f->map, &f->size, st)) return st->code;
    f->map_owned = true;
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    int rc;
    if (hlen > SAFETENSORS_MAX_HEADER) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: header length %llu exceeds the %llu-byte limit", path,
                       (unsigned long long)hlen, SAFETENSORS_MAX_HEADER);
        goto fail;
    }
    if (hlen > f->size - 8) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                       (unsigned long long)hlen, f->size);
        goto fail;
    }
    if ((rc = parse_header(f, f->map + 8, (size_t)hlen, st))) goto fail;
    if ((rc = check_layout(f, 8 + hlen, st))) goto fail;
    return 0;
fail:
    safetensors_close(f);
    return rc;
}

void safetensors_take_map(safetensors_file *f, void **addr, size_t *len) {
    *addr = f->map;
    *len = f->size;
    f->map_owned = false;
}

void safetensors_close(safetensors_file *f) {
    if (f->map && f->map_owned) munmap(f->map, f->size);
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

const safetensors_tensor *safetensors_find(const safetensors_file *f, const char *name) {
    int lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}
