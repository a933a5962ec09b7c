/* test_sd3.c — SD3Transformer2DModel against diffusers 0.42 on tiny random checkpoints written by
 * save_pretrained (tests/fixtures/sd3, tools/ref/gen_sd3.py): an SD3-shaped model (3 heads of 8,
 * out_channels != in_channels, non-square 6x10 latents cropped off-centre from an 8x8 position
 * table), an SD3.5-medium-shaped one (rms qk norm, dual attention in block 0, plus skip_layers),
 * and a one-block model stored in bf16 whose single block is both dual and context_pre_only. The
 * velocity is within 1e-4 of diffusers (f32). Also: the whole model's gradient against finite
 * differences (latents, text states and a few weights), the LoRA module names, the stored position
 * table against diffusers' sin-cos formula, and the loader's and forward's errors. */
#include "test_util.h"
#include "lora_check.h"
#include "step_check.h"
#include "mmc_diffusion.h"
#include "mmc_lora.h"
#include "mmc_train.h"

#include <unistd.h>

#define TOL 1e-4

typedef struct {
    mmc_tensor *hid, *enc, *pooled, *t, *want, *want_skip;
} sd3_case;

static mmc_st *open_case(const char *name, sd3_case *k) {
    char rel[256];
    snprintf(rel, sizeof rel, "sd3/%s/expected.safetensors", name);
    mmc_st *exp = fixture_open(rel);
    if (!exp) return NULL;
    k->hid = fixture_tensor(exp, "hidden", MMC_F32), k->enc = fixture_tensor(exp, "encoder", MMC_F32);
    k->pooled = fixture_tensor(exp, "pooled", MMC_F32), k->t = fixture_tensor(exp, "timestep", MMC_F32);
    k->want = fixture_tensor(exp, "out", MMC_F32);
    k->want_skip = mmc_st_find(exp, "out_skip") ? fixture_tensor(exp, "out_skip", MMC_F32) : NULL;
    return exp;
}

static void free_case(sd3_case *k) {
    mmc_tensor *ts[] = {k->hid, k->enc, k->pooled, k->t, k->want, k->want_skip};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
}

static void check_transformer(const char *name) {
    char dir[256], what[160];
    snprintf(dir, sizeof dir, "tests/fixtures/sd3/%s", name);
    mmc_sd3 *m = NULL;
    CHECK_OK(mmc_sd3_load(dir, false, &m));
    if (!m) return;
    sd3_case k;
    mmc_st *exp = open_case(name, &k);
    if (!exp) { mmc_sd3_free(m); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_sd3_inputs in = {.hidden = k.hid, .encoder = k.enc, .pooled = k.pooled, .timestep = k.t->data};
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_sd3_forward(ctx, m, &in, &out));
    if (out) {
        snprintf(what, sizeof what, "%s velocity", name);
        CHECK(mmc_same_shape(out, k.want));
        CHECK_CLOSE(out, k.want, TOL, 0, what);
        printf("%s: velocity %s max|diff| %.2e (max|v| %.2f)\n", name, mmc_shape_str(out, what, sizeof what),
               max_abs_diff(out, k.want), max_abs(k.want));
    }
    if (k.want_skip) {   /* skip-layer guidance: block 0 skipped */
        in.skip_layers = (const int[]){0}, in.n_skip_layers = 1;
        CHECK_OK(mmc_sd3_forward(ctx, m, &in, &out));
        if (out) {
            CHECK_CLOSE(out, k.want_skip, TOL, 0, "skip_layers=[0]");
            printf("%s: skip_layers=[0] max|diff| %.2e\n", name, max_abs_diff(out, k.want_skip));
        }
        in.skip_layers = NULL, in.n_skip_layers = 0;
    }
    /* bad inputs are errors naming what is wrong */
    const mmc_sd3_config *c = mmc_sd3_cfg(m);
    const int64_t pm = c->pos_embed_max_size * c->patch_size;
    mmc_tensor *big = mmc_zeros(ctx, MMC_F32, 4, MMC_SHAPE(2, c->in_channels, pm + c->patch_size, c->patch_size));
    in.hidden = big;
    CHECK_ERR(mmc_sd3_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "pos_embed_max_size") != NULL);
    mmc_tensor *odd = mmc_zeros(ctx, MMC_F32, 4, MMC_SHAPE(2, c->in_channels, c->patch_size + 1, 2 * c->patch_size));
    in.hidden = odd;
    CHECK_ERR(mmc_sd3_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "multiples of patch_size") != NULL);
    in.hidden = k.enc;
    CHECK_ERR(mmc_sd3_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "hidden_states") != NULL);
    in.hidden = k.hid, in.pooled = k.enc;
    CHECK_ERR(mmc_sd3_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "pooled_projections") != NULL);
    in.pooled = k.pooled, in.encoder = k.pooled;
    CHECK_ERR(mmc_sd3_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "encoder_hidden_states") != NULL);
    free_case(&k);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_sd3_free(m);
}

