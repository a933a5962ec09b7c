/* recompute_run.h — one training step (forward, causal-LM loss, backward) of a random Qwen2
 * decoder under a selective-recompute / offload mode, shared by tests/test_selective_recompute.c (parity
 * of every mode against no recompute) and bench/bench_recompute.c (memory and time of each).
 * The step runs in a fresh context, so the activation arena's high-water mark is the step's;
 * the mapped arena's (offload) is reported apart. */
#ifndef MMC_RECOMPUTE_RUN_H
#define MMC_RECOMPUTE_RUN_H
#include "mmc.h"
#include "mmc_io.h"
#include "mmc_models.h"
#include "mmc_trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    bool full;            /* model.recompute: full */
    bool attn;            /* model.recompute: attention */
    int layers;           /* model.recompute_layers */
    int offload;          /* model.offload_layers */
} rc_mode;

typedef struct {
    double loss;
    float *grads;         /* every parameter's gradient, concatenated (malloc) */
    int64_t n;
    size_t act_fwd;       /* activation arena bytes held after the forward (what waits for backward) */
    size_t act_peak;      /* activation arena high-water mark over forward + backward, bytes */
    size_t off_peak;      /* mapped (offload) arena's, bytes */
    double rss_fwd_mib;   /* resident set after the forward */
    double fwd_s, bwd_s;
} rc_result;

static inline double rc_rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) v = atof(line + 6) / 1024.0;
    if (f) fclose(f);
    return v;
}

/* a random model of the given shape (mmc_qwen2_new, seeded) */
static inline mmc_qwen2 *rc_model(int layers, int hidden, int inter, int heads, int kv_heads, int vocab) {
    char js[512];
    snprintf(js, sizeof js,
             "{\"model_type\": \"qwen2\", \"hidden_size\": %d, \"intermediate_size\": %d, \"num_attention_heads\": %d,"
             " \"num_key_value_heads\": %d, \"num_hidden_layers\": %d, \"vocab_size\": %d, \"rms_norm_eps\": 1e-6,"
             " \"rope_theta\": 10000.0, \"max_position_embeddings\": 4096, \"tie_word_embeddings\": false}",
             hidden, inter, heads, kv_heads, layers, vocab);
    mmc_json *j = NULL;
    mmc_qwen2_config c;
    mmc_qwen2 *m = NULL;
    MMC_CHECK(mmc_json_parse(js, strlen(js), "config", &j) == MMC_OK && mmc_qwen2_config_read(j, &c) == MMC_OK &&
              mmc_qwen2_new(&c, 1234, &m) == MMC_OK, "recompute_run: model: %s", mmc_last_error());
    mmc_json_free(j);
    return m;
}

static inline void rc_step(mmc_qwen2 *m, const rc_mode *md, const int32_t *ids, const int32_t *labels, int64_t B,
                           int64_t T, const char *offload_dir, rc_result *r) {
    m->recompute = md->full;
    m->recompute_attn = md->attn;
    m->recompute_layers = md->layers;
    m->offload_layers = md->offload;
    m->offload_dir = offload_dir;
    mmc_zero_grad(m->params, m->n_params);
    mmc_ctx *ctx = mmc_ctx_new();
    double t0 = mmc_now();
    mmc_tensor *idt = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));                  /* [B, T] */
    memcpy(idt->data, ids, sizeof(int32_t) * (size_t)(B * T));
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));                     /* [T] */
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_tensor *cos, *sin;
    mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);                          /* [T, D] */
    mmc_attn_opts ao = {.causal = true};
    mmc_tensor *h = mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, idt), cos, sin, &ao, NULL);   /* [B, T, C] */
    int64_t ns = 0, nl = mmc_count_label_tokens(labels, B, T);
    mmc_tensor *loss = mmc_causal_lm_loss(ctx, mmc_qwen2_logits(ctx, m, h), labels, 1.0 / (double)nl, &ns);
    r->fwd_s = mmc_now() - t0;
    r->rss_fwd_mib = rc_rss_mib();
    r->act_fwd = mmc_arena_used(mmc_ctx_arena(ctx));
    r->loss = *(const float *)loss->data;
    t0 = mmc_now();
    mmc_backward(ctx, loss);
    r->bwd_s = mmc_now() - t0;
    r->act_peak = mmc_arena_peak(mmc_ctx_arena(ctx));
    r->off_peak = mmc_ctx_offload_peak(ctx);
    r->n = 0;
    for (int i = 0; i < m->n_params; i++) r->n += mmc_numel(m->params[i]);
    r->grads = malloc(sizeof(float) * (size_t)r->n);
    MMC_CHECK(r->grads, "out of memory");
    int64_t o = 0;
    for (int i = 0; i < m->n_params; i++) {
        const int64_t k = mmc_numel(m->params[i]);
        if (m->params[i]->grad) memcpy(r->grads + o, m->params[i]->grad->data, sizeof(float) * (size_t)k);
        else memset(r->grads + o, 0, sizeof(float) * (size_t)k);
        o += k;
    }
    mmc_ctx_free(ctx);
}
#endif
