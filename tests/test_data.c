/* test_data.c — the data pipeline: the three dataset layouts give identical tokens; ids,
 * labels, pixel values and grids equal transformers' Qwen2VLProcessor (fixtures from
 * tools/ref/gen_data.py); packing boundaries; determinism for any worker count; exact
 * resume; corrupt images skipped or fatal under strict; every bad-input error message. */
#include "test_util.h"
#include "mmc_data.h"

#include <unistd.h>

#define FX "tests/fixtures/data/"

static mmc_tokenizer *g_tok;
static mmc_st *g_ref;

static void opts_fixture(mmc_data_opts *o) {
    mmc_data_opts_default(o);
    const mmc_st_entry *e = mmc_st_find(g_ref, "min_max_pixels");
    const int64_t *mm = e->data;
    o->min_pixels = mm[0];
    o->max_pixels = mm[1];
    o->proc.video_min_pixels = mm[2];
    o->proc.video_max_pixels = mm[3];
    o->num_workers = 0;
}

static bool msg_has(const char *needle) {
    bool ok = strstr(mmc_last_error(), needle) != NULL;
    if (!ok) fprintf(stderr, "  error message \"%s\" lacks \"%s\"\n", mmc_last_error(), needle);
    return ok;
}

static bool eq_i32(const int32_t *a, const int32_t *b, int64_t n) { return !memcmp(a, b, (size_t)n * 4); }

/* compare a prepared sample with fixture s{k} */
static void check_ref(const mmc_batch *b, int k, const char *fmt) {
    char name[64];
    snprintf(name, sizeof name, "s%d.input_ids", k);
    const mmc_st_entry *e = mmc_st_find(g_ref, name);
    CHECKF(e && b->T == e->shape[0], "%s s%d: %lld tokens, reference %lld", fmt, k, (long long)b->T,
           e ? (long long)e->shape[0] : -1LL);
    if (!e || b->T != e->shape[0]) return;
    CHECKF(eq_i32(b->input_ids, e->data, b->T), "%s s%d: input_ids differ from Qwen2VLProcessor", fmt, k);
    snprintf(name, sizeof name, "s%d.labels", k);
    e = mmc_st_find(g_ref, name);
    CHECKF(eq_i32(b->labels, e->data, b->T), "%s s%d: labels differ", fmt, k);
    snprintf(name, sizeof name, "s%d.pixel_values", k);
    e = mmc_st_find(g_ref, name);
    CHECK((e != NULL) == (b->n_patches > 0));
    if (e && b->n_patches == e->shape[0] && b->patch_dim == e->shape[1]) {
        /* tolerance: the C processor is bit-exact with the PIL backend; allow 1 ulp-ish */
        double m = 0;
        const float *r = e->data;
        for (int64_t i = 0; i < b->n_patches * b->patch_dim; i++) m = fmax(m, fabs(r[i] - b->pixel_values[i]));
        CHECKF(m <= 1e-6, "%s s%d: pixel_values max|diff| %.3g", fmt, k, m);
        snprintf(name, sizeof name, "s%d.image_grid_thw", k);
        e = mmc_st_find(g_ref, name);
        CHECK(e && e->shape[0] == b->n_images && !memcmp(e->data, b->image_grid_thw, (size_t)b->n_images * 24));
    } else if (e) CHECKF(0, "%s s%d: pixel_values shape [%lld, %lld]", fmt, k, (long long)b->n_patches, (long long)b->patch_dim);
    snprintf(name, sizeof name, "s%d.video_values", k);
    e = mmc_st_find(g_ref, name);
    CHECK((e != NULL) == (b->n_video_patches > 0));
    if (e && b->n_video_patches == e->shape[0]) {
        double m = 0;
        const float *r = e->data;
        for (int64_t i = 0; i < b->n_video_patches * b->patch_dim; i++) m = fmax(m, fabs(r[i] - b->video_values[i]));
        CHECKF(m <= 1e-6, "%s s%d: video values max|diff| %.3g", fmt, k, m);
        snprintf(name, sizeof name, "s%d.video_grid_thw", k);
        e = mmc_st_find(g_ref, name);
        CHECK(e && !memcmp(e->data, b->video_grid_thw, (size_t)b->n_videos * 24));
    }
    /* pad expansion: <|image_pad|> count = sum t*h*w / 4 */
    int32_t pad = mmc_tokenizer_token_to_id(g_tok, "<|image_pad|>");
    int64_t npad = 0, want = 0;
    for (int64_t t = 0; t < b->T; t++) npad += b->input_ids[t] == pad;
    for (int i = 0; i < b->n_images; i++) want += b->image_grid_thw[3 * i] * b->image_grid_thw[3 * i + 1] * b->image_grid_thw[3 * i + 2] / 4;
    CHECKF(npad == want, "%s s%d: %lld image pads, grids want %lld", fmt, k, (long long)npad, (long long)want);
}

