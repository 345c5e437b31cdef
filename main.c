/* main.c — llmi's entry: dispatches to the subcommands, turns their status into a
 * one-line error and an exit code (0 ok, 1 runtime error, 2 usage error, 130 Ctrl-C,
 * 143 SIGTERM), and owns the signal handlers (a bus error from a model file changed under
 * its mapping becomes one line and exit 1). */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/status.h"
#include "core/version.h"


static volatile sig_atomic_t g_interrupted; /* the one flag a signal handler may write: the signal */

/* SIGINT and SIGTERM: the subcommand stops at its next check, cleans up (partial results
 * printed, temporary output removed) and llmi exits 128 + the signal. */
static void on_stop_signal(int sig) {
    if (g_interrupted) signal(sig, SIG_DFL); /* a second one kills at once */
    g_interrupted = sig;
}

/* SIGBUS: a mapped model file lost pages under llmi (truncated or rewritten after the load's
 * size checks), and the read cannot go on.  One line naming the file, found in
 * /proc/self/maps with async-signal-safe calls only, then exit 1 instead of a crash. */
static void say(const char *s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static uintptr_t hex_at(const char **p) {
    uintptr_t v = 0;
    for (;; (*p)++) {
        char c = **p;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return v;
        v = v * 16 + (uintptr_t)d;
    }
}

/* The path of the mapping holding addr (path, cap bytes), or "" when none is found. */
static void mapping_path(uintptr_t addr, char *path, size_t cap) {
    static char buf[8192], line[4096];   /* the handler's own: it runs once, then exits */
    path[0] = '\0';
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    size_t ln = 0;
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] != '\n') {
                if (ln + 1 < sizeof line) line[ln++] = buf[i];
                continue;
            }
            line[ln] = '\0';
            ln = 0;
            const char *p = line;   /* start-end perms offset dev inode path */
            uintptr_t lo = hex_at(&p);
            if (*p++ != '-') continue;
            uintptr_t hi = hex_at(&p);
            if (addr < lo || addr >= hi) continue;
            for (int field = 0; field < 4 && *p; field++) {   /* skip perms, offset, dev, inode */
                while (*p == ' ') p++;
                while (*p && *p != ' ') p++;
            }
            while (*p == ' ') p++;
            size_t k = 0;
            while (p[k] && k + 1 < cap) { path[k] = p[k]; k++; }
            path[k] = '\0';
            close(fd);
            return;
        }
    close(fd);
}

static void on_bus_error(int sig, siginfo_t *si, void *uctx) {
    (void)sig;
    (void)uctx;
    /* every thread of a team can fault on the same lost pages: one reports, the others
     * wait for its _exit (lock-free atomics are async-signal-safe) */
    static atomic_flag reporting = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&reporting))
        for (;;) pause();
    static char path[4096];
    mapping_path((uintptr_t)si->si_addr, path, sizeof path);
    say("llmi: ");
    say(path[0] ? path : "a mapped model file");
    say(": truncated or changed on disk while in use (bus error reading it)\n");
    _exit(1);
}

static const char *usage =
    "usage: llmi COMMAND [options]   (llmi COMMAND --help for each)\n"
    "Commands:\n"
    "  generate   generate text from prompts (streamed, or batched with --prompts)\n"
    "  bench      throughput/latency sweeps, offline throughput, perplexity\n"
    "  profile    where prefill and decode time and memory go, per op\n"
    "  quantize   GPTQ / AWQ / RTN int4 conversion of fp16/bf16 checkpoints\n"
    "  version    print the version and build features\n";

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("llmi %s (cuda: %s; cpu kernels: %s)\n", llmi_commit(), backend_cuda_compiled() ? "yes" : "no",
               backend_cpu_kernels());
        return 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* past a file-size limit (ulimit -f) a write then fails with EFBIG and is reported,
     * instead of the signal killing llmi with a half-written file */
    signal(SIGXFSZ, SIG_IGN);
    struct sigaction bus;
    memset(&bus, 0, sizeof bus);
    bus.sa_sigaction = on_bus_error;
    bus.sa_flags = SA_SIGINFO;
    sigemptyset(&bus.sa_mask);
    sigaction(SIGBUS, &bus, NULL);
    cli_interrupted = &g_interrupted;

    llmi_status st = {0};
    int rc;
    if (!strcmp(cmd, "generate")) rc = cmd_generate(argc - 2, argv + 2, &st);
    else if (!strcmp(cmd, "bench")) rc = cmd_bench(argc - 2, argv + 2, &st);
    else if (!strcmp(cmd, "profile")) rc = cmd_profile(argc - 2, argv + 2, &st);
    else if (!strcmp(cmd, "quantize")) rc = cmd_quantize(argc - 2, argv + 2, &st);
    else {
        fprintf(stderr, "llmi: unknown command '%s'\n%s", cmd, usage);
        return 2;
    }
    if (rc != 0 && st.code == LLMI_E_INTERRUPT) return 128 + (g_interrupted ? g_interrupted : SIGINT);
    if (rc != 0) {
        fprintf(stderr, "llmi: %s\n", st.msg[0] ? st.msg : "failed");
        return st.code == LLMI_E_USAGE ? 2 : 1;
    }
    return 0;
}
