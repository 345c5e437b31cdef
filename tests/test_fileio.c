/* test_fileio.c — the one whole-file reader (core/fileio.c): contents exact to the byte,
 * the size cap on regular files and on streams, missing and optional files, FIFOs and
 * devices refused unless the caller takes streams, '-' = stdin, and messages that name
 * the flag (exit 2) or the file (exit 1). */
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "test.h"

static void fio_write(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); abort(); }
    if (n) fwrite(d, 1, n, f);
    fclose(f);
}

static char *fio_tmpdir(void) {
    char *d = strdup("/tmp/llmi-fileio-XXXXXX");
    if (!d || !mkdtemp(d)) abort();
    return d;
}

/* Forks a writer that opens the FIFO and writes n bytes of 'x' (it dies of SIGPIPE
 * when the reader stops early). */
static pid_t fio_fifo_writer(const char *fifo, size_t n) {
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(fifo, O_WRONLY);
        char buf[4096];
        memset(buf, 'x', sizeof buf);
        for (size_t done = 0; fd >= 0 && done < n;) {
            size_t k = n - done < sizeof buf ? n - done : sizeof buf;
            ssize_t w = write(fd, buf, k);
            if (w <= 0) break;
            done += (size_t)w;
        }
        _exit(0);
    }
    return pid;
}

TEST(fileio_regular_files) {
    char *d = fio_tmpdir(), p[256];
    snprintf(p, sizeof p, "%s/a.txt", d);
    const char data[] = "line one\nline\0two\n";   /* a NUL inside: the length says where it ends */
    fio_write(p, data, sizeof data - 1);
    llmi_status st = {0};
    char *buf = NULL;
    size_t len = 0;
    fileio_opts fo = {.max_bytes = 1 << 20};
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == 0);
    CHECK(buf && len == sizeof data - 1 && memcmp(buf, data, len) == 0 && buf[len] == '\0');
    free(buf);
    /* exactly at the cap is fine, one byte more is refused, never truncated */
    fo.max_bytes = sizeof data - 1;
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == 0 && len == sizeof data - 1);
    free(buf);
    fo.max_bytes = sizeof data - 2;
    buf = (char *)1;
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == LLMI_E_RUNTIME && buf == NULL);
    CHECK_MSG(strstr(st.msg, p) && strstr(st.msg, "larger than 17 bytes"), "%s", st.msg);
    /* an empty file is an empty string */
    llmi_status_clear(&st);
    fio_write(p, "", 0);
    fo.max_bytes = 16;
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == 0 && len == 0 && buf && buf[0] == '\0');
    free(buf);
    /* a big file: MiB caps are spelled as such */
    size_t big = (1u << 20) + 5;
    char *b = malloc(big);
    for (size_t i = 0; i < big; i++) b[i] = (char)('a' + i % 26);
    fio_write(p, b, big);
    fo.max_bytes = 2u << 20;
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == 0 && len == big && memcmp(buf, b, big) == 0);
    free(buf);
    fo = (fileio_opts){.flag = "--calib", .max_bytes = 1u << 20};
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == LLMI_E_USAGE);
    CHECK_MSG(strncmp(st.msg, "--calib ", 8) == 0 && strstr(st.msg, "larger than 1 MiB"), "%s", st.msg);
    free(b);
    unlink(p);
    rmdir(d);
    free(d);
}

