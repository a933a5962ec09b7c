/* status.c — thread-local error messages and the abort path for violated invariants. */
#include "mmc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char g_err[1024];

const char *mmc_last_error(void) { return g_err; }
void mmc_clear_error(void) { g_err[0] = 0; }

mmc_status mmc_error(mmc_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return st;
}

mmc_status mmc_error_prefix(mmc_status st, const char *fmt, ...) {
    char prev[sizeof g_err], pre[512];
    memcpy(prev, g_err, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    snprintf(g_err, sizeof g_err, "%s: %s", pre, prev);
    return st;
}

const char *mmc_status_str(mmc_status st) {
    switch (st) {
    case MMC_OK: return "ok";
    case MMC_ERR_IO: return "I/O error";
    case MMC_ERR_FORMAT: return "format error";
    case MMC_ERR_INVALID: return "invalid argument";
    case MMC_ERR_OOM: return "out of memory";
    case MMC_ERR_UNSUPPORTED: return "unsupported";
    case MMC_ERR_SHAPE: return "shape mismatch";
    case MMC_ERR_NOT_FOUND: return "not found";
    case MMC_ERR_NUMERIC: return "numeric error";
    }
    return "unknown error";
}

void mmc_abort_(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "mmc: internal error at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
