/* mapfile.h — owns opening an untrusted model file for reading: a regular file only (a
 * FIFO or device is refused rather than waited on), at least a minimum size, mapped
 * read-only.  The GGUF and safetensors readers both start here. */
#ifndef LLMI_MAPFILE_H
#define LLMI_MAPFILE_H

#include <stddef.h>
#include <stdint.h>
#include "core/status.h"

/* Maps path; a file shorter than min_bytes is "truncated <kind> file".  On success *map
 * holds (*size) bytes to be released with munmap. */
int mapfile_open(const char *path, size_t min_bytes, const char *kind, uint8_t **map, size_t *size,
                 llmi_status *st);

/* Drops the whole pages inside [p, p + len) of a read-only file mapping from the process:
 * they stay in the page cache, and a later read faults them back in unchanged.  For a
 * reader that has made its own copy of those bytes (the CPU backend's packed weights), so
 * they are not resident twice.  p must lie in such a mapping. */
void mapfile_drop_pages(const void *p, size_t len);

#endif
