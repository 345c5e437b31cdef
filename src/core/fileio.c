/* fileio.c — reading a whole file with a size cap (see fileio.h). */
#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void fileio_limit_text(size_t max, char *buf, size_t cap) {
    if (max >= (1u << 30) && max % (1u << 30) == 0) snprintf(buf, cap, "%zu GiB", max >> 30);
    else if (max >= (1u << 20) && max % (1u << 20) == 0) snprintf(buf, cap, "%zu MiB", max >> 20);
    else snprintf(buf, cap, "%zu bytes", max);
}

/* Reads fd to its end into a buffer that starts at cap bytes; fails past max bytes. */
static int fileio_read_fd(int fd, size_t cap, size_t max, const char *name, int usage_code, char **buf, size_t *len,
                          llmi_status *st) {
    char *b = malloc(cap);
    if (!b) return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", name);
    size_t n = 0;
    for (;;) {
        char probe;
        bool full = n + 1 >= cap;
        /* a full buffer may be the whole file: one byte more tells, before growing it */
        ssize_t r = full ? read(fd, &probe, 1) : read(fd, b + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(b);
            return llmi_fail(st, LLMI_E_RUNTIME, "%s: read error: %s", name, strerror(e));
        }
        if (r == 0) break;
        if (n + (size_t)r > max) {
            char lim[32];
            fileio_limit_text(max, lim, sizeof lim);
            free(b);
            return llmi_fail(st, usage_code, "%s: larger than %s", name, lim);
        }
        if (full) {
            size_t ncap = cap > max / 2 ? max + 1 : cap * 2;   /* n < max here, so ncap >= n + 2 */
            char *nb = realloc(b, ncap);
            if (!nb) {
                free(b);
                return llmi_fail(st, LLMI_E_RUNTIME, "%s: out of memory", name);
            }
            b = nb;
            cap = ncap;
            b[n] = probe;
        }
        n += (size_t)r;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return 0;
}

int fileio_read(const char *path, const fileio_opts *o, char **buf, size_t *len, llmi_status *st) {
    *buf = NULL;
    *len = 0;
    const bool is_stdin = o->allow_stream && strcmp(path, "-") == 0;
    const int bad = o->flag ? LLMI_E_USAGE : LLMI_E_RUNTIME;
    char name[640];
    const char *shown = is_stdin ? "stdin" : path;
    if (o->flag) snprintf(name, sizeof name, "%s %.500s", o->flag, shown);
    else snprintf(name, sizeof name, "%.600s", shown);

    /* Without streams, O_NONBLOCK keeps a FIFO from blocking the open until it is refused;
     * with them, the open waits for a writer as a pipe reader should. */
    int fd = is_stdin ? STDIN_FILENO
                      : open(path, O_RDONLY | O_CLOEXEC | (o->allow_stream ? 0 : O_NONBLOCK));
    if (fd < 0) {
        if (o->optional && errno == ENOENT) return 0;
        return llmi_fail(st, bad, "%s: cannot open: %s", name, strerror(errno));
    }
    struct stat sb;
    int rc;
    if (fstat(fd, &sb) != 0) {
        rc = llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot stat: %s", name, strerror(errno));
    } else if (S_ISDIR(sb.st_mode)) {
        rc = llmi_fail(st, bad, "%s: is a directory, not a file", name);
    } else if (!S_ISREG(sb.st_mode) && !o->allow_stream) {
        rc = llmi_fail(st, bad, "%s: not a regular file", name);
    } else if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > o->max_bytes) {
        char lim[32];
        fileio_limit_text(o->max_bytes, lim, sizeof lim);
        rc = llmi_fail(st, bad, "%s: larger than %s (%lld bytes)", name, lim, (long long)sb.st_size);
    } else {
        size_t cap = S_ISREG(sb.st_mode) ? (size_t)sb.st_size + 1 : 65536;
        rc = fileio_read_fd(fd, cap, o->max_bytes, name, bad, buf, len, st);
    }
    if (!is_stdin) close(fd);
    return rc;
}
