/* replay_main.c — runs a fuzz target once on each input file, without libFuzzer: the
 * suite's regression replay of tests/fuzz/corpus/ (built by `make SAN=1 tools`).
 *   build-san/fuzz/fuzz_gguf FILE|DIR...   prints "replayed N inputs" */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "common.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open %s\n", path); return -1; }
    size_t cap = 1 << 16, n = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; }
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) { fprintf(stderr, "replay: out of memory reading %s\n", path); return -1; }
    /* an exact-size copy, so that ASan sees a read one past the input's end */
    uint8_t *exact = malloc(n ? n : 1);
    if (exact) memcpy(exact, buf, n);
    free(buf);
    if (!exact) return -1;
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    long n = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) { fprintf(stderr, "replay: %s: no such file\n", argv[i]); return 2; }
        if (!S_ISDIR(sb.st_mode)) {
            if (replay_file(argv[i])) return 2;
            n++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        char **names = NULL;
        size_t k = 0, cap = 0;
        for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
            if (e->d_name[0] == '.') continue;
            if (k == cap) names = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof *names);
            names[k++] = strdup(e->d_name);
        }
        if (d) closedir(d);
        qsort(names, k, sizeof *names, cmp_str);
        for (size_t j = 0; j < k; j++) {
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], names[j]);
            if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
                if (replay_file(p)) return 2;
                n++;
            }
            free(names[j]);
        }
        free(names);
    }
    printf("replayed %ld inputs\n", n);
    return 0;
}