static void test_formats(void) {
    const char *files[3] = {FX "llava.jsonl", FX "sharegpt.jsonl", FX "openai.json"};
    const mmc_data_format fmts[3] = {MMC_DATA_LLAVA, MMC_DATA_SHAREGPT, MMC_DATA_OPENAI};
    mmc_data_opts o;
    opts_fixture(&o);
    mmc_batch first[4] = {0};
    for (int f = 0; f < 3; f++) {
        mmc_dataset *ds = NULL;
        CHECK_OK(mmc_dataset_load(files[f], NULL, &ds));
        if (!ds) continue;
        CHECK(mmc_dataset_size(ds) == 4);
        mmc_example ex;
        mmc_dataset_get(ds, 0, &ex);
        CHECK(ex.format == fmts[f] && ex.type && !strcmp(ex.type, "color") && !strcmp(ex.answer, "Mostly red."));
        mmc_dataset_get(ds, 2, &ex);
        CHECK(ex.type == NULL && ex.n_images == 0);
        mmc_dataset_get(ds, 1, &ex);
        CHECK(ex.n_images == 2 && strstr(ex.images[0], "rgb_500x333.jpg") && !strcmp(ex.answer, "More pixels, more área. ✓"));
        if (f == 2) CHECKF(ex.line == 24, "openai.json record 1 at line %d, expected 24", ex.line);
        else CHECK(ex.line == 2);
        for (int k = 0; k < 4; k++) {
            mmc_batch b;
            CHECK_OK(mmc_data_prepare(&o, g_tok, ds, k, false, &b));
            check_ref(&b, k, files[f]);
            if (f == 0) first[k] = b;
            else {
                CHECKF(b.T == first[k].T && eq_i32(b.input_ids, first[k].input_ids, b.T) &&
                       eq_i32(b.labels, first[k].labels, b.T), "%s sample %d differs from llava", files[f], k);
                mmc_batch_free(&b);
            }
        }
        /* prompt only: ends with the generation prompt, no labels */
        mmc_batch p;
        CHECK_OK(mmc_data_prepare(&o, g_tok, ds, 1, true, &p));
        char *txt = NULL;
        CHECK_OK(mmc_tokenizer_decode(g_tok, p.input_ids + p.T - 3, 3, false, &txt));
        CHECKF(txt && !strcmp(txt, "<|im_start|>assistant\n"), "prompt ends with \"%s\"", txt ? txt : "");
        free(txt);
        int64_t nl = 0;
        for (int64_t t = 0; t < p.T; t++) nl += p.labels[t] != MMC_IGNORE_INDEX;
        CHECK(nl == 0 && p.n_images == 2);
        /* the prompt is the training sample's prefix up to its last assistant turn */
        CHECK(p.T < first[1].T && eq_i32(p.input_ids, first[1].input_ids, p.T));
        mmc_batch_free(&p);
        mmc_dataset_free(ds);
    }
    for (int k = 0; k < 4; k++) mmc_batch_free(&first[k]);
}

