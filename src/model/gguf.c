/* gguf.c — GGUF v3 reader: mmap, bounds-checked parse, typed look-ups (see gguf.h). */
#include "model/gguf.h"
#include "core/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader assumes a little-endian host"
#endif

/* Hard caps well above any real checkpoint; they keep a lying header from making us
 * allocate or loop beyond what a file of this size could really hold. */
#define GGUF_MAX_KV      (1u << 16)
#define GGUF_MAX_TENSORS (1u << 16)

/* Block geometry of every ggml type id in use (ggml-common.h); 0 = id not in use. */
static const struct { const char *name; uint32_t blck; uint32_t bytes; } gguf_types[GGUF_TYPE_COUNT] = {
    [0] = {"F32", 1, 4},       [1] = {"F16", 1, 2},        [2] = {"Q4_0", 32, 18},
    [3] = {"Q4_1", 32, 20},    [6] = {"Q5_0", 32, 22},     [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},    [9] = {"Q8_1", 32, 36},     [10] = {"Q2_K", 256, 84},
    [11] = {"Q3_K", 256, 110}, [12] = {"Q4_K", 256, 144},  [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210}, [15] = {"Q8_K", 256, 292},  [16] = {"IQ2_XXS", 256, 66},
    [17] = {"IQ2_XS", 256, 74}, [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18}, [21] = {"IQ3_S", 256, 110}, [22] = {"IQ2_S", 256, 82},
    [23] = {"IQ4_XS", 256, 136}, [24] = {"I8", 1, 1},      [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},      [27] = {"I64", 1, 8},       [28] = {"F64", 1, 8},
    [29] = {"IQ1_M", 256, 56}, [30] = {"BF16", 1, 2},      [34] = {"TQ1_0", 256, 54},
    [35] = {"TQ2_0", 256, 66}, [39] = {"MXFP4", 32, 17},   [40] = {"NVFP4", 64, 36},
    [41] = {"Q1_0", 128, 18},  [42] = {"Q2_0", 64, 18},
};

