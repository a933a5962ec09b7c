/* fuzz_clip_hub.c — libFuzzer target for the CLIP tokenizer's Hub layout (src/tokenizer/clip_bpe.c:
 * vocab.json + merges.txt + tokenizer_config.json, no tokenizer.json). The input is split at its
 * first two NUL bytes into merges.txt, tokenizer_config.json and vocab.json (a missing part keeps
 * the fixture's file, tests/fixtures/text_encoders/clip_hub_pad), written to a private folder and
 * loaded; a load must succeed or fail with an error, and a loaded tokenizer must encode a prompt
 * with ids inside its vocabulary. */
#include "mmc_encoders.h"
#include "mmc_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[64];
static char *g_fix[3];
static size_t g_fix_len[3];
static const char *const NAMES[3] = {"merges.txt", "tokenizer_config.json", "vocab.json"};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    snprintf(g_dir, sizeof g_dir, "/tmp/mmc_fuzz_clip_hub_%d", (int)getpid());
    if (mkdir(g_dir, 0700) != 0) { perror(g_dir); abort(); }
    for (int k = 0; k < 3; k++) {
        char p[512];
        snprintf(p, sizeof p, MMC_SOURCE_DIR "/tests/fixtures/text_encoders/clip_hub_pad/%s", NAMES[k]);
        if (mmc_read_file(p, &g_fix[k], &g_fix_len[k]) != MMC_OK) { fprintf(stderr, "%s\n", mmc_last_error()); abort(); }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[3] = {data, NULL, NULL};
    size_t len[3] = {size, 0, 0};
    for (int k = 1; k < 3; k++) {
        const uint8_t *z = part[k - 1] ? memchr(part[k - 1], 0, len[k - 1]) : NULL;
        if (!z) break;
        part[k] = z + 1;
        len[k] = (size_t)(part[k - 1] + len[k - 1] - part[k]);
        len[k - 1] = (size_t)(z - part[k - 1]);
    }
    for (int k = 0; k < 3; k++) {
        char p[128];
        snprintf(p, sizeof p, "%s/%s", g_dir, NAMES[k]);
        const void *d = part[k] ? (const void *)part[k] : g_fix[k];
        size_t n = part[k] ? len[k] : g_fix_len[k];
        FILE *f = fopen(p, "wb");
        if (!f) abort();
        if (n) fwrite(d, 1, n, f);
        fclose(f);
    }
    mmc_clip_tokenizer *t = NULL;
    if (mmc_clip_tokenizer_load(g_dir, &t) == MMC_OK) {
        int32_t ids[77];
        int n = 0;
        if (mmc_clip_tokenizer_encode_padded(t, "a photo of a cat!! <|endoftext|> Caf\xc3\xa9", 77, ids, NULL, &n) == MMC_OK)
            for (int i = 0; i < n; i++)
                if (ids[i] < 0) abort();
        mmc_clip_tokenizer_free(t);
    }
    return 0;
}