static void test_truncation(void) {
    mmc_data_opts o;
    opts_fixture(&o);
    mmc_dataset *ds = NULL;
    CHECK_OK(mmc_dataset_load(FX "sharegpt.jsonl", NULL, &ds));
    mmc_batch full, b;
    CHECK_OK(mmc_data_prepare(&o, g_tok, ds, 1, false, &full));
    /* cut inside the second image's tokens: that image goes, the first stays */
    int32_t vs = mmc_tokenizer_token_to_id(g_tok, "<|vision_start|>");
    int64_t second = -1, nvs = 0;
    for (int64_t t = 0; t < full.T; t++) if (full.input_ids[t] == vs && ++nvs == 2) second = t;
    o.seq_len = second + 5;
    CHECK_OK(mmc_data_prepare(&o, g_tok, ds, 1, false, &b));
    CHECKF(b.T == second && b.n_images == 1 && eq_i32(b.input_ids, full.input_ids, b.T),
           "truncated T %lld (second image at %lld), %d images", (long long)b.T, (long long)second, b.n_images);
    CHECK(b.n_patches == full.image_grid_thw[0] * full.image_grid_thw[1] * full.image_grid_thw[2]);
    mmc_batch_free(&b);
    o.seq_len = full.T - 3; /* text cut */
    CHECK_OK(mmc_data_prepare(&o, g_tok, ds, 1, false, &b));
    CHECK(b.T == full.T - 3 && b.n_images == 2);
    mmc_batch_free(&b);
    o.truncation = false;
    o.seq_len = 32;
    CHECK_ERR(mmc_data_prepare(&o, g_tok, ds, 1, false, &b), MMC_ERR_INVALID);
    char want[96];
    snprintf(want, sizeof want, "sample 1 has %lld tokens > seq_len 32", (long long)full.T);
    CHECK(msg_has(want));
    mmc_batch_free(&full);
    mmc_dataset_free(ds);
}

/* a loader over sharegpt.jsonl */
static mmc_loader *loader(mmc_data_opts *o, const char *file, mmc_data_split split) {
    free(o->train);
    o->train = strdup(file);
    free(o->eval);
    o->eval = strdup(file);
    mmc_loader *l = NULL;
    CHECK_OK(mmc_loader_new(o, g_tok, split, &l));
    return l;
}

static uint64_t batch_hash(const mmc_batch *b) {
    uint64_t h = 1469598103934665603ull;
#define MIX(p, n) for (size_t i_ = 0; i_ < (size_t)(n); i_++) { h ^= ((const uint8_t *)(p))[i_]; h *= 1099511628211ull; }
    MIX(&b->B, 8); MIX(&b->T, 8);
    MIX(b->input_ids, b->B * b->T * 4);
    MIX(b->labels, b->B * b->T * 4);
    if (b->cu_seqlens) MIX(b->cu_seqlens, (b->n_seqs + 1) * 4);
    MIX(b->sample_ids, b->n_seqs * 8);
    if (b->n_patches) MIX(b->pixel_values, b->n_patches * b->patch_dim * 4);
    if (b->n_images) MIX(b->image_grid_thw, b->n_images * 24);
    if (b->n_video_patches) MIX(b->video_values, b->n_video_patches * b->patch_dim * 4);
#undef MIX
    return h;
}

static void test_packing(void) {
    mmc_data_opts o;
    opts_fixture(&o);
    o.packing = true;
    o.seq_len = 128;
    o.shuffle = false;
    mmc_loader *l = loader(&o, FX "sharegpt.jsonl", MMC_SPLIT_TRAIN);
    if (!l) return;
    mmc_batch s[4];
    for (int k = 0; k < 4; k++) CHECK_OK(mmc_data_prepare(&o, g_tok, mmc_loader_dataset(l), k, false, &s[k]));
    /* lengths 59, 109, 52, 69: rows [0] [1] [2 3] [0] ... (next-fit, in order) */
    const int rows[5][3] = {{1, 0}, {1, 1}, {2, 2, 3}, {1, 0}, {1, 1}};
    int32_t pad = mmc_tokenizer_special_id(g_tok, MMC_TOK_PAD);
    for (int r = 0; r < 5; r++) {
        mmc_batch b;
        CHECK_OK(mmc_loader_next(l, &b));
        CHECKF(b.B == 1 && b.T == 128 && b.n_seqs == rows[r][0], "row %d: B %lld T %lld n_seqs %d", r,
               (long long)b.B, (long long)b.T, b.n_seqs);
        if (b.n_seqs != rows[r][0]) { mmc_batch_free(&b); continue; }
        int64_t pos = 0, np = 0;
        CHECK(b.cu_seqlens[0] == 0);
        for (int q = 0; q < b.n_seqs; q++) {
            const mmc_batch *x = &s[rows[r][1 + q]];
            CHECK(b.sample_ids[q] == rows[r][1 + q]);
            CHECK(b.cu_seqlens[q + 1] == pos + x->T);
            CHECK(eq_i32(b.input_ids + pos, x->input_ids, x->T));
            CHECK(b.labels[pos] == MMC_IGNORE_INDEX && eq_i32(b.labels + pos + 1, x->labels + 1, x->T - 1));
            if (x->n_patches) CHECK(!memcmp(b.pixel_values + np * b.patch_dim, x->pixel_values, (size_t)(x->n_patches * x->patch_dim) * 4));
            np += x->n_patches;
            pos += x->T;
        }
        CHECK(b.n_patches == np && b.n_tokens == pos);
        bool tail = true;
        for (int64_t t = pos; t < 128; t++) tail &= b.input_ids[t] == pad && b.labels[t] == MMC_IGNORE_INDEX;
        CHECKF(tail, "row %d: tail not padded with %d / -100", r, pad);
        int64_t nl = 0;
        for (int64_t t = 1; t < 128; t++) nl += b.labels[t] != MMC_IGNORE_INDEX;
        CHECK(nl == b.n_label_tokens && b.position_ids == NULL);
        mmc_batch_free(&b);
    }
    for (int k = 0; k < 4; k++) mmc_batch_free(&s[k]);
    mmc_loader_free(l);
    mmc_data_opts_free(&o);
}