static const char *const gguf_vtype_names[GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t gguf_vtype_size[GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_type_name(uint32_t type) {
    if (type < GGUF_TYPE_COUNT && gguf_types[type].name) return gguf_types[type].name;
    return "unknown";
}

const char *gguf_vtype_name(gguf_vtype t) {
    return (unsigned)t < GGUF_VTYPE_COUNT ? gguf_vtype_names[t] : "unknown";
}

bool gguf_str_eq(gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && memcmp(s.p, c, n) == 0;
}

/* ---------------------------------------------------------------- cursor */

/* A read position in the mapping; every read checks the bytes left first. */
typedef struct gguf_cur {
    const uint8_t *base;
    size_t size;
    size_t pos;
} gguf_cur;

static bool cur_read(gguf_cur *c, void *dst, size_t n) {
    if (n > c->size - c->pos) return false;
    memcpy(dst, c->base + c->pos, n);
    c->pos += n;
    return true;
}

static bool cur_skip(gguf_cur *c, uint64_t n) {
    if (n > c->size - c->pos) return false;
    c->pos += (size_t)n;
    return true;
}

static bool cur_str(gguf_cur *c, gguf_str *s) {
    uint64_t len;
    if (!cur_read(c, &len, 8)) return false;
    if (len > c->size - c->pos) return false;
    s->p = (const char *)c->base + c->pos;
    s->len = len;
    c->pos += (size_t)len;
    return true;
}

/* Printable, bounded form of an untrusted key for error messages. */
static void str_for_msg(gguf_str s, char *buf, size_t cap) {
    size_t n = 0;
    for (uint64_t i = 0; i < s.len && n + 4 < cap; i++) {
        unsigned char ch = (unsigned char)s.p[i];
        buf[n++] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
    }
    if (s.len > n && n + 4 <= cap) { memcpy(buf + n, "...", 3); n += 3; }
    buf[n] = '\0';
}

/* ---------------------------------------------------------------- open */

static int map_file(const char *path, gguf_file *g, llmi_status *st) {
    if (mapfile_open(path, 24, "GGUF", &g->map, &g->size, st)) return st->code;
    g->map_owned = true;
    return 0;
}

static int key_cmp(const void *a, const void *b) {
    const gguf_kv *x = a, *y = b;
    size_t n = x->key.len < y->key.len ? (size_t)x->key.len : (size_t)y->key.len;
    int c = memcmp(x->key.p, y->key.p, n);
    if (c) return c;
    return (x->key.len > y->key.len) - (x->key.len < y->key.len);
}

static int parse_kvs(gguf_file *g, gguf_cur *c, llmi_status *st) {
    const char *path = g->path;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        uint32_t type;
        if (!cur_str(c, &kv->key))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: key/value pair %llu: key runs past the end of the file",
                             path, (unsigned long long)i);
        if (kv->key.len == 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: key/value pair %llu has an empty key", path,
                             (unsigned long long)i);
        char kbuf[96];
        str_for_msg(kv->key, kbuf, sizeof kbuf);
        if (!cur_read(c, &type, 4))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: truncated type", path, kbuf);
        if (type >= GGUF_VTYPE_COUNT)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s has invalid value type %u", path, kbuf, type);
        kv->type = (gguf_vtype)type;
        kv->n = 1;
        kv->elem_type = kv->type;
        if (kv->type == GGUF_ARRAY) {
            uint32_t et;
            uint64_t n;
            if (!cur_read(c, &et, 4) || !cur_read(c, &n, 8))
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: truncated array header", path, kbuf);
            if (et >= GGUF_VTYPE_COUNT || et == GGUF_ARRAY)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: invalid array element type %u", path, kbuf, et);
            kv->elem_type = (gguf_vtype)et;
            kv->n = n;
        }
        kv->val = c->base + c->pos;
        size_t left = c->size - c->pos;
        if (kv->elem_type == GGUF_STRING) {
            /* each string costs at least its 8-byte length: a count the bytes left cannot
             * hold is rejected before the loop, so a lying count neither allocates nor spins */
            if (kv->n > left / 8)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: %llu strings cannot fit in the %zu bytes left",
                                 path, kbuf, (unsigned long long)kv->n, left);
            for (uint64_t j = 0; j < kv->n; j++) {
                gguf_str s;
                if (!cur_str(c, &s))
                    return llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: string %llu runs past the end of the file",
                                     path, kbuf, (unsigned long long)j);
            }
        } else {
            uint64_t es = gguf_vtype_size[kv->elem_type];
            if (kv->n > left / es)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: %llu values of %s run past the end of the file",
                                 path, kbuf, (unsigned long long)kv->n, gguf_vtype_name(kv->elem_type));
            cur_skip(c, kv->n * es);
        }
    }
    /* duplicate keys are invalid (as in ggml): sort a copy of the keys and compare neighbours */
    if (g->n_kv > 1) {
        gguf_kv *sorted = malloc(g->n_kv * sizeof *sorted);
        if (!sorted) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path);
        memcpy(sorted, g->kv, g->n_kv * sizeof *sorted);
        qsort(sorted, g->n_kv, sizeof *sorted, key_cmp);
        for (uint64_t i = 1; i < g->n_kv; i++) {
            if (key_cmp(&sorted[i - 1], &sorted[i]) == 0) {
                char kbuf[96];
                str_for_msg(sorted[i].key, kbuf, sizeof kbuf);
                free(sorted);
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: duplicate key %s", path, kbuf);
            }
        }
        free(sorted);
    }
    return 0;
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp((*(const gguf_tensor_info *const *)a)->name, (*(const gguf_tensor_info *const *)b)->name);
}

