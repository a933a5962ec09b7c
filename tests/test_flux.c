/* test_flux.c — FluxTransformer2DModel against diffusers 0.42 on tiny random checkpoints written
 * by save_pretrained (tests/fixtures/flux, tools/ref/gen_flux.py): a guidance-distilled model
 * with 3 heads of 12, rope axes (2, 4, 6), out_channels != in_channels, two blocks of each kind,
 * batch 2 with two timesteps and guidance values; a schnell-shaped model stored in bf16. The
 * velocity is within 1e-4 of diffusers (f32). Also: the new ops against finite differences
 * (interleaved rope, adaLN modulate, gated residual), the whole model's gradient against
 * finite differences on a few weights, latent packing round trip against the pipeline's layout,
 * and the loader's and forward's errors. */
#include "test_util.h"
#include "lora_check.h"
#include "mmc_diffusion.h"
#include "mmc_lora.h"
#include "mmc_encoders.h"
#include "mmc_image.h"
#include "mmc_train.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOL 1e-4

static void check_transformer(const char *name) {
    char dir[256], what[160];
    snprintf(dir, sizeof dir, "tests/fixtures/flux/%s", name);
    mmc_flux *m = NULL;
    CHECK_OK(mmc_flux_load(dir, false, &m));
    if (!m) return;
    snprintf(dir, sizeof dir, "flux/%s/expected.safetensors", name);
    mmc_st *exp = fixture_open(dir);
    if (!exp) { mmc_flux_free(m); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *hid = fixture_tensor(exp, "hidden", MMC_F32), *enc = fixture_tensor(exp, "encoder", MMC_F32);
    mmc_tensor *pooled = fixture_tensor(exp, "pooled", MMC_F32), *t = fixture_tensor(exp, "timestep", MMC_F32);
    mmc_tensor *img = fixture_tensor(exp, "img_ids", MMC_F32), *txt = fixture_tensor(exp, "txt_ids", MMC_F32);
    mmc_tensor *g = mmc_st_find(exp, "guidance") ? fixture_tensor(exp, "guidance", MMC_F32) : NULL;
    mmc_tensor *want = fixture_tensor(exp, "out", MMC_F32);
    mmc_flux_inputs in = {.hidden = hid, .encoder = enc, .pooled = pooled, .timestep = t->data,
                          .guidance = g ? g->data : NULL, .img_ids = img->data, .txt_ids = txt->data};
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_flux_forward(ctx, m, &in, &out));
    if (out) {
        snprintf(what, sizeof what, "%s velocity", name);
        CHECK(mmc_same_shape(out, want));
        CHECK_CLOSE(out, want, TOL, 0, what);
        printf("%s: velocity %s max|diff| %.2e (max|v| %.2f)\n", name, mmc_shape_str(out, what, sizeof what),
               max_abs_diff(out, want), max_abs(want));
        /* without a tape the blocks drop the attention's temporaries and run the MLPs over bands of tokens
         * (of 10 at most here, so several): the same values as the op-by-op blocks grad mode runs */
        setenv("MMC_FLUX_MLP_ROWS", "10", 1);
        mmc_tensor *banded = NULL, *plain = NULL;
        CHECK_OK(mmc_flux_forward(ctx, m, &in, &banded));
        unsetenv("MMC_FLUX_MLP_ROWS");
        mmc_set_grad_enabled(ctx, true);
        CHECK_OK(mmc_flux_forward(ctx, m, &in, &plain));
        mmc_set_grad_enabled(ctx, false);
        CHECK(banded && plain && mmc_same_shape(banded, out) && mmc_same_shape(plain, out) &&
              memcmp(banded->data, plain->data, mmc_nbytes(out)) == 0 && memcmp(out->data, plain->data, mmc_nbytes(out)) == 0);
    }
    /* guidance must match the checkpoint's kind, with an error that says which */
    in.guidance = g ? NULL : t->data;
    CHECK_ERR(mmc_flux_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "guidance") != NULL);
    in.guidance = g ? g->data : NULL;
    in.pooled = hid;
    CHECK_ERR(mmc_flux_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "pooled_projections") != NULL);
    mmc_tensor *ts[] = {hid, enc, pooled, t, img, txt, g, want};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_flux_free(m);
}

/* A diffusers LoRA (FluxPipeline.save_lora_weights, with metadata) on transformer_s: the velocity at
 * adapter weight 1 and 0.5 (set_adapters) within 1e-4 of diffusers + PEFT; saved back by mmc in
 * diffusers' layout and reloaded, the same output. */
