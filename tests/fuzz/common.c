/* common.c — scratch files and verdict checks for the fuzz targets (see common.h). */
#include "common.h"
#include "model/model.h"
#include "tok/tokenizer.h"

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

int fuzz_write_pair(const char *dir, const char *name_a, const char *name_b, const uint8_t *data, size_t size) {
    static const char sep[] = "\n#--\n";
    const size_t ls = sizeof sep - 1;
    size_t na = size;
    for (size_t i = 0; i + ls <= size; i++)
        if (!memcmp(data + i, sep, ls)) {
            na = i;
            break;
        }
    char path[1024];
    if (fuzz_write(dir, name_a, data, na, path, sizeof path)) return -1;
    return na == size ? 0 : fuzz_write(dir, name_b, data + na + ls, size - na - ls, path, sizeof path);
}

void fuzz_load_test_model(const char *name, llmi_model *m) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/hf/%s", fuzz_testdata(), name);
    llmi_status st = {0};
    llmi_load_opts lo = {.no_tokenizer = true};
    if (model_load(dir, &lo, m, &st)) {
        fprintf(stderr, "fuzz: %s (run from the repository root or set LLMI_TESTDATA)\n", st.msg);
        abort();
    }
}

void fuzz_model_load(const char *path, bool no_tokenizer) {
    llmi_model m;
    llmi_status st = {0};
    llmi_load_opts o = {.no_tokenizer = no_tokenizer};
    int rc = model_load(path, &o, &m, &st);
    fuzz_check_status(rc, &st);
    if (rc == 0) model_free(&m);
}

void fuzz_tok_exercise(const tokenizer *t) {
    static const char text[] = "Hello world! <|endoftext|><|im_start|> 12345 \xc3\xa9l\xc3\xa0n \xe6\x9d\xb1\xe4\xba\xac"
                               "\xe2\x96\x81 \xff \n\t<s>";
    llmi_status st = {0};
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(t, text, sizeof text - 1, true, true, &ids, &n, &st) == 0) {
        char *out = NULL;
        size_t len = 0;
        if (tok_decode(t, ids, n, false, &out, &len, &st) == 0) free(out);
        free(ids);
    }
    char *chat = NULL;
    llmi_status cst = {0};
    if (tok_chat_format(t, "be brief", "hi", &chat, &cst) == 0) free(chat);
}