static int parse_tensor_infos(gguf_file *g, gguf_cur *c, llmi_status *st) {
    const char *path = g->path;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_info *t = &g->tensors[i];
        gguf_str name;
        if (!cur_str(c, &name))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor info %llu: name runs past the end of the file", path,
                             (unsigned long long)i);
        if (name.len >= GGUF_MAX_NAME)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor info %llu: name is %llu bytes (limit %d)", path,
                             (unsigned long long)i, (unsigned long long)name.len, GGUF_MAX_NAME - 1);
        memcpy(t->name, name.p, (size_t)name.len);
        t->name[name.len] = '\0';
        /* names end up in one-line error messages and in look-ups by C string */
        for (uint64_t k = 0; k < name.len; k++)
            if ((unsigned char)name.p[k] < 0x20 || name.p[k] == 0x7f)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor info %llu: name contains control byte 0x%02x", path,
                                 (unsigned long long)i, (unsigned char)name.p[k]);
        char nbuf[96];
        str_for_msg(name, nbuf, sizeof nbuf);
        if (!cur_read(c, &t->n_dims, 4))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: truncated info", path, nbuf);
        if (t->n_dims > GGUF_MAX_DIMS)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s has %u dimensions (limit %d)", path, nbuf,
                             t->n_dims, GGUF_MAX_DIMS);
        int64_t ne = 1;
        for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
            uint64_t v = 1;
            if (d < t->n_dims && !cur_read(c, &v, 8))
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: truncated info", path, nbuf);
            if (v > (uint64_t)INT64_MAX)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: dimension %u is negative", path, nbuf, d);
            t->dims[d] = (int64_t)v;
            if (v != 0 && ne > INT64_MAX / (int64_t)v)
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: element count overflows", path, nbuf);
            ne *= (int64_t)v;
        }
        t->n_elements = ne;
        if (!cur_read(c, &t->type, 4) || !cur_read(c, &t->offset, 8))
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: truncated info", path, nbuf);
        if (t->type >= GGUF_TYPE_COUNT || !gguf_types[t->type].name)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s has invalid type id %u", path, nbuf, t->type);
        uint64_t blck = gguf_types[t->type].blck, bytes = gguf_types[t->type].bytes;
        if (t->dims[0] % (int64_t)blck != 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: %lld values per row is not a multiple of the %s block (%llu)",
                             path, nbuf, (long long)t->dims[0], gguf_type_name(t->type), (unsigned long long)blck);
        uint64_t nblocks = (uint64_t)ne / blck;
        if (nblocks > UINT64_MAX / bytes)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s: byte size overflows", path, nbuf);
        t->n_bytes = nblocks * bytes;
    }
    /* the name index also finds duplicates, which are invalid (as in ggml) */
    g->by_name = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *g->by_name);
    if (!g->by_name) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path);
    for (uint64_t i = 0; i < g->n_tensors; i++) g->by_name[i] = &g->tensors[i];
    qsort(g->by_name, g->n_tensors, sizeof *g->by_name, tensor_cmp);
    for (uint64_t i = 1; i < g->n_tensors; i++)
        if (strcmp(g->by_name[i - 1]->name, g->by_name[i]->name) == 0)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: duplicate tensor %s", path, g->by_name[i]->name);
    return 0;
}

/* The data section starts at the next multiple of the alignment after the infos, and
 * each tensor sits at the running sum of the padded sizes before it (as ggml checks). */
static int place_tensors(gguf_file *g, size_t infos_end, llmi_status *st) {
    const char *path = g->path;
    uint64_t a = g->alignment;
    if ((uint64_t)infos_end > UINT64_MAX - (a - 1))
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: data section offset overflows", path);
    uint64_t start = ((uint64_t)infos_end + a - 1) & ~(a - 1);
    if (g->n_tensors > 0 && start > g->size)
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: data section starts at %llu, past the end of the file (%zu bytes)",
                         path, (unsigned long long)start, g->size);
    g->data_start = start;
    uint64_t avail = g->size - (g->n_tensors > 0 ? start : 0);
    uint64_t expect = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor_info *t = &g->tensors[i];
        if (t->offset != expect)
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor %s has data offset %llu, expected %llu", path, t->name,
                             (unsigned long long)t->offset, (unsigned long long)expect);
        if (t->n_bytes > avail || t->offset > avail - t->n_bytes)
            return llmi_fail(st, LLMI_E_RUNTIME,
                             "%s: tensor %s: data [%llu, +%llu) runs past the end of the file (%llu data bytes)", path,
                             t->name, (unsigned long long)t->offset, (unsigned long long)t->n_bytes,
                             (unsigned long long)avail);
        t->data = g->map + start + t->offset;
        /* n_bytes <= avail < 2^63 here, so the padding cannot wrap */
        uint64_t padded = (t->n_bytes + a - 1) & ~(a - 1);
        expect += padded;
    }
    return 0;
}

