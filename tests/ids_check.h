/* ids_check.h — what the tokenizer parity tests share (test_tokenizer, test_llama_tokenizer,
 * test_internlm2_tokenizer): a fixture file read whole, token ids compared with the reference's
 * JSON array, and both printed on a mismatch (the first 40 ids, 60 characters of the text).
 * Include after test_util.h and cJSON. */
#ifndef MMC_IDS_CHECK_H
#define MMC_IDS_CHECK_H

#include "mmc_io.h"

static inline char *read_all(const char *path, size_t *n) {   /* NULL if unreadable */
    char *b = NULL;
    return mmc_read_file(path, &b, n) == MMC_OK ? b : NULL;
}

static inline bool ids_equal(const int32_t *got, int64_t n, const cJSON *want) {
    if (cJSON_GetArraySize(want) != n) return false;
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) if (got[i++] != e->valueint) return false;
    return true;
}

static inline void show(const char *what, const char *text, const int32_t *got, int64_t n, const cJSON *want) {
    fprintf(stderr, "%s \"%.60s\":\n  got: ", what, text);
    for (int64_t k = 0; k < n && k < 40; k++) fprintf(stderr, " %d", got[k]);
    fprintf(stderr, "\n want:");
    int k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, want) if (k++ < 40) fprintf(stderr, " %d", e->valueint);
    fputc('\n', stderr);
}

#endif
