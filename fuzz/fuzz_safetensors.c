/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser: the input is a
 * whole file image, parsed through mmc_st_open_memory; every accepted entry's bytes are
 * touched (ASan checks they lie inside the buffer) and converted to f32. */
#include "mmc_io.h"

#include <stdlib.h>
#include <string.h>

volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* copy, so reads past `size` hit ASan's redzone */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    mmc_st *st = NULL;
    if (mmc_st_open_memory(buf, size, "fuzz", &st) == MMC_OK) {
        uint8_t acc = 0;
        for (int i = 0; i < mmc_st_count(st); i++) {
            const mmc_st_entry *e = mmc_st_at(st, i);
            if (e->nbytes) acc ^= ((const uint8_t *)e->data)[0] ^ ((const uint8_t *)e->data)[e->nbytes - 1];
            if (mmc_st_find(st, e->name) != e) abort();
            int64_t n = 1;
            for (int d = 0; d < e->ndim; d++) n *= e->shape[d];
            if (n <= 4096) {
                mmc_tensor *t = mmc_tensor_new(MMC_F32, 1, (int64_t[]){n});
                if (t && mmc_st_read_into(st, e->name, t) != MMC_OK) abort();
                mmc_tensor_free(t);
            }
        }
        g_sink = acc;
        (void)mmc_st_metadata(st, "format");
        mmc_st_close(st);
    }
    free(buf);
    return 0;
}