/* ---- the model's gradient against finite differences, on the SD3.5-shaped fixture (every kind
 * of block piece: dual attention, rms qk norm, the context_pre_only block). The forward runs in f32,
 * which leaves about 2e-3 of noise in the central differences: hence the absolute tolerance. */
static sd3_case g_case;
static mmc_sd3 *g_model;
static mmc_tensor *f_model(mmc_ctx *ctx, mmc_tensor **in, void *u) {
    (void)u;
    mmc_sd3_inputs x = {.hidden = in[0], .encoder = in[1], .pooled = g_case.pooled, .timestep = g_case.t->data};
    mmc_tensor *out = NULL;
    MMC_CHECK(mmc_sd3_forward(ctx, g_model, &x, &out) == MMC_OK, "%s", mmc_last_error());
    return out;
}

static void check_grad(void) {
    CHECK_OK(mmc_sd3_load("tests/fixtures/sd3/sd35", true, &g_model));
    if (!g_model) return;
    mmc_st *exp = open_case("sd35", &g_case);
    if (!exp) { mmc_sd3_free(g_model); return; }
    /* a trainable load matches the mapped one */
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_sd3_inputs x = {.hidden = g_case.hid, .encoder = g_case.enc, .pooled = g_case.pooled,
                        .timestep = g_case.t->data};
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_sd3_forward(ctx, g_model, &x, &out));
    if (out) CHECK_CLOSE(out, g_case.want, TOL, 0, "trainable load");
    mmc_ctx_free(ctx);
    const char *names[] = {"pos_embed.proj.weight", "transformer_blocks.0.norm1.linear.weight",
                           "transformer_blocks.0.attn2.norm_q.weight", "transformer_blocks.1.attn.add_k_proj.weight",
                           "transformer_blocks.1.norm1_context.linear.bias", "proj_out.weight"};
    mmc_tensor *in[2 + 6];
    in[0] = g_case.hid, in[1] = g_case.enc;
    in[0]->flags |= MMC_PARAM | MMC_REQUIRES_GRAD, in[1]->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    for (int i = 0; i < 6; i++) {
        in[2 + i] = mmc_sd3_param(g_model, names[i]);
        CHECK(in[2 + i] && (in[2 + i]->flags & MMC_REQUIRES_GRAD));
        if (!in[2 + i]) goto done;
    }
    /* the position table is a buffer: bound, but not a trainable parameter */
    mmc_tensor *pe = mmc_sd3_param(g_model, "pos_embed.pos_embed");
    CHECK(pe && !(pe->flags & MMC_REQUIRES_GRAD));
    CHECK(gradcheck("sd3 forward", f_model, in, 8, NULL, 1e-2, 6e-3, 2e-2, 12) == 0);
done:
    free_case(&g_case);
    mmc_st_close(exp);
    mmc_sd3_free(g_model);
}

