/* fileio.h — owns reading a whole file into memory: the one reader behind config.json,
 * tokenizer.json, the shard index, prompt files, calibration and perplexity text.
 *
 * A file is untrusted input: its size is capped, and a FIFO or device is refused rather
 * than waited on unless the caller asks for them (prompts may come from a pipe, /dev/null
 * or '-' = stdin).  Messages name the flag that gave the path, or the file itself; a
 * problem with a flag's file is a usage error (exit 2), with a file a loader found a
 * runtime error (exit 1). */
#ifndef LLMI_FILEIO_H
#define LLMI_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include "core/status.h"

typedef struct fileio_opts {
    const char *flag;      /* the flag that named the file ("--calib"), or NULL */
    size_t max_bytes;      /* a larger file is refused, never truncated */
    bool allow_stream;     /* also FIFOs, character devices and "-" = stdin */
    bool optional;         /* a missing file (ENOENT) is no error: *buf = NULL, *len = 0 */
} fileio_opts;

/* Reads path whole into *buf (malloc'ed, NUL-terminated after *len bytes; may contain
 * NUL bytes, which the caller checks when it wants text). */
int fileio_read(const char *path, const fileio_opts *o, char **buf, size_t *len, llmi_status *st);

#endif
