/* prompt_cache.c — K/V blocks on disk across runs (see prompt_cache.h).
 *
 * Entry file DIR/<hash>.kvb, little-endian:
 *   magic "LLMIKVB1" | u32 version | u32 header bytes | model fingerprint (16) |
 *   u32 kv dtype | u32 block size | u32 n_layers | u32 n_kv_heads | u32 head_dim | u32 0 |
 *   block hash (16) | u64 K/V bytes | u64 compressed bytes | u64 XXH3-64 of the K/V bytes |
 *   tokens (block_size x i32) | one zstd frame of the K/V bytes
 * The K/V bytes are the backend's kv_read_block layout. */
#include "engine/prompt_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define PC_MAGIC "LLMIKVB1"
#define PC_VERSION 1u
#define PC_FIXED_HEADER 96    /* bytes before the tokens */
#define PC_ZSTD_LEVEL 1       /* K/V of activations compresses little; speed matters more */

struct prompt_cache {
    char dir[1024];
    size_t max_bytes;         /* 0 = no cap */
    size_t dir_bytes;         /* entries' total size as this process last knew it */
    llmi_backend *backend;
    kv_hash model_fp;
    int block_size;
    size_t kv_bytes;          /* K/V bytes of one block */
    size_t file_cap;          /* largest valid entry: header + tokens + zstd bound */
    void *raw;                /* (kv_bytes) one block's K/V */
    void *file;               /* (file_cap) one entry as read or to be written */
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    bool write_failed;        /* warned once; no more writes this run */
    prompt_cache_stats stats;
};

static void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get_u32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void hash_file_identity(XXH3_state_t *s, const char *path) {
    struct stat sb;
    char real[4096];
    const char *name = realpath(path, real) ? real : path;
    XXH3_128bits_update(s, name, strlen(name));
    if (stat(path, &sb) == 0) {
        int64_t id[3] = {(int64_t)sb.st_size, (int64_t)sb.st_mtim.tv_sec, (int64_t)sb.st_mtim.tv_nsec};
        XXH3_128bits_update(s, id, sizeof id);
    }
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

kv_hash prompt_cache_model_fingerprint(const llmi_model *m) {
    XXH3_state_t *s = XXH3_createState();
    if (!s) return (kv_hash){0, 0};
    XXH3_128bits_reset(s);
    XXH3_128bits_update(s, m->format, strnlen(m->format, sizeof m->format));
    if (!strcmp(m->format, "dummy")) {
        /* synthetic weights are a function of the spec and the dtype */
        XXH3_128bits_update(s, m->source_path, strnlen(m->source_path, sizeof m->source_path));
        int dt = m->layers ? (int)m->layers[0].wq.dtype : -1;
        XXH3_128bits_update(s, &dt, sizeof dt);
    } else if (!strcmp(m->format, "safetensors")) {
        /* every file of the directory that holds weights or configuration, in name order */
        DIR *d = opendir(m->source_path);
        char *names[256];
        int n = 0;
        for (struct dirent *e; d && (e = readdir(d)) != NULL && n < 256;) {
            size_t len = strlen(e->d_name);
            bool weights = len > 12 && !strcmp(e->d_name + len - 12, ".safetensors");
            bool json = len > 5 && !strcmp(e->d_name + len - 5, ".json");
            if ((weights || json) && (names[n] = strdup(e->d_name)) != NULL) n++;
        }
        if (d) closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_names);
        for (int i = 0; i < n; i++) {
            char path[2048];
            snprintf(path, sizeof path, "%s/%s", m->source_path, names[i]);
            hash_file_identity(s, path);
            free(names[i]);
        }
    } else {
        hash_file_identity(s, m->source_path);
    }
    XXH3_128bits_update(s, &m->cfg, sizeof m->cfg);
    /* merged LoRA adapters change the weights: their files and scales, in order */
    for (int i = 0; i < m->n_lora; i++) {
        char path[2048];
        if (m->lora[i].is_file) {
            hash_file_identity(s, m->lora[i].path);
        } else {
            snprintf(path, sizeof path, "%s/adapter_config.json", m->lora[i].path);
            hash_file_identity(s, path);
            snprintf(path, sizeof path, "%s/adapter_model.safetensors", m->lora[i].path);
            hash_file_identity(s, path);
        }
        XXH3_128bits_update(s, &m->lora[i].scale, sizeof m->lora[i].scale);
    }
    /* control vectors change every later layer's K and V: each layer's own, whatever files made it */
    for (int l = 0; l < m->cfg.n_layers; l++)
        if (m->layers[l].control) {
            XXH3_128bits_update(s, &l, sizeof l);
            XXH3_128bits_update(s, m->layers[l].control, (size_t)m->cfg.dim * sizeof(float));
        }
    XXH128_hash_t h = XXH3_128bits_digest(s);
    XXH3_freeState(s);
    return (kv_hash){h.low64, h.high64};
}

