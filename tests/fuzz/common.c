/* common.c — scratch files and verdict checks for the fuzz targets (see common.h). */
#include "common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fuzz_scratch(char *dir, size_t cap) {
    const char *tmp = getenv("TMPDIR");
    if (snprintf(dir, cap, "%s/llmi-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp") >= (int)cap) return -1;
    return mkdtemp(dir) ? 0 : -1;
}

void fuzz_scratch_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d)) != NULL;) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

int fuzz_write(const char *dir, const char *name, const void *data, size_t size, char *path, size_t cap) {
    if (snprintf(path, cap, "%s/%s", dir, name) >= (int)cap) return -1;
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = size ? fwrite(data, 1, size, f) : 0;
    return (fclose(f) == 0 && w == size) ? 0 : -1;
}

void fuzz_check_status(int rc, const llmi_status *st) {
    if (getenv("LLMI_FUZZ_VERBOSE")) fprintf(stderr, "fuzz: rc=%d %s\n", rc, rc ? st->msg : "accepted");
    if (rc == 0) return;
    if (st->code == LLMI_OK || st->msg[0] == '\0' || strchr(st->msg, '\n')) {
        fprintf(stderr, "fuzz: failure without one clear line: rc=%d code=%d msg='%s'\n", rc, st->code, st->msg);
        abort();
    }
}

const char *fuzz_testdata(void) {
    const char *t = getenv("LLMI_TESTDATA");
    return t && *t ? t : "testdata";
}

void fuzz_split(const uint8_t *data, size_t size, const uint8_t **a, size_t *na, const uint8_t **b, size_t *nb) {
    static const char sep[] = "\n#--\n";
    const size_t ls = sizeof sep - 1;
    *a = data, *na = size, *b = NULL, *nb = 0;
    for (size_t i = 0; i + ls <= size; i++)
        if (!memcmp(data + i, sep, ls)) {
            *na = i, *b = data + i + ls, *nb = size - i - ls;
            return;
        }
}
