/* main.c — llmi's entry: dispatches to the subcommands, turns their status into a
 * one-line error and an exit code (0 ok, 1 runtime error, 2 usage error, 130 Ctrl-C,
 * 143 SIGTERM), and owns the signal handlers. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

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
        printf("llmi %s (cuda: %s)\n", llmi_commit(), backend_cuda_compiled() ? "yes" : "no");
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
