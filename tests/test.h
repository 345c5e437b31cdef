/* test.h — owns the unit-test registry: TEST(name) defines a test that registers
 * itself at start-up; CHECK(...) records a failure with file and line and goes on;
 * SKIP(...) ends a test that cannot run here (a missing device or file) and counts it as
 * skipped, never as passed: tests/run.sh fails the suite on a skip unless LLMI_ALLOW_SKIP=1. */
#ifndef LLMI_TEST_H
#define LLMI_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "model/model.h"

typedef struct test_ctx { int failures; int skipped; const char *name; } test_ctx;
typedef void (*test_fn)(test_ctx *);
void test_register(const char *name, test_fn fn);

#define TEST(name)                                                            \
    static void test_##name(test_ctx *t_);                                    \
    __attribute__((constructor)) static void test_reg_##name(void) {         \
        test_register(#name, test_##name);                                    \
    }                                                                         \
    static void test_##name(test_ctx *t_)

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            t_->failures++;                                                   \
        }                                                                     \
    } while (0)

#define CHECK_MSG(cond, ...)                                                  \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            t_->failures++;                                                   \
        }                                                                     \
    } while (0)

/* Ends the test as skipped, with the reason on stderr. */
#define SKIP(...)                                                             \
    do {                                                                      \
        fprintf(stderr, "  skipped: ");                                       \
        fprintf(stderr, __VA_ARGS__);                                         \
        fputc('\n', stderr);                                                  \
        t_->skipped = 1;                                                      \
        return;                                                               \
    } while (0)

/* Normalised mean squared error sum((a-b)^2) / sum(b^2), the kernel-twin metric. */
double test_nmse(const float *a, const float *ref, long n);
/* This run's seed: LLMI_TEST_SEED when set, else fresh from the clock.  The runner
 * prints it once at the start so a failure can be replayed with LLMI_TEST_SEED=N. */
unsigned long long test_seed(void);
/* A whole text file (up to 64 MiB) through core/fileio.h's reader, malloc'ed and
 * NUL-terminated; NULL when it cannot be read. */
char *test_read_text(const char *path);
/* $TESTDATA (default "testdata") + "/" + rel in buf. */
const char *test_data_path(char *buf, size_t cap, const char *rel);
/* SmolLM2's Hugging Face tokenizer (testdata/tokenizer/smollm2), or NULL with st set. */
struct tokenizer *test_smollm2_tokenizer(llmi_status *st);

/* testdata/hf/NAME (TESTDATA names another testdata directory) loaded without its
 * tokenizer; n tokens drawn below n_vocab from this run's seed (the same on every call). */
int test_load_hf(const char *name, llmi_model *m, llmi_status *st);
void test_random_tokens(int32_t *tokens, int n, int n_vocab);

#endif