static mmc_tensor *lora_forward(mmc_ctx *ctx, mmc_flux *m, const mmc_st *exp) {
    mmc_tensor *hid = fixture_tensor(exp, "hidden", MMC_F32), *enc = fixture_tensor(exp, "encoder", MMC_F32);
    mmc_tensor *pooled = fixture_tensor(exp, "pooled", MMC_F32), *t = fixture_tensor(exp, "timestep", MMC_F32);
    mmc_tensor *img = fixture_tensor(exp, "img_ids", MMC_F32), *txt = fixture_tensor(exp, "txt_ids", MMC_F32);
    mmc_flux_inputs in = {.hidden = hid, .encoder = enc, .pooled = pooled, .timestep = t->data,
                          .img_ids = img->data, .txt_ids = txt->data};
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_flux_forward(ctx, m, &in, &out));
    mmc_tensor *ts[] = {hid, enc, pooled, t, img, txt};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
    return out;
}

static void check_lora(void) {
    mmc_flux *m = NULL;
    CHECK_OK(mmc_flux_load("tests/fixtures/flux/transformer_s", false, &m));
    mmc_st *in = fixture_open("flux/transformer_s/expected.safetensors"), *exp = fixture_open("flux/lora_s/expected.safetensors");
    if (!m || !in || !exp) { mmc_flux_free(m); mmc_st_close(in); mmc_st_close(exp); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_module_list ml = {0};
    CHECK_OK(mmc_flux_linears(m, &ml));
    CHECK(ml.n == 6 + 14 + 6 + 2);   /* embedders, one double block, one single block, norm_out + proj_out */
    static const float weights[2] = {1.0f, 0.5f};
    static const char *const keys[2] = {"out", "out_half"};
    mmc_lora_set *s = NULL;
    for (int k = 0; k < 2; k++) {
        CHECK_OK(mmc_lora_load_diffusers("tests/fixtures/flux/lora_s", "transformer", &ml, weights[k], false, &s));
        if (!s) break;
        CHECK(s->n == 12 && s->r == 4 && s->alpha == 8.0f);
        mmc_tensor *out = lora_forward(ctx, m, in), *want = fixture_tensor(exp, keys[k], MMC_F32);
        CHECK_CLOSE(out, want, TOL, 0, keys[k]);
        printf("lora_s: weight %.1f max|diff| %.2e\n", weights[k], max_abs_diff(out, want));
        if (k == 0) {   /* save in diffusers' layout, reload: identical output */
            char tmp[] = "/tmp/mmc_flux_lora_XXXXXX";
            MMC_CHECK(mkdtemp(tmp), "mkdtemp");
            CHECK_OK(mmc_lora_save_diffusers(s, tmp, "transformer"));
            mmc_lora_free(s), s = NULL;
            CHECK_OK(mmc_lora_load_diffusers(tmp, "transformer", &ml, 1.0f, false, &s));
            mmc_tensor *again = lora_forward(ctx, m, in);
            CHECK(max_abs_diff(again, out) == 0);
            char cmd[300];
            snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
            MMC_CHECK(system(cmd) == 0, "rm");
        }
        mmc_tensor_free(want);
        mmc_lora_free(s), s = NULL;
    }
    /* an adapter for modules this model lacks names them */
    mmc_flux *g = NULL;
    CHECK_OK(mmc_flux_load("tests/fixtures/flux/transformer_g", false, &g));
    mmc_module_list gl = {0};
    if (g) CHECK_OK(mmc_flux_linears(g, &gl));
    CHECK_ERR(mmc_lora_load_diffusers("tests/fixtures/flux/lora_s", "transformer", &gl, 1.0f, false, &s), MMC_ERR_NOT_FOUND);
    CHECK(strstr(mmc_last_error(), "12 problems") && strstr(mmc_last_error(), "'proj_out': adapter for a [16, 16] weight, the module is [8, 36]"));
    CHECK_ERR(mmc_lora_load_diffusers("tests/fixtures/flux/lora_s", "unet", &ml, 1.0f, false, &s), MMC_ERR_FORMAT);
    /* a file whose adapter metadata is not JSON: an error naming it, not a crash */
    char tmp[] = "/tmp/mmc_flux_badlora_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    mmc_stw *bw = mmc_stw_new();
    mmc_tensor *a = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(4, 16)), *bt = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(16, 4));
    memset(a->data, 0, mmc_nbytes(a)), memset(bt->data, 0, mmc_nbytes(bt));
    char bp[256];
    snprintf(bp, sizeof bp, "%s/pytorch_lora_weights.safetensors", tmp);
    CHECK_OK(mmc_stw_add(bw, "transformer.proj_out.lora_A.weight", a));
    CHECK_OK(mmc_stw_add(bw, "transformer.proj_out.lora_B.weight", bt));
    CHECK_OK(mmc_stw_set_metadata(bw, "lora_adapter_metadata", "{\"transformer.r\": 4,"));
    CHECK_OK(mmc_stw_write(bw, bp));
    mmc_stw_free(bw);
    CHECK_ERR(mmc_lora_load_diffusers(tmp, "transformer", &ml, 1.0f, false, &s), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "lora_adapter_metadata is not JSON") != NULL);
    mmc_tensor_free(a), mmc_tensor_free(bt);
    snprintf(bp, sizeof bp, "rm -rf %s", tmp);
    MMC_CHECK(system(bp) == 0, "rm");
    mmc_module_list_free(&gl);
    mmc_flux_free(g);
    mmc_module_list_free(&ml);
    mmc_ctx_free(ctx);
    mmc_st_close(in);
    mmc_st_close(exp);
    mmc_flux_free(m);
}

