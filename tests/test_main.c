/* test_main.c — runs every registered unit test (or those whose name contains one of
 * the command-line words), prints the run's seed first and ends with the summary line
 * "N passed, N failed, N skipped". */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "test.h"
#include "core/fileio.h"
#include "tok/tokenizer.h"

#define MAX_TESTS 1024
typedef struct { const char *name; test_fn fn; } test_entry;
static test_entry g_tests[MAX_TESTS];   /* filled by constructors before main; read-only after */
static int g_n_tests;
static unsigned long long g_seed;       /* set once at the start of main; read-only after */

void test_register(const char *name, test_fn fn) {
    if (g_n_tests < MAX_TESTS) g_tests[g_n_tests++] = (test_entry){name, fn};
}

double test_nmse(const float *a, const float *ref, long n) {
    double num = 0, den = 0;
    for (long i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? num / den : num;
}

unsigned long long test_seed(void) { return g_seed; }

int test_load_hf(const char *name, llmi_model *m, llmi_status *st) {
    const char *td = getenv("TESTDATA");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/hf/%s", td && *td ? td : "testdata", name);
    llmi_load_opts lo = {.no_tokenizer = true};
    return model_load(dir, &lo, m, st);
}

void test_random_tokens(int32_t *tokens, int n, int n_vocab) {
    unsigned long long s = g_seed;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((s >> 33) % (unsigned long long)n_vocab);
    }
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const test_entry *)a)->name, ((const test_entry *)b)->name);
}

int main(int argc, char **argv) {
    const char *e = getenv("LLMI_TEST_SEED");
    if (e) g_seed = strtoull(e, NULL, 10);
    else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_seed = ((unsigned long long)ts.tv_sec * 1000000007ull ^ (unsigned long long)ts.tv_nsec) % 1000000000000ull;
    }
    printf("seed %llu (replay with LLMI_TEST_SEED=%llu)\n", g_seed, g_seed);
    qsort(g_tests, (size_t)g_n_tests, sizeof g_tests[0], cmp_entry);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < g_n_tests; i++) {
        if (argc > 1) {
            int want = 0;
            for (int a = 1; a < argc; a++) want |= strstr(g_tests[i].name, argv[a]) != NULL;
            if (!want) continue;
        }
        test_ctx t = {0, 0, g_tests[i].name};
        g_tests[i].fn(&t);
        /* A test that failed before it skipped is a failure. */
        const char *tag = t.failures ? "FAIL" : t.skipped ? "skip" : "ok  ";
        printf("%s %s\n", tag, g_tests[i].name);
        fflush(stdout);
        if (t.failures) failed++;
        else if (t.skipped) skipped++;
        else passed++;
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

const char *test_data_path(char *buf, size_t cap, const char *rel) {
    const char *td = getenv("TESTDATA");
    snprintf(buf, cap, "%s/%s", td && *td ? td : "testdata", rel);
    return buf;
}

struct tokenizer *test_smollm2_tokenizer(llmi_status *st) {
    char dir[1024];
    tokenizer *tk = NULL;
    return tok_load_hf(test_data_path(dir, sizeof dir, "tokenizer/smollm2"), &tk, st) ? NULL : tk;
}

char *test_read_text(const char *path) {
    char *buf = NULL;
    size_t len = 0;
    llmi_status st = {0};
    fileio_opts fo = {.max_bytes = (size_t)64 << 20};
    return fileio_read(path, &fo, &buf, &len, &st) ? NULL : buf;
}
