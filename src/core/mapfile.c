/* mapfile.c — read-only mapping of model files (see mapfile.h). */
#include "core/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <stdint.h>
#include <unistd.h>

int mapfile_open(const char *path, size_t min_bytes, const char *kind, uint8_t **map, size_t *size,
                 llmi_status *st) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size < min_bytes) {
        close(fd);
        return llmi_fail(st, LLMI_E_RUNTIME, "%s: truncated %s file (%lld bytes, the header needs %zu)", path, kind,
                         (long long)sb.st_size, min_bytes);
    }
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return llmi_fail(st, LLMI_E_RUNTIME, "%s: cannot mmap: %s", path, strerror(e));
    *map = p;
    *size = (size_t)sb.st_size;
    return LLMI_OK;
}

void mapfile_drop_pages(const void *p, size_t len) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) & ~(page - 1),
              e = ((uintptr_t)p + len) & ~(page - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}
