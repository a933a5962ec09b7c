/* fuzz_util.h — what the fuzz targets share: the committed fixture tokenizer
 * (tests/fixtures/tokenizer), loaded once from LLVMFuzzerInitialize (a target that cannot
 * load it aborts rather than fuzz nothing); and the input as a file for loaders that take a
 * path (an anonymous memfd named by /proc/self/fd/N: no disk, nothing left behind). */
#ifndef MMC_FUZZ_UTIL_H
#define MMC_FUZZ_UTIL_H

#include "mmc_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static inline mmc_tokenizer *fuzz_fixture_tokenizer(const char *target) {
    mmc_tokenizer *tok = NULL;
    if (mmc_tokenizer_load(MMC_SOURCE_DIR "/tests/fixtures/tokenizer", &tok) != MMC_OK) {
        fprintf(stderr, "%s: cannot load the fixture tokenizer: %s\n", target, mmc_last_error());
        abort();
    }
    return tok;
}

/* Write the input to a memfd; path (>= 32 bytes) names it. Returns the fd (close it), or -1. */
static inline int fuzz_input_file(const uint8_t *data, size_t size, const char *name, char *path, size_t cap) {
    int fd = memfd_create(name, 0);
    if (fd < 0) return -1;
    if (size && write(fd, data, size) != (ssize_t)size) { close(fd); return -1; }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