/* n batches' hashes */
static void run_hashes(mmc_loader *l, int n, uint64_t *h) {
    for (int i = 0; i < n; i++) {
        mmc_batch b;
        mmc_status st = mmc_loader_next(l, &b);
        CHECK_OK(st);
        h[i] = st ? 0 : batch_hash(&b);
        if (!st) mmc_batch_free(&b);
    }
}

static void test_determinism_resume(bool packing) {
    const char *mode = packing ? "packed" : "padded";
    mmc_data_opts o;
    opts_fixture(&o);
    o.packing = packing;
    o.seq_len = 160;
    o.micro_batch_size = 2;
    o.bucket_window = 4;
    o.seed = 7;
    enum { NB = 14 };
    uint64_t h0[NB], h[NB];
    o.num_workers = 1;
    mmc_loader *l = loader(&o, FX "llava.jsonl", MMC_SPLIT_TRAIN);
    if (!l) return;
    run_hashes(l, NB, h0);
    mmc_loader_free(l);
    for (int w = 0; w <= 3; w += 3) {
        o.num_workers = w;
        o.prefetch = w == 3 ? 5 : 0;
        l = loader(&o, FX "llava.jsonl", MMC_SPLIT_TRAIN);
        run_hashes(l, NB, h);
        CHECKF(!memcmp(h, h0, sizeof h), "%s: %d workers differ from 1 worker", mode, w);
        mmc_loader_free(l);
    }
    /* epochs reshuffle: the sequence is not periodic with the dataset */
    bool differs = false;
    for (int i = 0; i + 2 < NB; i++) differs |= h0[i] != h0[i + 2];
    CHECK(differs);
    /* a different seed gives a different order */
    o.seed = 8;
    o.num_workers = 2;
    l = loader(&o, FX "llava.jsonl", MMC_SPLIT_TRAIN);
    run_hashes(l, NB, h);
    CHECK(memcmp(h, h0, sizeof h) != 0);
    mmc_loader_free(l);
    o.seed = 7;
    /* resume at every point k from a saved state */
    for (int k = 1; k < 8; k++) {
        l = loader(&o, FX "llava.jsonl", MMC_SPLIT_TRAIN);
        run_hashes(l, k, h);
        mmc_loader_state s = mmc_loader_state_get(l);
        mmc_loader_free(l);
        l = loader(&o, FX "llava.jsonl", MMC_SPLIT_TRAIN);
        CHECK_OK(mmc_loader_restore(l, &s));
        mmc_loader_state s2 = mmc_loader_state_get(l);
        CHECK(s2.epoch == s.epoch && s2.position == s.position && s2.batch_in_window == s.batch_in_window);
        run_hashes(l, NB - k, h + k);
        CHECKF(!memcmp(h + k, h0 + k, (NB - k) * sizeof h[0]), "%s: resume after %d batches (epoch %lld, "
               "position %lld, batch %lld) diverges", mode, k, (long long)s.epoch, (long long)s.position,
               (long long)s.batch_in_window);
        mmc_loader_free(l);
    }
    /* restoring in place (same loader, mid-stream) */
    l = loader(&o, FX "llava.jsonl", MMC_SPLIT_TRAIN);
    run_hashes(l, 3, h);
    mmc_loader_state s = mmc_loader_state_get(l);
    run_hashes(l, 4, h + 3);
    CHECK_OK(mmc_loader_restore(l, &s));
    run_hashes(l, 4, h + 3);
    CHECK(!memcmp(h, h0, 7 * sizeof h[0]));
    mmc_loader_free(l);
    /* padded bucketing: rows sorted by length within a batch window; B <= micro */
    if (!packing) {
        l = loader(&o, FX "llava.jsonl", MMC_SPLIT_TRAIN);
        for (int i = 0; i < 4; i++) {
            mmc_batch b;
            CHECK_OK(mmc_loader_next(l, &b));
            CHECK(b.B >= 1 && b.B <= 2 && b.cu_seqlens == NULL && b.n_seqs == b.B);
            /* window = the 4 samples (lengths 59, 109, 52, 69): rows {52, 59} and {69, 109} */
            CHECKF(b.B == 2 && ((b.sample_ids[0] == 2 && b.sample_ids[1] == 0) ||
                                (b.sample_ids[0] == 3 && b.sample_ids[1] == 1)),
                   "bucketed batch %d holds samples %lld, %lld", i, (long long)b.sample_ids[0],
                   b.B > 1 ? (long long)b.sample_ids[1] : -1LL);
            CHECK(b.T == (b.sample_ids[0] == 2 ? 59 : 109));
            mmc_batch_free(&b);
        }
        mmc_loader_free(l);
    }
    mmc_data_opts_free(&o);
}

