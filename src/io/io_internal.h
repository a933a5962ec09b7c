/* io_internal.h — helpers shared by the src/io readers (not public API). */
#ifndef MMC_IO_INTERNAL_H
#define MMC_IO_INTERNAL_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "mmc.h"
#include "mmc_image.h"

/* Parse JSON text of length len with cJSON. On failure sets an MMC_ERR_FORMAT message
 * "<what>:<line>:<col>: invalid JSON (<reason>)" and returns NULL. Trailing bytes other
 * than whitespace are an error too. */
cJSON *mmc_io_json_parse(const char *text, size_t len, const char *what);
/* 1-based line and column of byte offset `off` in text. */
void mmc_io_line_col(const char *text, size_t off, int *line, int *col);
/* Optimal-string-alignment edit distance (insert, delete, substitute, transpose = 1). */
int mmc_io_edit_distance(const char *a, const char *b);
/* malloc for a large pixel buffer: asks for transparent huge pages where the kernel leaves it
 * to madvise, so that a 12 MP image costs tens of page faults instead of thousands (per image,
 * the faults cost more than the resize). 64-byte aligned; free with free(). */
void *mmc_io_big_alloc(size_t n);

/* Buffers one caller reuses over many resizes of the same sizes (a video's frames): the
 * horizontal pass's rows. Zero-initialise; mmc_resize_scratch_free when done. */
typedef struct {
    uint8_t *tmp;
    size_t cap;
} mmc_resize_scratch;
void mmc_resize_scratch_free(mmc_resize_scratch *s);
/* mmc_image_resize_torch_u8 (the same bytes) into dst->data when dst already holds an
 * out_h x out_w image (else it is (re)allocated), its intermediate rows in s: no allocation
 * once both have their size. */
mmc_status mmc_image_resize_torch_u8_reuse(const mmc_image *src, int out_h, int out_w, mmc_resample f, mmc_image *dst,
                                           mmc_resize_scratch *s);

#endif
