/* bench_whisper.c — Whisper inference (mmc_whisper_encode, mmc_whisper_dec_step; f32 weights)
 * against transformers' WhisperForConditionalGeneration under torch.inference_mode
 * (bench/peer_whisper.py prints the same case names), lower is better:
 *   whisper_small2_encode_30s_ms: Whisper-small-shaped encoder (d_model 768, 12 heads, ffn 3072,
 *       80 mel bins) with 2 of its 12 layers, over one 30 s window (3000 frames -> 1500 positions);
 *   whisper_small2_decode_ms_per_token: the decoder with 2 of its 12 layers and the real vocabulary
 *       (51865: the output projection is a large part of a step): a fresh decoder state over the
 *       1500 encoder states (cross keys/values), a 4-token prompt, then 32 tokens one at a time
 *       through the KV cache; total time / 32.
 * and the same work split as whisper.cpp splits it (bench/peer_whispercpp.py, pywhispercpp's f16 model
 * of these shapes), at the same 16 bits per weight: mmc on the checkpoint with its matrices in bf16
 * (they stay bf16 in the mapping, widened in the kernels), vectors f32 as in whisper.cpp's file:
 *   whisper_small2_encode_cross_30s_ms_whispercpp_f16: the encoder plus the decoder-state set-up
 *       (every decoder layer's cross-attention keys and values), which whisper_encode also computes;
 *   whisper_small2_decode_step_ms_whispercpp_f16: after the 4-token prompt, one of the 32 single-token
 *       steps (their mean), the set-up and the prompt not counted.
 * For information, the layout of the decoder's cross-attention cache: one query token over 1500
 * positions, 12 heads of 64, the two layers' keys/values, stored position-major ([S, H, D]) and
 * head-major ([H, S, D], whisper.c's), median of 201 alternated calls:
 *   whisper_cross_attn_T1_S1500_2layers_{rowmajor,headmajor}_us
 * The random checkpoint is written to a temp folder as save_pretrained lays it out. */
#include "bench_util.h"
#include "mmc_io.h"
#include "mmc_ops.h"
#include "mmc_whisper.h"

#include <unistd.h>

enum { C = 768, F = 3072, L = 2, V = 51865, M = 80, P = 1500, TM = 448, PROMPT = 4, STEPS = 32 };

static mmc_stw *g_w;
static mmc_tensor *g_ts[512];
static char g_names[512][160];
static int g_n;

static void add(const char *name, int ndim, const int64_t *shape, float std, float mean) {
    mmc_tensor *t = bench_rand_param(1000 + (uint64_t)g_n, ndim, shape, std);
    if (mean != 0) for (int64_t k = 0; k < mmc_numel(t); k++) ((float *)t->data)[k] += mean;
    MMC_CHECK(mmc_stw_add(g_w, name, t) == MMC_OK, "%s", mmc_last_error());
    snprintf(g_names[g_n], sizeof g_names[0], "%s", name);
    g_ts[g_n++] = t;
}

static void add_attn(const char *p, const char *a, const char *ln) {
    char nm[160];
    static const char *proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    for (int i = 0; i < 4; i++) {
        snprintf(nm, sizeof nm, "%s%s.%s.weight", p, a, proj[i]), add(nm, 2, MMC_SHAPE(C, C), 0.02f, 0);
        if (i != 1) snprintf(nm, sizeof nm, "%s%s.%s.bias", p, a, proj[i]), add(nm, 1, MMC_SHAPE(C), 0.02f, 0);
    }
    snprintf(nm, sizeof nm, "%s%s.weight", p, ln), add(nm, 1, MMC_SHAPE(C), 0.02f, 1);
    snprintf(nm, sizeof nm, "%s%s.bias", p, ln), add(nm, 1, MMC_SHAPE(C), 0.02f, 0);
}