/* 20 steps of flow-matching LoRA training against the same loop in diffusers + PEFT + torch
 * (tools/ref/gen_flux.py train_lora): the timestep draws u become sigmas / timesteps equal to
 * get_sigmas' lookup, each step's loss and pre-clip gradient norm within 1e-3 (relative), and the
 * final adapter within 1e-3 of PyTorch's. */
static void check_train(void) {
    mmc_flux *m = NULL;
    CHECK_OK(mmc_flux_load("tests/fixtures/flux/transformer_s", false, &m));
    mmc_st *exp = fixture_open("flux/train_lora/expected.safetensors"), *fin = fixture_open("flux/train_lora/final.safetensors");
    if (!m || !exp || !fin) { mmc_flux_free(m); mmc_st_close(exp); mmc_st_close(fin); return; }
    mmc_fm_config fc;
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_load("tests/fixtures/flux/train_lora/scheduler_config.json", &j));
    CHECK_OK(mmc_fm_config_read(j, "scheduler_config.json", &fc));
    mmc_json_free(j);
    mmc_module_list ml = {0};
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_flux_linears(m, &ml));
    CHECK_OK(mmc_lora_load_diffusers("tests/fixtures/flux/train_lora/initial.safetensors", "transformer", &ml, 1.0f, true, &s));
    if (!s) { mmc_module_list_free(&ml); mmc_flux_free(m); mmc_st_close(exp); mmc_st_close(fin); return; }
    mmc_adamw opt;
    mmc_adamw_opts o = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-4};
    CHECK_OK(mmc_adamw_init(&opt, &o, s->params, s->n_params));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_flux_fm_batch b = {.prompt_embeds = fixture_tensor(exp, "prompt_embeds", MMC_F32),
                           .pooled = fixture_tensor(exp, "pooled", MMC_F32), .weighting = MMC_FM_COSMAP};
    double worst_loss = 0, worst_norm = 0;
    for (int step = 0; step < 20; step++) {
        char k[64];
        snprintf(k, sizeof k, "x0_%d", step);
        mmc_tensor *x0 = fixture_tensor(exp, k, MMC_F32);
        snprintf(k, sizeof k, "noise_%d", step);
        mmc_tensor *nz = fixture_tensor(exp, k, MMC_F32);
        snprintf(k, sizeof k, "u_%d", step);
        mmc_tensor *u = fixture_tensor(exp, k, MMC_F32);
        snprintf(k, sizeof k, "sigmas_%d", step);
        mmc_tensor *ws = fixture_tensor(exp, k, MMC_F32);
        snprintf(k, sizeof k, "timesteps_%d", step);
        mmc_tensor *wt = fixture_tensor(exp, k, MMC_F32);
        float sig[2], ts[2];
        for (int i = 0; i < 2; i++) {
            mmc_fm_train_sigma(&fc, ((float *)u->data)[i], &sig[i], &ts[i]);
            CHECK(sig[i] == ((float *)ws->data)[i] && ts[i] == ((float *)wt->data)[i]);   /* bitwise */
        }
        b.latents = x0, b.noise = nz, b.sigmas = sig, b.timesteps = ts;
        mmc_tensor *loss = NULL;
        CHECK_OK(mmc_flux_fm_loss(ctx, m, &b, &loss));
        if (!loss) break;
        const double lv = *(float *)loss->data;
        mmc_backward(ctx, loss);
        mmc_ctx_reset(ctx);
        const double norm = mmc_clip_grad_norm(s->params, s->n_params, 1.0);
        mmc_adamw_step(&opt, o.lr);
        mmc_zero_grad(s->params, s->n_params);
        snprintf(k, sizeof k, "loss_%d", step);
        mmc_tensor *wl = fixture_tensor(exp, k, MMC_F32);
        snprintf(k, sizeof k, "grad_norm_%d", step);
        mmc_tensor *wn = fixture_tensor(exp, k, MMC_F32);
        const double rl = fabs(lv - ((float *)wl->data)[0]) / fabs(((float *)wl->data)[0]);
        const double rn = fabs(norm - ((float *)wn->data)[0]) / fabs(((float *)wn->data)[0]);
        worst_loss = fmax(worst_loss, rl), worst_norm = fmax(worst_norm, rn);
        CHECKF(rl < 1e-3 && rn < 1e-3, "step %d: loss %.6f vs %.6f, grad norm %.5f vs %.5f", step, lv,
               ((float *)wl->data)[0], norm, ((float *)wn->data)[0]);
        mmc_tensor *ts_[] = {x0, nz, u, ws, wt, wl, wn};
        for (size_t i = 0; i < sizeof ts_ / sizeof ts_[0]; i++) mmc_tensor_free(ts_[i]);
    }
    /* the final adapter */
    const double worst_w = lora_max_rel_diff(fin, "transformer.", s);
    CHECKF(worst_w < 1e-3, "final adapter: max relative difference %.2e", worst_w);
    printf("train_lora: 20 steps, loss rel diff <= %.2e, grad norm <= %.2e, final adapter <= %.2e\n", worst_loss,
           worst_norm, worst_w);
    mmc_tensor_free(b.prompt_embeds);
    mmc_tensor_free(b.pooled);
    mmc_adamw_free(&opt);
    mmc_ctx_free(ctx);
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_flux_free(m);
    mmc_st_close(exp);
    mmc_st_close(fin);
}

