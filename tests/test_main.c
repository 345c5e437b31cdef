/* test_main.c — runs every registered unit test (or those named on the command line)
 * and ends with the summary line "N passed, N failed". */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "test.h"

#define MAX_TESTS 1024
typedef struct { const char *name; test_fn fn; } test_entry;
static test_entry g_tests[MAX_TESTS];   /* filled by constructors before main; read-only after */
static int g_n_tests;

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

unsigned long long test_seed(void) {
    const char *e = getenv("LLMI_TEST_SEED");
    if (e) return strtoull(e, NULL, 10);
    return (unsigned long long)time(NULL) ^ 0x9E3779B97F4A7C15ull;
}

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const test_entry *)a)->name, ((const test_entry *)b)->name);
}

int main(int argc, char **argv) {
    qsort(g_tests, (size_t)g_n_tests, sizeof g_tests[0], cmp_entry);
    int passed = 0, failed = 0;
    for (int i = 0; i < g_n_tests; i++) {
        if (argc > 1) {
            int want = 0;
            for (int a = 1; a < argc; a++) want |= strstr(g_tests[i].name, argv[a]) != NULL;
            if (!want) continue;
        }
        test_ctx t = {0, g_tests[i].name};
        g_tests[i].fn(&t);
        printf("%s %s\n", t.failures ? "FAIL" : "ok  ", g_tests[i].name);
        fflush(stdout);
        if (t.failures) failed++; else passed++;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