/* diffusers' module names for LoRA, and parameter count as num_parameters() gives it */
static void check_modules(void) {
    mmc_sd3 *m = NULL;
    CHECK_OK(mmc_sd3_load("tests/fixtures/sd3/sd35", false, &m));
    if (!m) return;
    mmc_module_list ml = {0};
    CHECK_OK(mmc_sd3_linears(m, &ml));
    /* 5 embedders, block 0 (dual): 2 norms + 8 attn + 4 attn2 + 4 ff, block 1 (pre_only): 2 + 7 + 2, norm_out,
     * proj_out */
    CHECK(ml.n == 5 + 18 + 11 + 2);
    bool q = false, a2 = false, no_add_out = true;
    for (int i = 0; i < ml.n; i++) {
        q |= !strcmp(ml.names[i], "transformer_blocks.0.attn.to_q");
        a2 |= !strcmp(ml.names[i], "transformer_blocks.0.attn2.to_out.0");
        no_add_out &= strcmp(ml.names[i], "transformer_blocks.1.attn.to_add_out") != 0;
    }
    CHECK(q && a2 && no_add_out);
    mmc_lora_config lc = {.r = 2, .alpha = 4, .targets = (const char *const[]){"to_q", "to_k", "to_v"},
                          .n_targets = 3, .seed = 1};
    mmc_lora_set *ls = NULL;
    CHECK_OK(mmc_lora_attach(&ml, &lc, &ls));
    CHECK(ls && ls->n == 2 * 3 + 3);
    mmc_lora_free(ls);
    mmc_module_list_free(&ml);
    /* SD3Transformer2DModel.from_pretrained(sd35).num_parameters(): the buffer is not counted */
    CHECK(mmc_sd3_param_count(m) == 49552);
    mmc_sd3_free(m);
}

/* The position table the checkpoint carries is diffusers' get_2d_sincos_pos_embed(C, M, base_size =
 * sample_size / patch_size): grid positions in f32 (i / (M / base_size)), frequencies 10000^(-k / (C/4))
 * and sin / cos in float64, the first half of each row from the column coordinate (meshgrid "xy"),
 * the second from the row. mmc binds the stored table (a bf16 checkpoint rounds it); this pins down
 * the layout the crop indexes. */
static void check_pos_embed(void) {
    mmc_sd3 *m = NULL;
    CHECK_OK(mmc_sd3_load("tests/fixtures/sd3/sd3", false, &m));
    if (!m) return;
    const mmc_sd3_config *c = mmc_sd3_cfg(m);
    const mmc_tensor *pe = mmc_sd3_param(m, "pos_embed.pos_embed");
    const int64_t M = c->pos_embed_max_size, C = c->num_attention_heads * c->attention_head_dim, Q = C / 4;
    const float step = (float)((double)M / (double)(c->sample_size / c->patch_size));
    double worst = 0;
    for (int64_t r = 0; r < M; r++)
        for (int64_t col = 0; col < M; col++)
            for (int64_t half = 0; half < 2; half++)
                for (int64_t k = 0; k < Q; k++) {
                    const double pos = (double)((float)(half ? r : col) / step);
                    const double a = pos * (1.0 / pow(10000.0, (double)k / (double)Q));
                    const float *row = (const float *)pe->data + (r * M + col) * C + half * 2 * Q;
                    worst = fmax(worst, fabs((double)row[k] - (float)sin(a)));
                    worst = fmax(worst, fabs((double)row[Q + k] - (float)cos(a)));
                }
    CHECK(worst <= 1e-6);
    printf("pos_embed: the checkpoint's %lldx%lld table within %.1e of the formula\n", (long long)M, (long long)M,
           worst);
    mmc_sd3_free(m);
}