/* compute_density_for_timestep_sampling / compute_loss_weighting_for_sd3 formulas */
static void check_fm_formulas(void) {
    CHECK_NEAR(mmc_fm_loss_weight(MMC_FM_SIGMA_SQRT, 0.5f), 4.0, 1e-6);
    CHECK_NEAR(mmc_fm_loss_weight(MMC_FM_COSMAP, 0.5f), 2.0 / (M_PI * 0.5), 1e-6);
    CHECK(mmc_fm_loss_weight(MMC_FM_LOGIT_NORMAL, 0.3f) == 1.0f && mmc_fm_loss_weight(MMC_FM_NONE, 0.3f) == 1.0f);
    mmc_rng r;
    mmc_rng_init(&r, 7);
    float u[4096];
    mmc_fm_sample_u(MMC_FM_LOGIT_NORMAL, 0.0, 1.0, 1.29, &r, 4096, u);
    double mean = 0;
    int in01 = 1;
    for (int i = 0; i < 4096; i++) mean += u[i], in01 &= u[i] > 0 && u[i] < 1;
    CHECK(in01 && fabs(mean / 4096 - 0.5) < 0.02);          /* sigmoid(N(0, 1)) is symmetric about 1/2 */
    mmc_fm_sample_u(MMC_FM_MODE, 0.0, 1.0, 1.29, &r, 4096, u);
    int mid = 0;
    for (int i = 0; i < 4096; i++) mid += u[i] > 0.25f && u[i] < 0.75f;
    CHECK(mid > 4096 / 2);                                   /* mode sampling favours the middle */
    mmc_fm_scheme sc;
    CHECK_ERR(mmc_fm_scheme_parse("logit-normal", "flow_matching.weighting_scheme", &sc), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "logit_normal") != NULL);
    /* every name diffusers' --weighting_scheme takes, "uniform" as "none" (U(0, 1), weight 1) */
    static const char *const names[] = {"none", "uniform", "logit_normal", "mode", "sigma_sqrt", "cosmap"};
    static const mmc_fm_scheme want[] = {MMC_FM_NONE, MMC_FM_NONE, MMC_FM_LOGIT_NORMAL, MMC_FM_MODE,
                                         MMC_FM_SIGMA_SQRT, MMC_FM_COSMAP};
    for (int i = 0; i < 6; i++) {
        sc = (mmc_fm_scheme)-1;
        CHECK_OK(mmc_fm_scheme_parse(names[i], "flow_matching.weighting_scheme", &sc));
        CHECKF(sc == want[i], "weighting_scheme %s parsed as %d", names[i], (int)sc);
    }
    /* compute_loss_weighting_for_sd3 at another sigma: sigma_sqrt 1 / s^2, cosmap 2 / (pi (1 - 2s + 2s^2)),
     * every other scheme 1 (mode and logit_normal change the density only) */
    CHECK_NEAR(mmc_fm_loss_weight(MMC_FM_SIGMA_SQRT, 0.2f), 25.0, 1e-4);
    CHECK_NEAR(mmc_fm_loss_weight(MMC_FM_COSMAP, 0.2f), 2.0 / (M_PI * (1.0 - 0.4 + 0.08)), 1e-6);
    CHECK(mmc_fm_loss_weight(MMC_FM_MODE, 0.2f) == 1.0f && mmc_fm_loss_weight(MMC_FM_LOGIT_NORMAL, 0.9f) == 1.0f);
    /* compute_density_for_timestep_sampling, each scheme from the same stream:
     * logit_normal with mean 0.7, std 0.4: logit(u) has that mean and std (4096 draws: standard error
     * of the mean 0.006, of the std ~0.005; tolerance 0.03) */
    mmc_rng_init(&r, 11);
    mmc_fm_sample_u(MMC_FM_LOGIT_NORMAL, 0.7, 0.4, 1.29, &r, 4096, u);
    double s1 = 0, s2 = 0;
    in01 = 1;
    for (int i = 0; i < 4096; i++) {
        const double l = log(u[i] / (1.0 - u[i]));
        s1 += l, s2 += l * l, in01 &= u[i] > 0 && u[i] < 1;
    }
    const double lm = s1 / 4096, ls = sqrt(s2 / 4096 - lm * lm);
    CHECKF(in01 && fabs(lm - 0.7) < 0.03 && fabs(ls - 0.4) < 0.03, "logit_normal(0.7, 0.4): logit mean %.4f std %.4f", lm, ls);
    /* uniform ("none"): the stream's U(0, 1) draws themselves */
    float v[4096];
    mmc_rng r2;
    mmc_rng_init(&r, 12), mmc_rng_init(&r2, 12);
    mmc_fm_sample_u(MMC_FM_NONE, 0.7, 0.4, 1.29, &r, 4096, u);
    mmc_rng_uniform(&r2, v, 4096, 0.0f, 1.0f);
    CHECK(memcmp(u, v, sizeof u) == 0);
    mean = 0;
    for (int i = 0; i < 4096; i++) mean += u[i];
    CHECKF(fabs(mean / 4096 - 0.5) < 0.02, "uniform: mean %.4f", mean / 4096);
    /* mode with scale s: 1 - x - s (cos^2(pi x / 2) - 1 + x) of the same U(0, 1) draws x, here in double;
     * scale 0 is 1 - x */
    static const double scales[2] = {1.29, 0.0};
    for (int k = 0; k < 2; k++) {
        mmc_rng_init(&r, 13), mmc_rng_init(&r2, 13);
        mmc_fm_sample_u(MMC_FM_MODE, 0.0, 1.0, scales[k], &r, 4096, u);
        mmc_rng_uniform(&r2, v, 4096, 0.0f, 1.0f);
        double worst = 0;
        for (int i = 0; i < 4096; i++) {
            const double x = v[i], c = cos(M_PI * x / 2.0);
            worst = fmax(worst, fabs(u[i] - (1.0 - x - scales[k] * (c * c - 1.0 + x))));
        }
        CHECKF(worst < 1e-6, "mode(scale %.2f): max |u - formula| %.2e", scales[k], worst);
    }
}

