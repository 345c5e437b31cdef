/* TEMPORARY: subcommands whose issues are still open say so and exit 2; each is
 * removed from here by the engineer who lands it. */
#include "cli.h"
int cmd_bench(int argc, char **argv, llmi_status *st) { (void)argc; (void)argv; return llmi_fail(st, LLMI_E_USAGE, "bench: not implemented yet"); }
int cmd_profile(int argc, char **argv, llmi_status *st) { (void)argc; (void)argv; return llmi_fail(st, LLMI_E_USAGE, "profile: not implemented yet"); }