static void check_errors(void) {
    mmc_sd3 *m = NULL;
    CHECK_ERR(mmc_sd3_load("tests/fixtures/sd3/nonexistent", false, &m), MMC_ERR_NOT_FOUND);
    char tmp[] = "/tmp/mmc_sd3_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    char cmd[768];
    const char *src = "tests/fixtures/sd3/sd35";
    /* a config that does not match the checkpoint: every problem is named */
    snprintf(cmd, sizeof cmd, "cp %s/diffusion_pytorch_model.safetensors %s/ && "
             "sed 's/\"num_layers\": 2/\"num_layers\": 3/' %s/config.json > %s/config.json", src, tmp, src, tmp);
    MMC_CHECK(system(cmd) == 0, "cp");
    CHECK_ERR(mmc_sd3_load(tmp, false, &m), MMC_ERR_FORMAT);
    /* block 1 is no longer the context_pre_only one, block 2 is absent: 34 problems, the first listed */
    CHECK(strstr(mmc_last_error(), "34 problems") != NULL);
    CHECK(strstr(mmc_last_error(), "transformer_blocks.1.norm1_context.linear.weight': expected shape [144, 24], "
                 "found [48, 24]") != NULL);
    CHECK(strstr(mmc_last_error(), "transformer_blocks.1.attn.to_add_out.weight") != NULL);
    /* without the dual attention layer, attn2 and the 9-chunk norm are left over / mis-shaped */
    snprintf(cmd, sizeof cmd, "tr -d '\\n ' < %s/config.json | sed 's/\"dual_attention_layers\":\\[0\\]/"
             "\"dual_attention_layers\":[]/' > %s/config.json", src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_sd3_load(tmp, false, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "transformer_blocks.0.norm1.linear.weight") != NULL);
    /* qk_norm other than rms_norm, and caption_projection_dim != inner dim, name their keys */
    snprintf(cmd, sizeof cmd, "sed 's/\"rms_norm\"/\"layer_norm_across_heads\"/' %s/config.json > %s/config.json",
             src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_sd3_load(tmp, false, &m), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "qk_norm") != NULL);
    snprintf(cmd, sizeof cmd, "sed 's/\"caption_projection_dim\": 24/\"caption_projection_dim\": 20/' "
             "%s/config.json > %s/config.json", src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_sd3_load(tmp, false, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "caption_projection_dim") != NULL);
    snprintf(cmd, sizeof cmd, "sed 's/\"pos_embed_max_size\": 6/\"pos_embed_max_size\": null/' "
             "%s/config.json > %s/config.json", src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_sd3_load(tmp, false, &m), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "pos_embed_max_size") != NULL);
    snprintf(cmd, sizeof cmd, "sed 's/\"num_attention_heads\": 2/\"num_attention_heads\": \"2\"/' "
             "%s/config.json > %s/config.json", src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_sd3_load(tmp, false, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "num_attention_heads") != NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "rm");
}

/* Flow-matching training against diffusers' train_dreambooth_(lora_)sd3.py loop (tools/ref/gen_sd3_train.py):
 * lora: 20 steps on sd35 (precondition_outputs, sigma_sqrt weighting) — the timestep draws u give the
 * fixture's sigmas / timesteps bitwise, each step's loss and pre-clip gradient norm within 1e-3
 * (relative), the final adapter within 1e-3; full: 6 steps of full fine-tuning (velocity target,
 * cosmap), losses and norms within 1e-3, three final parameters within 1e-3 (relative to their size). */