static void test_eval_iter(void) {
    mmc_data_opts o;
    opts_fixture(&o);
    o.micro_batch_size = 3;
    o.num_workers = 2;
    o.packing = true; /* ignored for eval */
    mmc_loader *l = loader(&o, FX "openai.json", MMC_SPLIT_EVAL);
    if (!l) return;
    mmc_batch b;
    CHECK_OK(mmc_loader_next(l, &b));
    CHECK(b.B == 3 && b.sample_ids[0] == 0 && b.sample_ids[1] == 1 && b.sample_ids[2] == 2 && b.T == 109);
    int32_t pad = mmc_tokenizer_special_id(g_tok, MMC_TOK_PAD);
    CHECK(b.input_ids[0 * b.T + 59] == pad && b.labels[0 * b.T + 59] == MMC_IGNORE_INDEX); /* row 0 padded */
    mmc_batch_free(&b);
    CHECK_OK(mmc_loader_next(l, &b));
    CHECK(b.B == 1 && b.sample_ids[0] == 3 && b.n_videos == 1);
    mmc_batch_free(&b);
    CHECK_OK(mmc_loader_next(l, &b));
    CHECK(b.B == 0);
    CHECK_OK(mmc_loader_next(l, &b));
    CHECK(b.B == 0);
    mmc_loader_free(l);
    mmc_data_opts_free(&o);
}

static void test_corrupt(void) {
    mmc_data_opts o;
    opts_fixture(&o);
    o.shuffle = false;
    o.num_workers = 2;
    o.micro_batch_size = 1;
    o.bucket_window = 1;
    mmc_loader *l = loader(&o, FX "bad/corrupt_image.jsonl", MMC_SPLIT_TRAIN);
    if (!l) return;
    const int want[6] = {0, 2, 0, 2, 0, 2};
    for (int i = 0; i < 6; i++) {
        mmc_batch b;
        CHECK_OK(mmc_loader_next(l, &b));
        CHECKF(b.B == 1 && b.sample_ids[0] == want[i], "batch %d: sample %lld, want %d", i,
               b.B ? (long long)b.sample_ids[0] : -1LL, want[i]);
        mmc_batch_free(&b);
    }
    /* tickets 1, 3, 5, 7, 9 failed (each reported once per sample, counted every time) */
    CHECKF(mmc_loader_skipped(l) == 5, "skipped %lld", (long long)mmc_loader_skipped(l));
    CHECK(mmc_loader_state_get(l).skipped == 5);
    mmc_loader_free(l);
    o.strict = true;
    l = loader(&o, FX "bad/corrupt_image.jsonl", MMC_SPLIT_TRAIN);
    mmc_batch b;
    CHECK_OK(mmc_loader_next(l, &b));
    mmc_batch_free(&b);
    CHECK(mmc_loader_next(l, &b) != MMC_OK);
    CHECK(msg_has("corrupt.jpg") && msg_has("corrupt_image.jsonl:2") && msg_has("strict"));
    mmc_loader_free(l);
    mmc_data_opts_free(&o);
}

