/* status.h — owns llmi_status: how errors travel from any module up to main.c.
 *
 * Every fallible function returns int (0 on success, an LLMI_E* code otherwise) and,
 * on failure, fills the caller's llmi_status with a one-line message that names the
 * file or flag at fault.  Only main.c turns a status into an exit code. */
#ifndef LLMI_STATUS_H
#define LLMI_STATUS_H

#include <stdarg.h>
#include <stdio.h>

enum {
    LLMI_OK = 0,
    LLMI_E_RUNTIME = 1,   /* bad model file, I/O failure, out of memory: exit 1 */
    LLMI_E_USAGE = 2,     /* bad flag or flag value: exit 2 */
    LLMI_E_INTERRUPT = 130,
};

typedef struct llmi_status {
    int code;
    char msg[512];
} llmi_status;

/* Records the first error only: later calls keep the root cause.  Returns code so
 * callers can write `return llmi_fail(st, LLMI_E_RUNTIME, "...")`.  The message stays one
 * line whatever it quotes from an untrusted file (a token, a key, a path): control bytes
 * become '?'. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static inline int llmi_fail(llmi_status *st, int code, const char *fmt, ...) {
    if (st && st->code == LLMI_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(st->msg, sizeof st->msg, fmt, ap);
        va_end(ap);
        for (char *p = st->msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
        st->code = code;
    }
    return code;
}

static inline void llmi_status_clear(llmi_status *st) {
    st->code = LLMI_OK;
    st->msg[0] = '\0';
}

#endif