/* ---- the ops it adds, against finite differences */
static mmc_tensor *g_cos, *g_sin;
static mmc_tensor *f_rope(mmc_ctx *ctx, mmc_tensor **in, void *u) {
    (void)u;
    return mmc_rope_interleaved(ctx, in[0], g_cos, g_sin);
}
static mmc_tensor *f_modulate(mmc_ctx *ctx, mmc_tensor **in, void *u) {
    (void)u;
    mmc_tensor *parts[2];
    mmc_split(ctx, in[1], 1, 2, MMC_SHAPE(5, 5), parts);    /* strided chunks, as the model passes them */
    return mmc_modulate(ctx, in[0], parts[0], parts[1]);
}
static mmc_tensor *f_gate(mmc_ctx *ctx, mmc_tensor **in, void *u) {
    (void)u;
    return mmc_gate_residual(ctx, in[0], in[1], in[2]);
}

static void check_ops(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    /* the rope table: FluxPosEmbed for ids (0, 1, 2) and (0, 3, 5), axes (2, 2, 4), theta 10000 */
    float ids[6] = {0, 1, 2, 0, 3, 5};
    const int axes[3] = {2, 2, 4};
    mmc_rope_table_axes(ctx, ids, 2, 3, axes, 10000.0, &g_cos, &g_sin);
    const float *c = g_cos->data, *s = g_sin->data;
    CHECK(c[0] == 1.0f && c[1] == 1.0f && s[0] == 0.0f);                      /* axis 0, position 0 */
    CHECK_NEAR(c[2], cos(1.0), 1e-7);                                         /* axis 1 position 1, freq 1 */
    CHECK(c[2] == c[3]);
    CHECK_NEAR(s[8 + 4 + 2], sin(5.0 / 100.0), 1e-7);                       /* axis 2 pair 1: 5 / 10000^(2/4) */
    int64_t shx[4] = {1, 2, 3, 8};
    mmc_tensor *x = randn_param(1, 4, shx, 1.0f);
    mmc_tensor *in1[1] = {x};
    CHECK(gradcheck("rope_interleaved", f_rope, in1, 1, NULL, 1e-2, 1e-3, 1e-2, 64) == 0);
    /* rotating (1, 0) by the angle gives (cos, sin) */
    mmc_tensor *one = mmc_zeros(ctx, MMC_F32, 4, MMC_SHAPE(1, 2, 1, 8));
    ((float *)one->data)[8 + 2] = 1.0f;
    mmc_tensor *r = mmc_rope_interleaved(ctx, one, g_cos, g_sin);
    CHECK_NEAR(((float *)r->data)[8 + 2], cos(3.0), 1e-6);
    CHECK_NEAR(((float *)r->data)[8 + 3], sin(3.0), 1e-6);
    mmc_tensor *xm = randn_param(2, 3, MMC_SHAPE(2, 3, 5), 1.0f), *e = randn_param(3, 2, MMC_SHAPE(2, 10), 0.5f);
    mmc_tensor *in2[2] = {xm, e};
    CHECK(gradcheck("modulate", f_modulate, in2, 2, NULL, 1e-2, 1e-3, 1e-2, 64) == 0);
    mmc_tensor *gx = randn_param(4, 3, MMC_SHAPE(2, 3, 5), 1.0f), *gt = randn_param(5, 2, MMC_SHAPE(2, 5), 1.0f);
    mmc_tensor *gy = randn_param(6, 3, MMC_SHAPE(2, 3, 5), 1.0f);
    mmc_tensor *in3[3] = {gx, gt, gy};
    CHECK(gradcheck("gate_residual", f_gate, in3, 3, NULL, 1e-2, 1e-3, 1e-2, 64) == 0);
    mmc_tensor *ts[] = {x, xm, e, gx, gt, gy};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
    mmc_ctx_free(ctx);
}