static void add_layer(const char *p, bool dec) {
    char nm[160];
    add_attn(p, "self_attn", "self_attn_layer_norm");
    if (dec) add_attn(p, "encoder_attn", "encoder_attn_layer_norm");
    snprintf(nm, sizeof nm, "%sfinal_layer_norm.weight", p), add(nm, 1, MMC_SHAPE(C), 0.02f, 1);
    snprintf(nm, sizeof nm, "%sfinal_layer_norm.bias", p), add(nm, 1, MMC_SHAPE(C), 0.02f, 0);
    snprintf(nm, sizeof nm, "%sfc1.weight", p), add(nm, 2, MMC_SHAPE(F, C), 0.02f, 0);
    snprintf(nm, sizeof nm, "%sfc1.bias", p), add(nm, 1, MMC_SHAPE(F), 0.02f, 0);
    snprintf(nm, sizeof nm, "%sfc2.weight", p), add(nm, 2, MMC_SHAPE(C, F), 0.02f, 0);
    snprintf(nm, sizeof nm, "%sfc2.bias", p), add(nm, 1, MMC_SHAPE(C), 0.02f, 0);
}

static void write_model(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    MMC_CHECK(f, "%s", p);
    fprintf(f, "{\"model_type\": \"whisper\", \"architectures\": [\"WhisperForConditionalGeneration\"], "
               "\"vocab_size\": %d, \"num_mel_bins\": %d, \"d_model\": %d, \"encoder_layers\": %d, "
               "\"decoder_layers\": %d, \"encoder_attention_heads\": 12, \"decoder_attention_heads\": 12, "
               "\"encoder_ffn_dim\": %d, \"decoder_ffn_dim\": %d, \"max_source_positions\": %d, "
               "\"max_target_positions\": %d, \"decoder_start_token_id\": 50258}\n", V, M, C, L, L, F, F, P, TM);
    fclose(f);
    g_w = mmc_stw_new();
    add("model.encoder.conv1.weight", 3, MMC_SHAPE(C, M, 3), 0.05f, 0);
    add("model.encoder.conv1.bias", 1, MMC_SHAPE(C), 0.02f, 0);
    add("model.encoder.conv2.weight", 3, MMC_SHAPE(C, C, 3), 0.02f, 0);
    add("model.encoder.conv2.bias", 1, MMC_SHAPE(C), 0.02f, 0);
    add("model.encoder.embed_positions.weight", 2, MMC_SHAPE(P, C), 0.5f, 0);
    add("model.encoder.layer_norm.weight", 1, MMC_SHAPE(C), 0.02f, 1);
    add("model.encoder.layer_norm.bias", 1, MMC_SHAPE(C), 0.02f, 0);
    add("model.decoder.embed_tokens.weight", 2, MMC_SHAPE(V, C), 0.02f, 0);
    add("model.decoder.embed_positions.weight", 2, MMC_SHAPE(TM, C), 0.02f, 0);
    add("model.decoder.layer_norm.weight", 1, MMC_SHAPE(C), 0.02f, 1);
    add("model.decoder.layer_norm.bias", 1, MMC_SHAPE(C), 0.02f, 0);
    char pre[96];
    for (int i = 0; i < L; i++) {
        snprintf(pre, sizeof pre, "model.encoder.layers.%d.", i), add_layer(pre, false);
        snprintf(pre, sizeof pre, "model.decoder.layers.%d.", i), add_layer(pre, true);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    MMC_CHECK(mmc_stw_write(g_w, p) == MMC_OK, "%s", mmc_last_error());
    mmc_stw_free(g_w);
}

/* The same weights with every matrix (ndim >= 2) rounded to bf16, in dir (config.json copied). */
static void write_model_bf16(const char *src, const char *dir) {
    char p[512];
    mmc_stw *w = mmc_stw_new();
    mmc_tensor *h[512];
    for (int i = 0; i < g_n; i++) {
        mmc_tensor *t = g_ts[i];
        h[i] = mmc_tensor_new(t->ndim >= 2 ? MMC_BF16 : MMC_F32, t->ndim, t->shape);
        MMC_CHECK(h[i], "out of memory");
        mmc_convert(h[i]->data, h[i]->dtype, t->data, MMC_F32, mmc_numel(t));
        MMC_CHECK(mmc_stw_add(w, g_names[i], h[i]) == MMC_OK, "%s", mmc_last_error());
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    MMC_CHECK(mmc_stw_write(w, p) == MMC_OK, "%s", mmc_last_error());
    mmc_stw_free(w);
    for (int i = 0; i < g_n; i++) mmc_tensor_free(h[i]);
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/", src, dir);
    MMC_CHECK(system(cmd) == 0, "%s", cmd);
}

typedef struct { mmc_ctx *ctx; mmc_whisper *m; float *feats; mmc_tensor *enc; float *logits; } wcase;

static void run_encode(void *arg) {
    wcase *c = arg;
    mmc_ctx_reset(c->ctx);
    MMC_CHECK(mmc_whisper_encode(c->ctx, c->m, c->feats, 2 * P, &c->enc) == MMC_OK, "%s", mmc_last_error());
}

static void run_decode(void *arg) {
    wcase *c = arg;
    mmc_ctx_reset(c->ctx);
    mmc_whisper_dec *d;
    MMC_CHECK(mmc_whisper_dec_new(c->ctx, c->m, c->enc, &d) == MMC_OK, "%s", mmc_last_error());
    int32_t prompt[PROMPT] = {50258, 50259, 50359, 50363};
    MMC_CHECK(mmc_whisper_dec_step(c->ctx, d, prompt, PROMPT, false, c->logits) == MMC_OK, "%s", mmc_last_error());
    for (int t = 0; t < STEPS; t++) {
        int32_t id = (int32_t)((t * 7919 + 11) % 50000);
        MMC_CHECK(mmc_whisper_dec_step(c->ctx, d, &id, 1, false, c->logits) == MMC_OK, "%s", mmc_last_error());
    }
    mmc_whisper_dec_free(d);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* whisper.cpp's split of the same work, median of REPS runs: encode + cross K/V, then one step */
static void run_whispercpp_split(wcase *c) {
    enum { REPS = 5 };
    double enc[REPS], step[REPS];
    for (int r = -1; r < REPS; r++) {   /* r = -1: warm-up */
        mmc_ctx_reset(c->ctx);
        double t0 = mmc_now();
        mmc_tensor *e;
        MMC_CHECK(mmc_whisper_encode(c->ctx, c->m, c->feats, 2 * P, &e) == MMC_OK, "%s", mmc_last_error());
        mmc_whisper_dec *d;
        MMC_CHECK(mmc_whisper_dec_new(c->ctx, c->m, e, &d) == MMC_OK, "%s", mmc_last_error());
        double t1 = mmc_now();
        int32_t prompt[PROMPT] = {50258, 50259, 50359, 50363};
        MMC_CHECK(mmc_whisper_dec_step(c->ctx, d, prompt, PROMPT, false, c->logits) == MMC_OK, "%s", mmc_last_error());
        double t2 = mmc_now();
        for (int t = 0; t < STEPS; t++) {
            int32_t id = (int32_t)((t * 7919 + 11) % 50000);
            MMC_CHECK(mmc_whisper_dec_step(c->ctx, d, &id, 1, false, c->logits) == MMC_OK, "%s", mmc_last_error());
        }
        double t3 = mmc_now();
        mmc_whisper_dec_free(d);
        if (r >= 0) enc[r] = t1 - t0, step[r] = (t3 - t2) / STEPS;
    }
    qsort(enc, REPS, sizeof(double), cmp_d);
    qsort(step, REPS, sizeof(double), cmp_d);
    bench_report("whisper_small2_encode_cross_30s_ms_whispercpp_f16", 1e3 * enc[REPS / 2], "ms", 0);
    bench_report("whisper_small2_decode_step_ms_whispercpp_f16", 1e3 * step[REPS / 2], "ms", 0);
}

/* mmc_attention of q [1, 1, 12, 64] over two layers' K/V of 1500 positions, both layouts */
static void run_cross_layout(void) {
    enum { S = 1500, H = 12, D = 64, NL = 2, REPS = 201 };
    mmc_ctx *ctx = mmc_ctx_new();
    bool was = mmc_set_grad_enabled(ctx, false);
    float *buf[2][NL][2];   /* [layout][layer][k, v] */
    for (int l = 0; l < NL; l++)
        for (int j = 0; j < 2; j++) {
            buf[0][l][j] = malloc(sizeof(float) * S * H * D);
            buf[1][l][j] = malloc(sizeof(float) * S * H * D);
            MMC_CHECK(buf[0][l][j] && buf[1][l][j], "out of memory");
            for (int64_t i = 0; i < (int64_t)S * H * D; i++) buf[0][l][j][i] = (float)((i * (7 + j)) % 13) * 0.01f;
            for (int64_t t = 0; t < S; t++)
                for (int64_t h = 0; h < H; h++)
                    memcpy(buf[1][l][j] + (h * S + t) * D, buf[0][l][j] + (t * H + h) * D, sizeof(float) * D);
        }
    mmc_tensor *q = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(1, 1, H, D));
    for (int i = 0; i < H * D; i++) ((float *)q->data)[i] = (float)i * 1e-3f;
    double t[2][REPS];
    for (int r = 0; r < REPS; r++)
        for (int c = 0; c < 2; c++) {
            double t0 = mmc_now();
            for (int l = 0; l < NL; l++) {
                mmc_tensor *kv[2];
                for (int j = 0; j < 2; j++) {
                    kv[j] = mmc_tensor_wrap(MMC_F32, 4, MMC_SHAPE(1, S, H, D), buf[c][l][j]);
                    MMC_CHECK(kv[j], "out of memory");
                    if (c) kv[j]->stride[0] = (int64_t)H * S * D, kv[j]->stride[1] = D, kv[j]->stride[2] = (int64_t)S * D;
                }
                mmc_attn_opts o = {.causal = false, .scale = 1.0f};
                mmc_arena_mark mk = mmc_arena_get_mark(mmc_ctx_arena(ctx));
                (void)mmc_attention(ctx, q, kv[0], kv[1], &o);
                mmc_arena_release(mmc_ctx_arena(ctx), mk);
                mmc_tensor_free(kv[0]), mmc_tensor_free(kv[1]);
            }
            t[c][r] = mmc_now() - t0;
        }
    qsort(t[0], REPS, sizeof(double), cmp_d);
    qsort(t[1], REPS, sizeof(double), cmp_d);
    bench_report_info("whisper_cross_attn_T1_S1500_2layers_rowmajor_us", 1e6 * t[0][REPS / 2], "us");
    bench_report_info("whisper_cross_attn_T1_S1500_2layers_headmajor_us", 1e6 * t[1][REPS / 2], "us");
    mmc_tensor_free(q);
    for (int l = 0; l < NL; l++)
        for (int j = 0; j < 2; j++) free(buf[0][l][j]), free(buf[1][l][j]);
    mmc_set_grad_enabled(ctx, was);
    mmc_ctx_free(ctx);
}

int main(void) {
    if (getenv("MMC_BENCH_WHISPER_LAYOUT_ONLY")) {   /* just the cache-layout case (a quick check) */
        run_cross_layout();
        return 0;
    }
    char tmp[] = "/tmp/mmc_bench_whisper_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    write_model(tmp);
    wcase c = {.ctx = mmc_ctx_new()};
    MMC_CHECK(mmc_whisper_load(tmp, &c.m) == MMC_OK, "%s", mmc_last_error());
    c.feats = malloc((size_t)M * 2 * P * sizeof(float));
    c.logits = malloc((size_t)V * sizeof(float));
    for (int64_t i = 0; i < (int64_t)M * 2 * P; i++) c.feats[i] = (float)((i * 2654435761u) % 1000) / 700.0f - 0.6f;
    bench_report("whisper_small2_encode_30s_ms", 1e3 * bench_time(run_encode, &c, 3.0, 3), "ms", 0);
    /* the decoder reads the last encoder output, kept apart from the per-call arena resets */
    mmc_ctx *ectx = mmc_ctx_new();
    MMC_CHECK(mmc_whisper_encode(ectx, c.m, c.feats, 2 * P, &c.enc) == MMC_OK, "%s", mmc_last_error());
    bench_report("whisper_small2_decode_ms_per_token", 1e3 * bench_time(run_decode, &c, 3.0, 3) / STEPS, "ms", 0);
    run_cross_layout();
    mmc_ctx_free(ectx);
    mmc_whisper_free(c.m);
    char tmp16[] = "/tmp/mmc_bench_whisper_bf16_XXXXXX";
    MMC_CHECK(mkdtemp(tmp16), "mkdtemp");
    write_model_bf16(tmp, tmp16);
    MMC_CHECK(mmc_whisper_load(tmp16, &c.m) == MMC_OK, "%s", mmc_last_error());
    run_whispercpp_split(&c);
    mmc_whisper_free(c.m);
    for (int i = 0; i < g_n; i++) mmc_tensor_free(g_ts[i]);
    free(c.feats);
    free(c.logits);
    mmc_ctx_free(c.ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", tmp, tmp16);
    if (system(cmd) != 0) fprintf(stderr, "bench_whisper: could not remove %s\n", tmp);
    return 0;
}