static void entry_path(const prompt_cache *pc, kv_hash h, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%016llx%016llx.kvb", pc->dir, (unsigned long long)h.hi, (unsigned long long)h.lo);
}

static bool is_entry_name(const char *name) {
    size_t len = strlen(name);
    return len == 36 && !strcmp(name + 32, ".kvb") && strspn(name, "0123456789abcdef") == 32;
}

/* Sum of the entries' sizes; with evict, deletes the oldest until under 90% of the cap. */
typedef struct pc_entry { char name[40]; time_t mtime; long nsec; size_t size; } pc_entry;
static int cmp_age(const void *a, const void *b) {
    const pc_entry *x = a, *y = b;
    if (x->mtime != y->mtime) return x->mtime < y->mtime ? -1 : 1;
    return x->nsec < y->nsec ? -1 : x->nsec > y->nsec;
}

static void scan_dir(prompt_cache *pc, bool evict) {
    DIR *d = opendir(pc->dir);
    if (!d) return;
    pc_entry *list = NULL;
    size_t n = 0, cap = 0, total = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!is_entry_name(e->d_name)) continue;
        char path[2048];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", pc->dir, e->d_name);
        if (stat(path, &sb) != 0) continue;
        total += (size_t)sb.st_size;
        if (!evict) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 256;
            pc_entry *nl = realloc(list, nc * sizeof *nl);
            if (!nl) break;
            list = nl, cap = nc;
        }
        snprintf(list[n].name, sizeof list[n].name, "%.39s", e->d_name);   /* 36 chars: is_entry_name */
        list[n].mtime = sb.st_mtim.tv_sec, list[n].nsec = sb.st_mtim.tv_nsec, list[n].size = (size_t)sb.st_size;
        n++;
    }
    closedir(d);
    if (evict && pc->max_bytes && total > pc->max_bytes) {
        qsort(list, n, sizeof *list, cmp_age);
        size_t target = pc->max_bytes / 10 * 9;
        for (size_t i = 0; i < n && total > target; i++) {
            char path[2048];
            snprintf(path, sizeof path, "%s/%s", pc->dir, list[i].name);
            if (unlink(path) == 0) {
                total -= list[i].size;
                pc->stats.evicted++;
            }
        }
    }
    free(list);
    pc->dir_bytes = total;
}