int gguf_open(const char *path, gguf_file *g, llmi_status *st) {
    memset(g, 0, sizeof *g);
    snprintf(g->path, sizeof g->path, "%s", path);
    int rc = map_file(path, g, st);
    if (rc) return rc;
    gguf_cur c = {g->map, g->size, 0};
    char magic[4] = {0};
    cur_read(&c, magic, 4);
    if (memcmp(magic, "GGUF", 4) != 0) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: not a GGUF file (bad magic)", path);
        goto fail;
    }
    cur_read(&c, &g->version, 4);
    /* v2 has the same layout as v3 (v3 only allowed big-endian files); v1 used 32-bit counts */
    if (g->version != 2 && g->version != 3) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: unsupported GGUF version %u (need 3)", path, g->version);
        goto fail;
    }
    cur_read(&c, &g->n_tensors, 8);
    if (!cur_read(&c, &g->n_kv, 8)) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: truncated GGUF header", path);
        goto fail;
    }
    /* a key/value pair takes >= 8+1+4+1 bytes and a tensor info >= 8+1+4+4+8 */
    if (g->n_kv > GGUF_MAX_KV || g->n_kv > (g->size - c.pos) / 14) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: key/value count %llu is impossible for a %zu-byte file", path,
                       (unsigned long long)g->n_kv, g->size);
        goto fail;
    }
    if (g->n_tensors > GGUF_MAX_TENSORS || g->n_tensors > (g->size - c.pos) / 25) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: tensor count %llu is impossible for a %zu-byte file", path,
                       (unsigned long long)g->n_tensors, g->size);
        goto fail;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", path);
        goto fail;
    }
    if ((rc = parse_kvs(g, &c, st))) goto fail;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *akv = gguf_find_kv(g, "general.alignment");
    if (akv) {
        uint32_t a;
        if (akv->type != GGUF_U32) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: general.alignment has type %s, expected u32", path,
                           gguf_vtype_name(akv->type));
            goto fail;
        }
        memcpy(&a, akv->val, 4);
        if (a == 0 || (a & (a - 1)) != 0) {
            rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: general.alignment %u is not a power of two", path, a);
            goto fail;
        }
        g->alignment = a;
    }
    if ((rc = parse_tensor_infos(g, &c, st))) goto fail;
    if ((rc = place_tensors(g, c.pos, st))) goto fail;
    return 0;
fail:
    gguf_close(g);
    return rc;
}

void gguf_take_map(gguf_file *g, void **addr, size_t *len) {
    *addr = g->map;
    *len = g->size;
    g->map_owned = false;
}

void gguf_close(gguf_file *g) {
    if (g->map && g->map_owned) munmap(g->map, g->size);
    free(g->kv);
    free(g->tensors);
    free(g->by_name);
    memset(g, 0, sizeof *g);
}

/* ---------------------------------------------------------------- look-ups */

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (gguf_str_eq(g->kv[i].key, key)) return &g->kv[i];
    return NULL;
}

const gguf_tensor_info *gguf_find_tensor(const gguf_file *g, const char *name) {
    size_t lo = 0, hi = (size_t)g->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->by_name[mid]->name, name);
        if (c == 0) return g->by_name[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

static bool is_int_type(gguf_vtype t) {
    return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 || t == GGUF_U32 || t == GGUF_I32 ||
           t == GGUF_U64 || t == GGUF_I64;
}

/* Reads one integer element; false when it cannot be represented as int64. */
static bool load_int(gguf_vtype t, const uint8_t *p, int64_t *out) {
    switch (t) {
    case GGUF_U8: { uint8_t v; memcpy(&v, p, 1); *out = v; return true; }
    case GGUF_I8: { int8_t v; memcpy(&v, p, 1); *out = v; return true; }
    case GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_I16: { int16_t v; memcpy(&v, p, 2); *out = v; return true; }
    case GGUF_U32: { uint32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_I32: { int32_t v; memcpy(&v, p, 4); *out = v; return true; }
    case GGUF_I64: { int64_t v; memcpy(&v, p, 8); *out = v; return true; }
    case GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)v;
        return true;
    }
    default: return false;
    }
}