TEST(fileio_missing_and_optional) {
    char *d = fio_tmpdir(), p[256];
    snprintf(p, sizeof p, "%s/absent.json", d);
    llmi_status st = {0};
    char *buf = (char *)1;
    size_t len = 7;
    fileio_opts fo = {.max_bytes = 1 << 20};
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == LLMI_E_RUNTIME && buf == NULL && len == 0);
    CHECK_MSG(strstr(st.msg, p) && strstr(st.msg, "cannot open"), "%s", st.msg);
    /* named by a flag: the flag leads the message and it is a usage error */
    llmi_status_clear(&st);
    fo.flag = "--ppl";
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == LLMI_E_USAGE);
    CHECK_MSG(strncmp(st.msg, "--ppl ", 6) == 0 && strstr(st.msg, "absent.json"), "%s", st.msg);
    /* optional: absent is no error, and says so with NULL */
    llmi_status_clear(&st);
    fo = (fileio_opts){.max_bytes = 1 << 20, .optional = true};
    buf = (char *)1;
    CHECK(fileio_read(p, &fo, &buf, &len, &st) == 0 && buf == NULL && st.code == 0);
    /* a directory is no file, streams or not */
    fo = (fileio_opts){.max_bytes = 1 << 20, .allow_stream = true};
    CHECK(fileio_read(d, &fo, &buf, &len, &st) == LLMI_E_RUNTIME);
    CHECK_MSG(strstr(st.msg, "directory"), "%s", st.msg);
    rmdir(d);
    free(d);
}

TEST(fileio_fifo_and_devices) {
    char *d = fio_tmpdir(), fifo[256];
    snprintf(fifo, sizeof fifo, "%s/pipe", d);
    CHECK(mkfifo(fifo, 0600) == 0);
    llmi_status st = {0};
    char *buf = NULL;
    size_t len = 0;
    /* refused, not waited on: a reader that blocked here would be killed by the alarm */
    alarm(20);
    fileio_opts fo = {.flag = "--calib", .max_bytes = 1 << 20};
    CHECK(fileio_read(fifo, &fo, &buf, &len, &st) == LLMI_E_USAGE);
    CHECK_MSG(strstr(st.msg, "--calib") && strstr(st.msg, fifo) && strstr(st.msg, "not a regular file"), "%s", st.msg);
    llmi_status_clear(&st);
    fo = (fileio_opts){.max_bytes = 1 << 20};
    CHECK(fileio_read("/dev/null", &fo, &buf, &len, &st) == LLMI_E_RUNTIME);
    CHECK_MSG(strstr(st.msg, "/dev/null: not a regular file"), "%s", st.msg);
    alarm(0);
    /* with streams: /dev/null is empty, a FIFO is read to its end through buffer growth */
    llmi_status_clear(&st);
    fo = (fileio_opts){.flag = "--prompts", .max_bytes = 1 << 20, .allow_stream = true};
    CHECK(fileio_read("/dev/null", &fo, &buf, &len, &st) == 0 && len == 0 && buf && buf[0] == '\0');
    free(buf);
    pid_t w = fio_fifo_writer(fifo, 200000);
    CHECK(fileio_read(fifo, &fo, &buf, &len, &st) == 0);
    CHECK(len == 200000 && buf && buf[0] == 'x' && buf[len - 1] == 'x' && buf[len] == '\0');
    free(buf);
    waitpid(w, NULL, 0);
    /* a stream past the cap is refused */
    fo.max_bytes = 100000;
    w = fio_fifo_writer(fifo, 200000);
    buf = (char *)1;
    CHECK(fileio_read(fifo, &fo, &buf, &len, &st) == LLMI_E_USAGE && buf == NULL);
    CHECK_MSG(strstr(st.msg, "--prompts") && strstr(st.msg, "larger than 100000 bytes"), "%s", st.msg);
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
    unlink(fifo);
    rmdir(d);
    free(d);
}

TEST(fileio_stdin_dash) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    CHECK(write(fds[1], "from stdin\n", 11) == 11);
    close(fds[1]);
    int saved = dup(STDIN_FILENO);
    dup2(fds[0], STDIN_FILENO);
    close(fds[0]);
    llmi_status st = {0};
    char *buf = NULL;
    size_t len = 0;
    fileio_opts fo = {.flag = "-f", .max_bytes = 1 << 20, .allow_stream = true};
    CHECK(fileio_read("-", &fo, &buf, &len, &st) == 0);
    CHECK(buf && len == 11 && strcmp(buf, "from stdin\n") == 0);
    free(buf);
    dup2(saved, STDIN_FILENO);
    close(saved);
    /* without streams "-" is just a file name */
    fo = (fileio_opts){.max_bytes = 1 << 20};
    CHECK(fileio_read("-", &fo, &buf, &len, &st) != 0);
}
