/* common.h — what every fuzz target shares (tests/fuzz/fuzz_*.c, docs/RELIABILITY.md).
 *
 * A target is a libFuzzer LLVMFuzzerTestOneInput that hands its bytes to one of llmi's
 * parsers through the entry point the binary uses; where that entry point takes a path,
 * the bytes go to a file in a scratch directory private to the call.  The same target is
 * linked with libFuzzer (`make fuzz`, clang) and with replay_main.c (`make SAN=1 tools`), which
 * is how the suite replays the committed corpora under ASan/UBSan without clang.
 *
 * A parser must fail with one clear line: fuzz_check_status aborts (a crash the fuzzer
 * reports) on a failure whose llmi_status is empty, multi-line or has no error code. */
#ifndef LLMI_FUZZ_COMMON_H
#define LLMI_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

struct tokenizer;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Creates a fresh private directory under $TMPDIR (or /tmp) into dir; 0 on success. */
int fuzz_scratch(char *dir, size_t cap);
/* Removes the scratch directory and every plain file in it. */
void fuzz_scratch_remove(const char *dir);
/* Writes (size) bytes to dir/name and its path into path; 0 on success. */
int fuzz_write(const char *dir, const char *name, const void *data, size_t size, char *path, size_t cap);
/* Checks the parser's verdict: rc 0, or rc != 0 with one line (printed when
 * LLMI_FUZZ_VERBOSE is set, to see what a corpus file reaches). */
void fuzz_check_status(int rc, const llmi_status *st);
/* The repository's testdata/ ($LLMI_TESTDATA, else ./testdata: run from the root). */
const char *fuzz_testdata(void);
/* Writes an input of two files, split at the first "\n#--\n", as dir/name_a and (when
 * the separator is there) dir/name_b; 0 on success. */
int fuzz_write_pair(const char *dir, const char *name_a, const char *name_b, const uint8_t *data, size_t size);
struct llmi_model;
/* Loads testdata/hf/NAME (no tokenizer) into m, a trusted model a target changes; aborts
 * with a line saying where testdata is looked for when it cannot. */
void fuzz_load_test_model(const char *name, struct llmi_model *m);
/* model_load(path) as `llmi -m PATH` does, the verdict checked, the model freed. */
void fuzz_model_load(const char *path, bool no_tokenizer);
/* Encodes (special tokens parsed), decodes and chat-formats a fixed text with special
 * tokens, multi-byte UTF-8 and an invalid byte: a loaded tokenizer must survive it. */
void fuzz_tok_exercise(const struct tokenizer *t);

#endif
