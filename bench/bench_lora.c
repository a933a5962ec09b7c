/* bench_lora.c — memory and speed of full fine-tuning vs LoRA vs QLoRA on a Qwen2-VL-2B-shaped
 * language-model stack (hidden 1536, intermediate 8960, 12 heads, 2 KV heads, head_dim 128),
 * reduced to MMC_BENCH_LAYERS layers (default 2) and a 1024-token vocabulary (the 151936 x
 * 1536 embedding and head are left out: they are identical across the three modes, frozen
 * under LoRA). LoRA: r 16, alpha 32 on q,k,v,o,gate,up,down. QLoRA: the same on NF4 + double
 * quantisation. Per mode, in a forked child (so peak RSS is per mode):
 *   lora_<mode>_bytes_{weights,grads,optim,total}: computed (AdamW: 2 f32 states per
 *     trainable parameter), MiB;
 *   lora_<mode>_peak_rss: measured VmHWM after fwd+bwd with optimizer state allocated, MiB;
 *   lora_<mode>_fwd_bwd: tokens/s for forward + backward of B=1, T=MMC_BENCH_T (128). */
#include "bench_util.h"
#include "mmc_models.h"
#include "mmc_lora.h"
#include "mmc_quant.h"

#include <sys/wait.h>
#include <unistd.h>

static int g_layers = 2, g_T = 128;

typedef struct { mmc_qwen2 *m; mmc_ctx *ctx; mmc_tensor *ids; } run_args;

static void step(void *p) {
    run_args *a = p;
    mmc_ctx *ctx = a->ctx;
    int64_t T = a->ids->shape[1];
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = t;
    mmc_tensor *cos, *sin;
    mmc_rope_table_1d(ctx, pos, (int)a->m->cfg.head_dim, a->m->cfg.rope_theta, &cos, &sin);
    mmc_attn_opts o = {.causal = true};
    mmc_tensor *x = mmc_qwen2_embed(ctx, a->m, a->ids);
    x->flags |= MMC_REQUIRES_GRAD;   /* so frozen stacks still backpropagate through the layers */
    mmc_tensor *h = mmc_qwen2_forward(ctx, a->m, x, cos, sin, &o, NULL);
    mmc_tensor *L = mmc_mean(ctx, mmc_mul(ctx, h, h));
    mmc_backward(ctx, L);
    mmc_ctx_reset(ctx);
}

static void run_mode(const char *mode) {
    mmc_qwen2_config c = {.vocab_size = 1024, .hidden_size = 1536, .intermediate_size = 8960,
                          .num_layers = g_layers, .num_heads = 12, .num_kv_heads = 2, .head_dim = 128,
                          .max_position_embeddings = 4096, .rms_norm_eps = 1e-6, .rope_theta = 1e6,
                          .dtype = MMC_F32};
    mmc_qwen2 *m = NULL;
    if (mmc_qwen2_new(&c, 1, &m)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
    mmc_lora_set *s = NULL;
    mmc_module_list ml = {0};
    bool full = strcmp(mode, "full") == 0, q = strcmp(mode, "qlora") == 0;
    size_t w_bytes = 0, trainable = 0;
    if (!full) {
        for (int i = 0; i < m->n_params; i++) m->params[i]->flags &= ~(uint32_t)MMC_REQUIRES_GRAD;
        if (q && mmc_qwen2_quantize_nf4(m, true)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
        mmc_qwen2_linears(m, "model.", &ml);
        const char *t[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
        mmc_lora_config lc = {.r = 16, .alpha = 32, .targets = t, .n_targets = 7, .seed = 1};
        if (mmc_lora_attach(&ml, &lc, &s)) { fprintf(stderr, "%s\n", mmc_last_error()); exit(1); }
        for (int i = 0; i < s->n_params; i++) { w_bytes += mmc_nbytes(s->params[i]); trainable += mmc_numel(s->params[i]); }
        for (int i = 0; i < ml.n; i++) if (ml.mods[i]->q) w_bytes += mmc_nf4_bytes(ml.mods[i]->q);
    }
    for (int i = 0; i < m->n_params; i++) {
        w_bytes += mmc_nbytes(m->params[i]);
        if (full) trainable += mmc_numel(m->params[i]);
    }
    size_t grads = trainable * 4, optim = trainable * 8;
    /* AdamW exp_avg + exp_avg_sq, touched through a volatile pointer so RSS counts them */
    volatile char *opt = malloc(optim);
    for (size_t i = 0; i < optim; i += 4096) opt[i] = 1;
    char nm[96];
    double mib = 1024.0 * 1024.0;
    snprintf(nm, sizeof nm, "lora_%s_bytes_weights", mode); bench_report(nm, w_bytes / mib, "MiB", 0);
    snprintf(nm, sizeof nm, "lora_%s_bytes_grads", mode); bench_report(nm, grads / mib, "MiB", 0);
    snprintf(nm, sizeof nm, "lora_%s_bytes_optim", mode); bench_report(nm, optim / mib, "MiB", 0);
    snprintf(nm, sizeof nm, "lora_%s_bytes_total", mode); bench_report(nm, (w_bytes + grads + optim) / mib, "MiB", 0);
    run_args a = {m, mmc_ctx_new(), mmc_tensor_new(MMC_I64, 2, MMC_SHAPE(1, g_T))};
    for (int t = 0; t < g_T; t++) ((int64_t *)a.ids->data)[t] = (t * 37) % 1024;
    double sec = bench_time(step, &a, 3.0, 3);
    snprintf(nm, sizeof nm, "lora_%s_fwd_bwd", mode); bench_report(nm, g_T / sec, "tokens/s", 1);
    snprintf(nm, sizeof nm, "lora_%s_peak_rss", mode); bench_report(nm, bench_peak_rss_mib(), "MiB", 0);
    free((void *)opt);
    mmc_tensor_free(a.ids);
    mmc_ctx_free(a.ctx);
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_qwen2_free(m);
}

int main(void) {
    if (getenv("MMC_BENCH_LAYERS")) g_layers = atoi(getenv("MMC_BENCH_LAYERS"));
    if (getenv("MMC_BENCH_T")) g_T = atoi(getenv("MMC_BENCH_T"));
    const char *modes[] = {"full", "lora", "qlora"};
    const char *filt = getenv("MMC_BENCH_FILTER");
    for (int i = 0; i < 3; i++) {
        char probe[64];
        snprintf(probe, sizeof probe, "lora_%s_", modes[i]);
        if (filt && !strstr(probe, filt) && !strstr(filt, modes[i]) && !strstr(filt, "lora")) continue;
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) { run_mode(modes[i]); fflush(stdout); _exit(0); }
        int stt;
        waitpid(pid, &stt, 0);
    }
    return 0;
}