static int wrong_type(const gguf_file *g, const char *key, const gguf_kv *kv, const char *want, llmi_status *st) {
    if (kv->type == GGUF_ARRAY)
        llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s is an array of %s, expected %s", g->path, key,
                  gguf_vtype_name(kv->elem_type), want);
    else
        llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s has type %s, expected %s", g->path, key, gguf_vtype_name(kv->type),
                  want);
    return -LLMI_E_RUNTIME;
}

int gguf_get_int(const gguf_file *g, const char *key, int64_t lo, int64_t hi, int64_t *out, llmi_status *st) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return 0;
    int64_t v;
    if (kv->type == GGUF_ARRAY || !is_int_type(kv->type)) return wrong_type(g, key, kv, "an integer", st);
    if (!load_int(kv->type, kv->val, &v) || v < lo || v > hi) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s is out of range [%lld, %lld]", g->path, key, (long long)lo,
                  (long long)hi);
        return -LLMI_E_RUNTIME;
    }
    *out = v;
    return 1;
}

int gguf_get_float(const gguf_file *g, const char *key, double *out, llmi_status *st) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return 0;
    if (kv->type == GGUF_F32) {
        float f;
        memcpy(&f, kv->val, 4);
        *out = f;
    } else if (kv->type == GGUF_F64) {
        memcpy(out, kv->val, 8);
    } else {
        return wrong_type(g, key, kv, "a float", st);
    }
    return 1;
}

int gguf_get_bool(const gguf_file *g, const char *key, bool *out, llmi_status *st) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_BOOL) return wrong_type(g, key, kv, "bool", st);
    *out = kv->val[0] != 0;
    return 1;
}

int gguf_get_str(const gguf_file *g, const char *key, gguf_str *out, llmi_status *st) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_STRING) return wrong_type(g, key, kv, "string", st);
    gguf_cur c = {kv->val, (size_t)(g->map + g->size - kv->val), 0};
    cur_str(&c, out); /* validated by gguf_open */
    return 1;
}

static int array_head(const gguf_file *g, const char *key, uint64_t max_n, const gguf_kv **out, llmi_status *st) {
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv) return 0;
    if (kv->type != GGUF_ARRAY) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s has type %s, expected an array", g->path, key,
                  gguf_vtype_name(kv->type));
        return -LLMI_E_RUNTIME;
    }
    if (kv->n > max_n) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s has %llu elements (limit %llu)", g->path, key,
                  (unsigned long long)kv->n, (unsigned long long)max_n);
        return -LLMI_E_RUNTIME;
    }
    *out = kv;
    return 1;
}

int gguf_get_str_array(const gguf_file *g, const char *key, uint64_t max_n, const char ***strs, uint32_t **lens,
                       uint64_t *n, llmi_status *st) {
    const gguf_kv *kv;
    int rc = array_head(g, key, max_n, &kv, st);
    if (rc <= 0) return rc;
    if (kv->elem_type != GGUF_STRING) return wrong_type(g, key, kv, "an array of string", st);
    const char **s = malloc((kv->n ? kv->n : 1) * sizeof *s);
    uint32_t *l = malloc((kv->n ? kv->n : 1) * sizeof *l);
    if (!s || !l) {
        free(s);
        free(l);
        llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory reading %s", g->path, key);
        return -LLMI_E_RUNTIME;
    }
    gguf_cur c = {kv->val, (size_t)(g->map + g->size - kv->val), 0};
    for (uint64_t i = 0; i < kv->n; i++) {
        gguf_str e = {0};
        cur_str(&c, &e); /* validated by gguf_open */
        if (e.len > UINT32_MAX) {
            free(s);
            free(l);
            llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: string %llu is too long", g->path, key,
                      (unsigned long long)i);
            return -LLMI_E_RUNTIME;
        }
        s[i] = e.p;
        l[i] = (uint32_t)e.len;
    }
    *strs = s;
    *lens = l;
    *n = kv->n;
    return 1;
}

