/* fuzz_json_schema.c — libFuzzer target for the JSON-Schema compiler and the JSON automaton of
 * response_format (src/serve/json_constraint.c) on untrusted input: the input is a schema (up to
 * the first NUL byte; an empty one means json_object) and then a text fed to the automaton byte
 * by byte. Checked invariants: a refused schema leaves a message; for an accepted one, every
 * prefix of the text the automaton takes, completed with mmc_jc_close, is accepted to the end
 * and parses as one JSON object (cJSON); the mask over a fixture vocabulary never removes every
 * token while the text is incomplete and budget is ample. */
#include "fuzz_util.h"
#include "mmc_json_constraint.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static mmc_tokenizer *g_tok;
static mmc_jc_vocab *g_voc;
static float *g_lg;
static int64_t g_V;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_tok = fuzz_fixture_tokenizer("fuzz_json_schema");
    if (mmc_jc_vocab_build(g_tok, &g_voc) != MMC_OK) abort();
    g_V = mmc_tokenizer_vocab_size(g_tok);
    g_lg = malloc((size_t)g_V * sizeof *g_lg);
    if (!g_lg) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t ns = nul ? (size_t)(nul - data) : size;
    const uint8_t *text = nul ? nul + 1 : data + size;
    size_t nt = nul ? size - ns - 1 : 0;
    mmc_jc_schema *s = NULL;
    char err[512];
    bool ok = mmc_jc_compile(ns ? (const char *)data : NULL, ns, &s, err, sizeof err);
    if (!ok) {
        if (!err[0]) abort();
        return 0;
    }
    mmc_jc_state *st = mmc_jc_start(s);
    if (!st) abort();
    for (size_t i = 0; i <= nt && i <= 256; i++) {
        if (i > 0 && !mmc_jc_feed(st, text + i - 1, 1)) break;
        static char close[1 << 16];
        size_t n = mmc_jc_close(st, close, sizeof close);
        if (n >= sizeof close) continue;   /* a huge minimal value: nothing to check in the buffer */
        mmc_jc_state *c = mmc_jc_start(s);   /* fresh, then the same prefix and the completion */
        if (!c) abort();
        if (!mmc_jc_feed(c, text, i) || !mmc_jc_feed(c, (const uint8_t *)close, n) || !mmc_jc_done(c)) abort();
        char *whole = malloc(i + n + 1);
        if (!whole) abort();
        memcpy(whole, text, i);
        memcpy(whole + i, close, n);
        whole[i + n] = 0;
        cJSON *j = cJSON_Parse(whole);
        if (!j || !cJSON_IsObject(j)) abort();
        cJSON_Delete(j);
        free(whole);
        mmc_jc_state_free(c);
        if (i == nt || i % 16 == 0) {   /* the mask keeps something while the text is incomplete */
            for (int64_t v = 0; v < g_V; v++) g_lg[v] = 0;
            mmc_jc_mask(st, g_voc, (int64_t)n + 300, NULL, 0, g_lg, g_V);
            bool any = false;
            for (int64_t v = 0; v < g_V && !any; v++) any = g_lg[v] > -INFINITY;
            if (!mmc_jc_done(st) && !any) abort();
        }
    }
    mmc_jc_state_free(st);
    mmc_jc_schema_free(s);
    return 0;
}