static void test_errors(void) {
    mmc_dataset *ds = NULL;
    CHECK_ERR(mmc_dataset_load(FX "bad/does_not_exist.jsonl", NULL, &ds), MMC_ERR_NOT_FOUND);
    CHECK(msg_has("does_not_exist.jsonl"));
    CHECK_ERR(mmc_dataset_load(FX "bad/empty.jsonl", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("empty.jsonl") && msg_has("empty dataset"));
    CHECK_ERR(mmc_dataset_load(FX "bad/malformed.jsonl", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("malformed.jsonl:3:") && msg_has("malformed JSON"));
    CHECK_ERR(mmc_dataset_load(FX "bad/malformed_array.json", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("malformed_array.json:3:") && msg_has("malformed JSON"));
    /* text after the array's closing bracket (found by fuzz_dataset: it used to trip an
     * internal check instead of giving an error) */
    CHECK_ERR(mmc_dataset_load(FX "bad/trailing_array.json", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("trailing_array.json:2:") && msg_has("after the end of the JSON array"));
    CHECK_ERR(mmc_dataset_load(FX "bad/no_assistant.jsonl", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("no_assistant.jsonl:2:") && msg_has("no assistant turn"));
    CHECK_ERR(mmc_dataset_load(FX "bad/mismatch.jsonl", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("mismatch.jsonl:1:") && msg_has("2 image placeholders") && msg_has("1 image listed"));
    CHECK_ERR(mmc_dataset_load(FX "bad/no_messages.jsonl", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("no_messages.jsonl:1:") && msg_has("conversations"));
    CHECK_ERR(mmc_dataset_load(FX "bad/bad_role.jsonl", NULL, &ds), MMC_ERR_FORMAT);
    CHECK(msg_has("unknown role \"robot\""));
    CHECK(ds == NULL);
    /* an over-long sample with truncation off fails the loader */
    mmc_data_opts o;
    opts_fixture(&o);
    o.truncation = false;
    o.seq_len = 64;
    o.shuffle = false;
    o.bucket_window = 1;
    o.num_workers = 2;
    mmc_loader *l = loader(&o, FX "sharegpt.jsonl", MMC_SPLIT_TRAIN);
    mmc_batch b;
    CHECK_OK(mmc_loader_next(l, &b)); /* sample 0: 59 tokens */
    mmc_batch_free(&b);
    CHECK_ERR(mmc_loader_next(l, &b), MMC_ERR_INVALID);
    CHECK(msg_has("sample 1 has 109 tokens > seq_len 64"));
    mmc_loader_free(l);
    /* the YAML `data:` section maps onto the options */
    const char *y = "train: a.jsonl\nmax_pixels: 401408\nseq_len: 2048\npacking: true\nbatch_size: 16\n"
                    "micro_batch_size: 2\nnum_workers: 3\nstrict: true\nimage_root: imgs\n";
    mmc_yaml *doc = NULL;
    CHECK_OK(mmc_yaml_parse(y, strlen(y), "run.yaml", &doc));
    mmc_data_opts_free(&o);
    mmc_data_opts_default(&o);
    CHECK_OK(mmc_cfg_read(doc, mmc_data_cfg_fields, &o, "run.yaml"));
    CHECK(!strcmp(o.train, "a.jsonl") && o.max_pixels == 401408 && o.packing && o.batch_size == 16 &&
          o.micro_batch_size == 2 && o.num_workers == 3 && o.strict && !strcmp(o.image_root, "imgs"));
    mmc_yaml_free(doc);
    const char *y2 = "trian: a.jsonl\n";
    CHECK_OK(mmc_yaml_parse(y2, strlen(y2), "run.yaml", &doc));
    CHECK(mmc_cfg_read(doc, mmc_data_cfg_fields, &o, "run.yaml") != MMC_OK && msg_has("train"));
    mmc_yaml_free(doc);
    mmc_data_opts_free(&o);
}

/* an OpenAI image_url with a base64 data: URL equals the same image given by path */
static void test_data_url(void) {
    char *png;
    size_t n;
    CHECK_OK(mmc_read_file("tests/fixtures/image/rgb_37x53.png", &png, &n));
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *enc = malloc(4 * (n / 3 + 1) + 1), *q = enc;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)(uint8_t)png[i] << 16 | (i + 1 < n ? (uint32_t)(uint8_t)png[i + 1] << 8 : 0) |
                     (i + 2 < n ? (uint8_t)png[i + 2] : 0);
        *q++ = b64[v >> 18 & 63];
        *q++ = b64[v >> 12 & 63];
        *q++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *q = 0;
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/mmc_test_data_url_%d.jsonl", (int)getpid());
    FILE *f = fopen(tmp, "w");
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": "
               "\"data:image/png;base64,%s\"}}, {\"type\": \"text\", \"text\": \"What colour is it?\"}]}, "
               "{\"role\": \"assistant\", \"content\": \"Mostly red.\"}]}\n", enc);
    fclose(f);
    mmc_data_opts o;
    opts_fixture(&o);
    mmc_dataset *ds = NULL;
    CHECK_OK(mmc_dataset_load(tmp, NULL, &ds));
    mmc_batch b;
    if (ds) {
        CHECK_OK(mmc_data_prepare(&o, g_tok, ds, 0, false, &b));
        check_ref(&b, 0, "data: URL");
        mmc_batch_free(&b);
        mmc_dataset_free(ds);
    }
    remove(tmp);
    free(enc);
    free(png);
}

/* mutated dataset files load or fail cleanly (run under ASan/UBSan in the sanitizer build) */
static void test_mutations(void) {
    const char *files[3] = {FX "llava.jsonl", FX "sharegpt.jsonl", FX "openai.json"};
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/mmc_test_data_%d.json", (int)getpid());
    mmc_rng r;
    mmc_rng_init(&r, 1234);
    int ok = 0, err = 0;
    for (int f = 0; f < 3; f++) {
        char *text;
        size_t len;
        CHECK_OK(mmc_read_file(files[f], &text, &len));
        for (int it = 0; it < 150; it++) {
            char *m = malloc(len + 1);
            memcpy(m, text, len + 1);
            size_t n = len;
            int edits = 1 + (int)(mmc_rng_u64(&r) % 4);
            static const char pool[] = "{}[]\",:<image><video>\n\\\x00\xff";
            for (int e = 0; e < edits; e++) {
                size_t at = (size_t)(mmc_rng_u64(&r) % n);
                switch (mmc_rng_u64(&r) % 3) {
                case 0: m[at] = pool[mmc_rng_u64(&r) % (sizeof pool - 1)]; break;   /* replace */
                case 1: n = at; m[n] = 0; break;                                    /* truncate */
                default: memmove(m + at, m + at + 1, n - at); n--; break;           /* delete */
                }
                if (n == 0) break;
            }
            FILE *fp = fopen(tmp, "wb");
            fwrite(m, 1, n, fp);
            fclose(fp);
            mmc_dataset *ds = NULL;
            mmc_status st = mmc_dataset_load(tmp, "tests/fixtures/data", &ds);
            if (st == MMC_OK) { ok++; CHECK(ds && mmc_dataset_size(ds) > 0); }
            else { err++; CHECK(ds == NULL && strstr(mmc_last_error(), "mmc_test_data_")); }
            mmc_dataset_free(ds);
            free(m);
        }
        free(text);
    }
    remove(tmp);
    CHECK(ok > 0 && err > 0);
}

int main(void) {
    CHECK_OK(mmc_tokenizer_load("tests/fixtures/tokenizer", &g_tok));
    g_ref = fixture_open("data/ref.safetensors");
    if (!g_tok || !g_ref) return test_done("test_data");
    test_formats();
    test_truncation();
    test_packing();
    test_determinism_resume(true);
    test_determinism_resume(false);
    test_eval_iter();
    test_corrupt();
    test_errors();
    test_mutations();
    test_data_url();
    mmc_st_close(g_ref);
    mmc_tokenizer_free(g_tok);
    return test_done("test_data");
}