static void check_train(bool lora) {
    const char *dir = lora ? "tests/fixtures/sd3_train/lora" : "tests/fixtures/sd3_train/full";
    mmc_sd3 *m = NULL;
    CHECK_OK(mmc_sd3_load("tests/fixtures/sd3/sd35", !lora, &m));
    char p[256];
    snprintf(p, sizeof p, "%s/expected.safetensors", dir + strlen("tests/fixtures/"));
    mmc_st *exp = fixture_open(p);
    if (!m || !exp) { mmc_sd3_free(m); mmc_st_close(exp); return; }
    mmc_fm_config fc;
    mmc_json *j = NULL;
    snprintf(p, sizeof p, "%s/scheduler_config.json", dir);
    CHECK_OK(mmc_json_load(p, &j));
    CHECK_OK(mmc_fm_config_read(j, "scheduler_config.json", &fc));
    mmc_json_free(j);
    mmc_module_list ml = {0};
    mmc_lora_set *s = NULL;
    mmc_tensor **params = NULL;
    int n_params = 0;
    const char *const *names = NULL;
    if (lora) {
        CHECK_OK(mmc_sd3_linears(m, &ml));
        snprintf(p, sizeof p, "%s/initial.safetensors", dir);
        CHECK_OK(mmc_lora_load_diffusers(p, "transformer", &ml, 1.0f, true, &s));
        if (!s) { mmc_module_list_free(&ml); mmc_sd3_free(m); mmc_st_close(exp); return; }
        params = s->params, n_params = s->n_params;
    } else n_params = mmc_sd3_param_list(m, &params, &names);
    mmc_adamw opt;
    mmc_adamw_opts o = {.lr = lora ? 1e-3 : 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-4};
    CHECK_OK(mmc_adamw_init(&opt, &o, params, n_params));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_flux_fm_batch b = {.prompt_embeds = fixture_tensor(exp, "prompt_embeds", MMC_F32),
                           .pooled = fixture_tensor(exp, "pooled", MMC_F32),
                           .weighting = lora ? MMC_FM_SIGMA_SQRT : MMC_FM_COSMAP};
    double worst_loss = 0, worst_norm = 0;
    const int steps = lora ? 20 : 6;
    for (int step = 0; step < steps; step++) {
        char k[64];
        mmc_tensor *t[7];
        static const char *keys[7] = {"x0", "noise", "u", "sigmas", "timesteps", "loss", "grad_norm"};
        for (int i = 0; i < 7; i++) {
            snprintf(k, sizeof k, "%s_%d", keys[i], step);
            t[i] = fixture_tensor(exp, k, MMC_F32);
        }
        float sig[2], ts[2];
        for (int i = 0; i < 2; i++) {
            mmc_fm_train_sigma(&fc, ((float *)t[2]->data)[i], &sig[i], &ts[i]);
            CHECK(sig[i] == ((float *)t[3]->data)[i] && ts[i] == ((float *)t[4]->data)[i]);   /* bitwise */
        }
        b.latents = t[0], b.noise = t[1], b.sigmas = sig, b.timesteps = ts;
        mmc_tensor *loss = NULL;
        CHECK_OK(mmc_sd3_fm_loss(ctx, m, &b, lora, &loss));
        if (!loss) break;
        step_check(ctx, loss, params, n_params, &opt, o.lr, ((float *)t[5]->data)[0], ((float *)t[6]->data)[0], 1e-3,
                   lora ? "lora" : "full", step, &worst_loss, &worst_norm);
        for (int i = 0; i < 7; i++) mmc_tensor_free(t[i]);
    }
    double worst_w = 0;
    if (lora) {
        snprintf(p, sizeof p, "%s/final.safetensors", dir + strlen("tests/fixtures/"));
        mmc_st *fin = fixture_open(p);
        worst_w = lora_max_rel_diff(fin, "transformer.", s);
        mmc_st_close(fin);
    } else {
        snprintf(p, sizeof p, "%s/final_params.safetensors", dir + strlen("tests/fixtures/"));
        mmc_st *fin = fixture_open(p);
        static const char *pn[3] = {"transformer_blocks.0.attn.to_q.weight", "proj_out.weight",
                                    "transformer_blocks.1.ff.net.2.bias"};
        for (int i = 0; fin && i < 3; i++) {
            mmc_tensor *want = fixture_tensor(fin, pn[i], MMC_F32), *got = mmc_sd3_param(m, pn[i]);
            CHECKF(got != NULL, "no parameter %s", pn[i]);
            if (got) worst_w = fmax(worst_w, max_abs_diff(got, want) / fmax(max_abs(want), 1e-6));
            mmc_tensor_free(want);
        }
        mmc_st_close(fin);
    }
    CHECKF(worst_w < 1e-3, "%s: final weights: max relative difference %.2e", lora ? "lora" : "full", worst_w);
    printf("train_%s: %d steps, loss rel diff <= %.2e, grad norm <= %.2e, final weights <= %.2e\n", lora ? "lora" : "full",
           steps, worst_loss, worst_norm, worst_w);
    mmc_tensor_free(b.prompt_embeds);
    mmc_tensor_free(b.pooled);
    mmc_adamw_free(&opt);
    mmc_ctx_free(ctx);
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_sd3_free(m);
    mmc_st_close(exp);
}

int main(int argc, char **argv) {
    if (access("tests/fixtures/sd3/sd3/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_sd3: fixtures absent (tools/ref/gen_sd3.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "transformer")) {
        check_transformer("sd3");
        check_transformer("sd35");
        check_transformer("sd3_bf16");
    }
    if (test_part(argc, argv, "grad")) check_grad();
    if (test_part(argc, argv, "modules")) check_modules();
    if (test_part(argc, argv, "pos_embed")) check_pos_embed();
    if (test_part(argc, argv, "errors")) check_errors();
    if (test_part(argc, argv, "train")) {
        check_train(true);
        check_train(false);
    }
    return test_done("test_sd3");
}
