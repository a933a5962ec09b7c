/* io_internal.h — helpers shared by the src/io readers (not public API). */
#ifndef MMC_IO_INTERNAL_H
#define MMC_IO_INTERNAL_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "mmc.h"

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

#endif