/* _pack_latents / _unpack_latents / _prepare_latent_image_ids */
static void check_packing(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *z = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(1, 2, 4, 6));
    for (int64_t i = 0; i < mmc_numel(z); i++) ((float *)z->data)[i] = (float)i;
    mmc_tensor *p = mmc_flux_pack_latents(ctx, z);
    CHECK(p->shape[0] == 1 && p->shape[1] == 6 && p->shape[2] == 8);
    /* token (row 1, col 2) = latent rows 2..3, cols 4..5; channel 1, dy 1, dx 0 -> element 4*1 + 2 */
    CHECK(((float *)p->data)[(1 * 3 + 2) * 8 + 6] == (float)((1 * 4 + 3) * 6 + 4));
    mmc_tensor *u = mmc_flux_unpack_latents(ctx, p, 4, 6);
    CHECK(max_abs_diff(u, z) == 0);
    float ids[18];
    mmc_flux_latent_ids(4, 6, ids);
    CHECK(ids[5 * 3] == 0 && ids[5 * 3 + 1] == 1 && ids[5 * 3 + 2] == 2);
    mmc_ctx_free(ctx);
}

/* FluxPipeline from the fixture's prompt embeddings and injected latents: the image after the
 * denoising loop and the VAE within 1e-3 of diffusers' output_type="pt" (run a: 3 steps, distilled
 * guidance 3.5, batch 2; run b: 2 steps, true CFG 1.5 against a negative prompt). */
static mmc_tensor *slice_rows(const mmc_tensor *t, int64_t b0, int64_t nb) {
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = nb;
    mmc_tensor *r = mmc_tensor_new(MMC_F32, t->ndim, shape);
    memcpy(r->data, (const float *)t->data + b0 * (mmc_numel(t) / t->shape[0]), mmc_nbytes(r));
    return r;
}

static int g_progress_calls;
static void on_progress(void *u, int step, int n, double secs) {
    (void)u, (void)secs;
    g_progress_calls++;
    MMC_CHECK(step >= 1 && step <= n, "progress step");
}