int gguf_get_i32_array(const gguf_file *g, const char *key, uint64_t max_n, int32_t **vals, uint64_t *n,
                       llmi_status *st) {
    const gguf_kv *kv;
    int rc = array_head(g, key, max_n, &kv, st);
    if (rc <= 0) return rc;
    if (!is_int_type(kv->elem_type)) return wrong_type(g, key, kv, "an array of integers", st);
    int32_t *v = malloc((kv->n ? kv->n : 1) * sizeof *v);
    if (!v) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory reading %s", g->path, key);
        return -LLMI_E_RUNTIME;
    }
    size_t es = gguf_vtype_size[kv->elem_type];
    for (uint64_t i = 0; i < kv->n; i++) {
        int64_t x;
        if (!load_int(kv->elem_type, kv->val + i * es, &x) || x < INT32_MIN || x > INT32_MAX) {
            free(v);
            llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: element %llu does not fit in int32", g->path, key,
                      (unsigned long long)i);
            return -LLMI_E_RUNTIME;
        }
        v[i] = (int32_t)x;
    }
    *vals = v;
    *n = kv->n;
    return 1;
}

int gguf_get_bool_array(const gguf_file *g, const char *key, bool *out, uint64_t n, llmi_status *st) {
    const gguf_kv *kv;
    int rc = array_head(g, key, n, &kv, st);
    if (rc <= 0) return rc;
    if (kv->elem_type != GGUF_BOOL && !is_int_type(kv->elem_type)) return wrong_type(g, key, kv, "an array of bools", st);
    if (kv->n != n) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s has %llu elements, expected one per layer (%llu)", g->path, key,
                  (unsigned long long)kv->n, (unsigned long long)n);
        return -LLMI_E_RUNTIME;
    }
    size_t es = gguf_vtype_size[kv->elem_type];
    for (uint64_t i = 0; i < n; i++) {
        int64_t x = kv->val[i] != 0;   /* GGUF_BOOL: one byte */
        if (kv->elem_type != GGUF_BOOL && !load_int(kv->elem_type, kv->val + i * es, &x)) {
            llmi_fail(st, LLMI_E_RUNTIME, "%s: key %s: element %llu is not readable", g->path, key,
                      (unsigned long long)i);
            return -LLMI_E_RUNTIME;
        }
        out[i] = x != 0;
    }
    return 1;
}

int gguf_get_f32_array(const gguf_file *g, const char *key, uint64_t max_n, float **vals, uint64_t *n,
                       llmi_status *st) {
    const gguf_kv *kv;
    int rc = array_head(g, key, max_n, &kv, st);
    if (rc <= 0) return rc;
    if (kv->elem_type != GGUF_F32 && kv->elem_type != GGUF_F64) return wrong_type(g, key, kv, "an array of f32", st);
    float *v = malloc((kv->n ? kv->n : 1) * sizeof *v);
    if (!v) {
        llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory reading %s", g->path, key);
        return -LLMI_E_RUNTIME;
    }
    for (uint64_t i = 0; i < kv->n; i++) {
        if (kv->elem_type == GGUF_F32) {
            memcpy(&v[i], kv->val + i * 4, 4);
        } else {
            double d;
            memcpy(&d, kv->val + i * 8, 8);
            /* out-of-range double -> float conversion is undefined behaviour */
            v[i] = d > FLT_MAX ? INFINITY : d < -FLT_MAX ? -INFINITY : (float)d;
        }
    }
    *vals = v;
    *n = kv->n;
    return 1;
}

void gguf_unpermute_rows(const void *src, void *dst, int64_t n_head, int64_t head_dim, size_t row_bytes) {
    const uint8_t *s = src;
    uint8_t *d = dst;
    int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t t = 0; t < 2; t++)
            for (int64_t i = 0; i < half; i++)
                memcpy(d + (size_t)(h * head_dim + t * half + i) * row_bytes,
                       s + (size_t)(h * head_dim + 2 * i + t) * row_bytes, row_bytes);
}