int prompt_cache_open(const char *dir, size_t max_bytes, llmi_backend *b, kv_hash salt, prompt_cache **out,
                      llmi_status *st) {
    *out = NULL;
    (void)salt;
    if (!b->kv_read_block || !b->kv_write_block)
        return llmi_fail(st, LLMI_E_USAGE, "--prompt-cache: the %s backend cannot move K/V to the host", b->name);
    if (strlen(dir) >= 1000) return llmi_fail(st, LLMI_E_USAGE, "--prompt-cache: directory path too long");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return llmi_fail(st, LLMI_E_USAGE, "--prompt-cache %s: cannot create it (%s)", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return llmi_fail(st, LLMI_E_USAGE, "--prompt-cache %s: not a directory", dir);
    if (access(dir, R_OK | W_OK | X_OK) != 0)
        return llmi_fail(st, LLMI_E_USAGE, "--prompt-cache %s: not readable and writable", dir);
    prompt_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return llmi_fail(st, LLMI_E_RUNTIME, "--prompt-cache: out of memory");
    snprintf(pc->dir, sizeof pc->dir, "%s", dir);
    pc->max_bytes = max_bytes;
    pc->backend = b;
    pc->model_fp = prompt_cache_model_fingerprint(b->model);
    pc->block_size = b->opts.block_size;
    pc->kv_bytes = b->kv_block_bytes(b);
    pc->file_cap = PC_FIXED_HEADER + (size_t)pc->block_size * 4 + ZSTD_compressBound(pc->kv_bytes);
    pc->raw = malloc(pc->kv_bytes);
    pc->file = malloc(pc->file_cap);
    pc->cctx = ZSTD_createCCtx();
    pc->dctx = ZSTD_createDCtx();
    if (!pc->raw || !pc->file || !pc->cctx || !pc->dctx) {
        size_t bytes = pc->kv_bytes;
        prompt_cache_close(pc);
        return llmi_fail(st, LLMI_E_RUNTIME, "--prompt-cache: out of memory for a %zu-byte block", bytes);
    }
    ZSTD_CCtx_setParameter(pc->cctx, ZSTD_c_compressionLevel, PC_ZSTD_LEVEL);
    scan_dir(pc, true);
    *out = pc;
    return LLMI_OK;
}

void prompt_cache_close(prompt_cache *pc) {
    if (!pc) return;
    free(pc->raw);
    free(pc->file);
    ZSTD_freeCCtx(pc->cctx);
    ZSTD_freeDCtx(pc->dctx);
    free(pc);
}

prompt_cache_stats prompt_cache_get_stats(const prompt_cache *pc) {
    return pc ? pc->stats : (prompt_cache_stats){0};
}

static void fill_header(const prompt_cache *pc, unsigned char *p, kv_hash h, uint64_t comp, uint64_t sum) {
    const llmi_config *c = &pc->backend->model->cfg;
    memset(p, 0, PC_FIXED_HEADER);
    memcpy(p, PC_MAGIC, 8);
    put_u32(p + 8, PC_VERSION);
    put_u32(p + 12, (uint32_t)(PC_FIXED_HEADER + (size_t)pc->block_size * 4));
    put_u64(p + 16, pc->model_fp.lo);
    put_u64(p + 24, pc->model_fp.hi);
    put_u32(p + 32, (uint32_t)pc->backend->opts.kv_dtype);
    put_u32(p + 36, (uint32_t)pc->block_size);
    put_u32(p + 40, (uint32_t)c->n_layers);
    put_u32(p + 44, (uint32_t)c->n_kv_heads);
    put_u32(p + 48, (uint32_t)c->head_dim);
    put_u64(p + 56, h.lo);
    put_u64(p + 64, h.hi);
    put_u64(p + 72, pc->kv_bytes);
    put_u64(p + 80, comp);
    put_u64(p + 88, sum);
}

/* Reads entry h into pc->raw; returns 0 when absent (no warning), 1 when valid, -1 when
 * invalid (warned about and removed). */
static int read_entry(prompt_cache *pc, kv_hash h, const int32_t *tokens) {
    char path[2048];
    entry_path(pc, h, path, sizeof path);
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) return 0;
    const char *why = NULL;
    struct stat sb;
    size_t tok_bytes = (size_t)pc->block_size * 4, head = PC_FIXED_HEADER + tok_bytes;
    unsigned char *p = pc->file;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) why = "not a regular file";
    else if ((size_t)sb.st_size < head) why = "truncated";
    else if ((size_t)sb.st_size > pc->file_cap) why = "larger than any valid entry";
    else if (read(fd, p, (size_t)sb.st_size) != (ssize_t)sb.st_size) why = "unreadable";
    close(fd);
    unsigned char want[PC_FIXED_HEADER];
    if (!why) {
        fill_header(pc, want, h, 0, 0);
        uint64_t comp = get_u64(p + 80);
        if (memcmp(p, PC_MAGIC, 8) || get_u32(p + 8) != PC_VERSION) why = "not an llmi prompt-cache entry of this version";
        else if (memcmp(p + 16, want + 16, 16)) why = "made by another model";
        else if (memcmp(p + 32, want + 32, 4)) why = "made with another KV dtype";
        else if (memcmp(p + 36, want + 36, 4) || get_u32(p + 12) != head) why = "made with another block size";
        else if (memcmp(p + 40, want + 40, 12)) why = "K/V shapes differ from the model's";
        else if (memcmp(p + 56, want + 56, 16) || memcmp(p + PC_FIXED_HEADER, tokens, tok_bytes))
            why = "holds other tokens than its name says";
        else if (get_u64(p + 72) != pc->kv_bytes) why = "K/V size differs from the model's";
        else if (comp != (uint64_t)sb.st_size - head) why = "truncated";
        else {
            size_t got = ZSTD_decompressDCtx(pc->dctx, pc->raw, pc->kv_bytes, p + head, (size_t)comp);
            if (ZSTD_isError(got) || got != pc->kv_bytes) why = "its compressed K/V is corrupt";
            else if (XXH3_64bits(pc->raw, pc->kv_bytes) != get_u64(p + 88)) why = "fails its checksum";
        }
    }
    if (why) {
        fprintf(stderr, "llmi: --prompt-cache: ignoring %s (%s); recomputing it\n", path, why);
        unlink(path);
        pc->stats.rejected++;
        return -1;
    }
    /* A hit makes the entry the most recently used. */
    utimensat(AT_FDCWD, path, NULL, 0);
    return 1;
}