static void check_pipeline(void) {
    mmc_flux_pipeline *p = NULL;
    CHECK_OK(mmc_flux_pipeline_open("tests/fixtures/flux/pipe", &p));
    mmc_st *exp = fixture_open("flux/pipe/expected.safetensors");
    if (!p || !exp) { mmc_flux_pipeline_free(p); mmc_st_close(exp); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *pe = fixture_tensor(exp, "prompt_embeds", MMC_F32), *pp = fixture_tensor(exp, "pooled_prompt_embeds", MMC_F32);
    mmc_flux_cond cond = {pe, pp};
    /* both tokenizers as the pipeline calls them, then encode_prompt, against diffusers */
    static const char *const prompts[3] = {"a red circle on the left", "a big blue square", "green"};
    mmc_clip_tokenizer *ct = NULL;
    mmc_t5_tokenizer *tt = NULL;
    CHECK_OK(mmc_clip_tokenizer_load("tests/fixtures/flux/pipe/tokenizer", &ct));
    CHECK_OK(mmc_t5_tokenizer_load_pipeline("tests/fixtures/flux/pipe/tokenizer_2", MMC_T5_PIPELINE_TRANSFORMERS5, &tt));
    for (int i = 0; ct && tt && i < 3; i++) {
        char k[32];
        int32_t ids[77];
        snprintf(k, sizeof k, "clip_ids%d", i);
        mmc_tensor *want = fixture_tensor(exp, k, MMC_I32);
        CHECK_OK(mmc_clip_tokenizer_encode_padded(ct, prompts[i], 77, ids, NULL, NULL));
        CHECK(!memcmp(ids, want->data, sizeof ids));
        mmc_tensor_free(want);
        snprintf(k, sizeof k, "t5_ids%d", i);
        want = fixture_tensor(exp, k, MMC_I32);
        CHECK_OK(mmc_t5_tokenizer_encode_padded(tt, prompts[i], 16, ids, NULL, NULL));
        CHECKF(!memcmp(ids, want->data, 16 * sizeof *ids), "T5 ids of '%s'", prompts[i]);
        mmc_tensor_free(want);
    }
    mmc_clip_tokenizer_free(ct);
    mmc_t5_tokenizer_free(tt);
    mmc_flux_cond enc = {0};
    CHECK_OK(mmc_flux_encode_prompt(ctx, p, prompts, 2, 16, &enc));
    if (enc.prompt_embeds) {
        CHECK(mmc_same_shape(enc.prompt_embeds, pe) && mmc_same_shape(enc.pooled, pp));
        CHECK_CLOSE(enc.prompt_embeds, pe, TOL, 0, "encode_prompt: T5 prompt_embeds");
        CHECK_CLOSE(enc.pooled, pp, TOL, 0, "encode_prompt: CLIP pooled");
        printf("encode_prompt: prompt_embeds max|diff| %.2e, pooled %.2e\n", max_abs_diff(enc.prompt_embeds, pe),
               max_abs_diff(enc.pooled, pp));
    }
    mmc_flux_cond_free(&enc);
    mmc_tensor *lat = fixture_tensor(exp, "latents_a", MMC_F32), *want = fixture_tensor(exp, "image_a", MMC_F32);
    mmc_flux_sample_opts o = {.height = 32, .width = 48, .steps = 3, .guidance = 3.5, .progress = on_progress};
    CHECK_OK(mmc_flux_sample(ctx, p, &cond, NULL, lat, &o));
    CHECK(g_progress_calls == 3);
    mmc_tensor *img = NULL;
    CHECK_OK(mmc_flux_decode(ctx, p, lat, 32, 48, false, &img));
    if (img) {
        CHECK(mmc_same_shape(img, want));
        CHECK_CLOSE(img, want, 1e-3, 0, "pipeline image (guidance 3.5, 3 steps, batch 2)");
        printf("pipeline a: image %s max|diff| %.2e\n", mmc_shape_str(img, (char[64]){0}, 64), max_abs_diff(img, want));
    }
    mmc_tensor_free(lat), mmc_tensor_free(want);
    /* run b: prompt 0 alone against the negative prompt */
    mmc_flux_cond c0 = {slice_rows(pe, 0, 1), slice_rows(pp, 0, 1)};
    mmc_flux_cond neg = {fixture_tensor(exp, "neg_prompt_embeds", MMC_F32), fixture_tensor(exp, "neg_pooled_prompt_embeds", MMC_F32)};
    lat = fixture_tensor(exp, "latents_b", MMC_F32), want = fixture_tensor(exp, "image_b", MMC_F32);
    o.steps = 2, o.guidance = 2.0, o.true_cfg = 1.5;
    CHECK_OK(mmc_flux_sample(ctx, p, &c0, &neg, lat, &o));
    CHECK_OK(mmc_flux_decode(ctx, p, lat, 32, 48, false, &img));
    if (img) {
        CHECK_CLOSE(img, want, 1e-3, 0, "pipeline image (true CFG 1.5, 2 steps)");
        printf("pipeline b: true CFG max|diff| %.2e\n", max_abs_diff(img, want));
    }
    /* img2img (FluxImg2ImgPipeline): strength 0.6 of 4 steps starts at step 1 */
    CHECK(mmc_flux_img2img_start(4, 0.6) == 1 && mmc_flux_img2img_start(4, 1.0) == 0 && mmc_flux_img2img_start(4, 0.2) == 3);
    mmc_tensor *il = fixture_tensor(exp, "i2i_image_latents", MMC_F32), *in = fixture_tensor(exp, "i2i_noise", MMC_F32);
    mmc_tensor *packed = NULL, *wi = fixture_tensor(exp, "i2i_image", MMC_F32);
    int start = -1;
    CHECK_OK(mmc_flux_img2img_latents(ctx, p, il, in, 4, 0.6, 32, 48, &packed, &start));
    if (packed) {
        mmc_tensor *keep = mmc_tensor_new(MMC_F32, 3, packed->shape);
        memcpy(keep->data, packed->data, mmc_nbytes(packed));
        mmc_flux_sample_opts io = {.height = 32, .width = 48, .steps = 4, .guidance = 3.5, .start_step = start};
        CHECK_OK(mmc_flux_sample(ctx, p, &c0, NULL, keep, &io));
        CHECK_OK(mmc_flux_decode(ctx, p, keep, 32, 48, false, &img));
        if (img) {
            CHECK_CLOSE(img, wi, 1e-3, 0, "img2img image (strength 0.6)");
            printf("pipeline img2img: max|diff| %.2e\n", max_abs_diff(img, wi));
        }
        mmc_tensor_free(keep);
    }
    CHECK_ERR(mmc_flux_img2img_latents(ctx, p, il, in, 4, 0.0, 32, 48, &packed, &start), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "no denoising step") != NULL);
    mmc_tensor_free(il), mmc_tensor_free(in), mmc_tensor_free(wi);
    /* VaeImageProcessor.preprocess: Pillow's lanczos to 48 x 32, then [-1, 1] */
    mmc_image src = {0}, rs = {0};
    mmc_image_opts iop;
    mmc_image_opts_default(&iop);
    CHECK_OK(mmc_image_load("tests/fixtures/flux/pipe/init.png", &iop, &src));
    CHECK_OK(mmc_image_resize(&src, 32, 48, MMC_RESAMPLE_LANCZOS, &rs));
    mmc_tensor *wp = fixture_tensor(exp, "init_preprocessed", MMC_F32);
    double worst = 0;
    for (int c = 0; rs.data && c < 3; c++)
        for (int i = 0; i < 32 * 48; i++)
            worst = fmax(worst, fabs((rs.data[i * 3 + c] / 255.0f - 0.5f) / 0.5f - ((float *)wp->data)[c * 32 * 48 + i]));
    CHECKF(worst < 1e-6, "lanczos preprocess: max|diff| %.3g", worst);
    mmc_tensor_free(wp);
    mmc_image_free(&src);
    mmc_image_free(&rs);
    /* sizes that the VAE and the packing cannot take: the error names the nearest valid one */
    o.height = 42;
    CHECK_ERR(mmc_flux_sample(ctx, p, &c0, NULL, lat, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "multiples of 4") && strstr(mmc_last_error(), "48x44"));
    mmc_tensor_free(lat), mmc_tensor_free(want);
    mmc_flux_cond_free(&c0);
    mmc_flux_cond_free(&neg);
    mmc_flux_cond_free(&cond);
    /* a pipeline folder of another kind */
    mmc_flux_pipeline *q = NULL;
    CHECK_ERR(mmc_flux_pipeline_open("tests/fixtures/flux/transformer_s", &q), MMC_ERR_NOT_FOUND);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_flux_pipeline_free(p);
}