int prompt_cache_extend(prompt_cache *pc, kvcache *kv, kvcache_table *t, const int32_t *tokens, int n_tokens) {
    const int bs = kv->block_size, max_blocks = (n_tokens - 1) / bs;
    if (!pc || !kv->prefix_cache || bs != pc->block_size) return t->n_blocks * bs;
    while (t->n_blocks < max_blocks && kvcache_available(kv) > 0) {
        int i = t->n_blocks;
        kv_hash parent = i == 0 ? kv->salt : t->hashes[i - 1];
        kv_hash h = kvcache_chain(parent, tokens + (size_t)i * bs, bs);
        if (read_entry(pc, h, tokens + (size_t)i * bs) != 1) break;
        if (kvcache_reserve(kv, t, (i + 1) * bs) != 0) break;
        llmi_status st = {0};
        if (pc->backend->kv_write_block(pc->backend, t->blocks[i], pc->raw, &st)) {
            fprintf(stderr, "llmi: --prompt-cache: %s; recomputing\n", st.msg);
            kvcache_shrink(kv, t, i);
            break;
        }
        kvcache_commit_full(kv, t, tokens, (i + 1) * bs);
        pc->stats.hits++;
    }
    return t->n_blocks * bs;
}

static bool write_entry(prompt_cache *pc, kv_hash h, int block, const int32_t *tokens, const char *path) {
    llmi_status st = {0};
    if (pc->backend->kv_read_block(pc->backend, block, pc->raw, &st)) {
        fprintf(stderr, "llmi: --prompt-cache: %s; not writing to %s any more\n", st.msg, pc->dir);
        return false;
    }
    size_t tok_bytes = (size_t)pc->block_size * 4, head = PC_FIXED_HEADER + tok_bytes;
    unsigned char *p = pc->file;
    size_t comp = ZSTD_compress2(pc->cctx, p + head, pc->file_cap - head, pc->raw, pc->kv_bytes);
    if (ZSTD_isError(comp)) {
        fprintf(stderr, "llmi: --prompt-cache: compression failed (%s); not writing any more\n", ZSTD_getErrorName(comp));
        return false;
    }
    fill_header(pc, p, h, comp, XXH3_64bits(pc->raw, pc->kv_bytes));
    memcpy(p + PC_FIXED_HEADER, tokens, tok_bytes);
    /* Another process may write the same entry at once: each writes its own temporary
     * file and the renames replace each other atomically with equal content. */
    char tmp[2100];
    snprintf(tmp, sizeof tmp, "%s/.tmp.%ld.%016llx", pc->dir, (long)getpid(), (unsigned long long)h.lo);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0644);
    bool ok = fd >= 0;
    size_t total = head + comp, done = 0;
    while (ok && done < total) {
        ssize_t w = write(fd, p + done, total - done);
        if (w <= 0) ok = false; else done += (size_t)w;
    }
    if (fd >= 0 && close(fd) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        int err = errno;
        unlink(tmp);
        fprintf(stderr, "llmi: --prompt-cache %s: cannot write an entry (%s); not writing any more\n", pc->dir,
                strerror(err));
        return false;
    }
    pc->dir_bytes += total;
    pc->stats.writes++;
    return true;
}

void prompt_cache_store(prompt_cache *pc, const kvcache_table *t, int from, const int32_t *tokens) {
    if (!pc || pc->write_failed) return;
    const int bs = pc->block_size;
    for (int i = from; i < t->n_hashed; i++) {
        char path[2048];
        entry_path(pc, t->hashes[i], path, sizeof path);
        if (access(path, F_OK) == 0) continue;
        if (!write_entry(pc, t->hashes[i], t->blocks[i], tokens + (size_t)i * bs, path)) {
            pc->write_failed = true;
            return;
        }
    }
    if (pc->max_bytes && pc->dir_bytes > pc->max_bytes) scan_dir(pc, true);
}