static void check_errors(void) {
    mmc_flux *m = NULL;
    CHECK_ERR(mmc_flux_load("tests/fixtures/flux/nonexistent", false, &m), MMC_ERR_NOT_FOUND);
    /* a config that does not match the checkpoint: every problem is named */
    char tmp[] = "/tmp/mmc_flux_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp tests/fixtures/flux/transformer_s/diffusion_pytorch_model.safetensors %s/ && "
             "sed 's/\"num_single_layers\": 1/\"num_single_layers\": 2/' tests/fixtures/flux/transformer_s/config.json"
             " > %s/config.json", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "cp");
    CHECK_ERR(mmc_flux_load(tmp, false, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "single_transformer_blocks.1.attn.to_q.weight") != NULL);
    snprintf(cmd, sizeof cmd, "sed 's/\"axes_dims_rope\": \\[/\"axes_dims_rope\": [ 2,/' "
             "tests/fixtures/flux/transformer_s/config.json > %s/config.json", tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_flux_load(tmp, false, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "axes_dims_rope") != NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "rm");
}

/* Aspect-ratio buckets: the bucket diffusers' find_nearest_bucket picks (its answers for these sizes,
 * taken from diffusers 0.42.1 with parse_buckets_string("32,32;24,40;40,24;32,48;48,32")), ties to the last. */
static void check_buckets(void) {
    const int bh[] = {32, 24, 40, 32, 48}, bw[] = {32, 40, 24, 48, 32};
    const int cases[][3] = {{40, 48, 0}, {50, 70, 3}, {33, 29, 0}, {333, 500, 3}, {100, 100, 0}, {30, 50, 1},
                            {50, 30, 2}, {64, 64, 0}, {1, 1000, 1}, {1000, 1, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECKF(mmc_fm_nearest_bucket(cases[i][0], cases[i][1], bh, bw, 5) == cases[i][2], "%dx%d: bucket %d, diffusers %d",
               cases[i][0], cases[i][1], mmc_fm_nearest_bucket(cases[i][0], cases[i][1], bh, bw, 5), cases[i][2]);
    const int th[] = {32, 16}, tw[] = {32, 16};
    CHECK(mmc_fm_nearest_bucket(10, 10, th, tw, 2) == 1);   /* equal metrics: the last */
}

int main(int argc, char **argv) {
    if (access("tests/fixtures/flux/transformer_g/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_flux: fixtures absent (tools/ref/gen_flux.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "ops")) check_ops();
    if (test_part(argc, argv, "packing")) check_packing();
    if (test_part(argc, argv, "transformer")) {
        check_transformer("transformer_g");
        check_transformer("transformer_s");
    }
    if (test_part(argc, argv, "lora")) check_lora();
    if (test_part(argc, argv, "pipeline")) check_pipeline();
    if (test_part(argc, argv, "train")) {
        check_fm_formulas();
        check_train();
        check_buckets();
    }
    if (test_part(argc, argv, "errors")) check_errors();
    return test_done("test_flux");
}
