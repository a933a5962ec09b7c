/* test_wan.c — Wan2.1 text-to-video against diffusers 0.42 / transformers 5.23 on tiny random
 * checkpoints written by save_pretrained (tests/fixtures/wan, tools/ref/gen_wan.py):
 *  - WanTransformer3DModel: 2 heads of 12 (rope axes 4 / 4 / 4), patch (1, 2, 2), 2 blocks with the
 *    cross-attention norm, batch 2 at timesteps 999 and 250: output within 1e-4 (f32); a second model
 *    stored bf16, out_channels 8, no cross-attention norm, within 1e-4 of diffusers on the upcast weights;
 *  - the image-to-video form (CLIP image branch: image_embedder, add_k_proj / add_v_proj, 512 text tokens)
 *    within 1e-4;
 *  - malformed transformer configs (patch_size of two sizes, a missing tensor, an I2V key);
 *  - training: gradients of sum(out * W) for a dozen parameters (patch embedding, embedders, q/k norms,
 *    modulation tables, projections) within 1e-4 (+ 1e-4 relative) of torch's autograd; a diffusers LoRA
 *    (save_lora_weights, r 4, alpha 8) on the linears within 1e-4 of diffusers' output with it;
 *  - flow-matching LoRA training (train_lora): 20 steps against diffusers + PEFT (tests/fixtures/wan_train,
 *    tools/ref/gen_wan_train.py): losses and gradient norms within 1e-3, the final adapter within 1e-3;
 *    activation recompute gives the same loss and gradients bitwise; one video's training pixels (uniform
 *    frame sampling, resize + centre crop) against PyAV + PIL and its normalised latent distribution;
 *    4 steps of full fine-tuning (losses, gradient norms, five final parameters within 1e-3);
 *  - image-to-video training (train_i2v, tests/fixtures/wan_i2v_train, tools/ref/gen_wan_i2v_train.py): the
 *    same 20 LoRA steps (plus add_k_proj / add_v_proj) and 4 full steps on the I2V transformer with per-sample
 *    conditions and image states, same tolerances; one video's first frame byte-equal, its CLIP image states
 *    within 1e-5 and its condition within 1e-4 of diffusers';
 *  - first-last-frame training (train_flf2v, tests/fixtures/wan_flf2v_train, gen_wan_i2v_train.py --flf2v): the
 *    same on the FLF2V transformer (pos_embed_seq_len: both frames' image states side by side, the condition
 *    with the last frame, the image position table among the full fine-tuning's final parameters); one video's
 *    first and last frames byte-equal, their image states and condition as above;
 *  - UMT5EncoderModel (a relative attention bias in every layer) on the tokenizer's ids with the
 *    attention mask: last_hidden_state within 1e-4, ids equal;
 *  - UniPCMultistepScheduler: sigmas and timesteps of set_timesteps(n) for n in {1, 2, 3, 7, 10, 50}
 *    (Wan's flow configuration at flow_shift 3 and 5, and a VP epsilon bh1 one) equal to diffusers
 *    (timesteps exact; flow sigmas exact, VP sigmas within 2 ulp as np.interp rounds), and 5 steps on
 *    fixed model outputs within 1e-6 (+ 2e-7 relative for the VP samples, |x| up to 36);
 *  - WanPipeline: encode_prompt's zero-padded embeddings within 1e-4, and the latents of two runs
 *    from injected latents (3 steps with CFG 5 and a negative prompt, batch 2; 2 steps without
 *    guidance) within 1e-3 of output_type="latent"; the frame-count and size errors. */
#include "test_util.h"
#include "lora_check.h"
#include "step_check.h"
#include "mmc_encoders.h"
#include "mmc_lora.h"
#include "mmc_train.h"
#include "mmc_wan_t2v.h"
#include "train/trainer_internal.h"

#include <math.h>
#include <unistd.h>

#define TOL 1e-4
#define DIR_ "tests/fixtures/wan"

static void check_transformer(const char *name) {
    char dir[256], what[160];
    snprintf(dir, sizeof dir, DIR_ "/%s", name);
    mmc_wan *m = NULL;
    CHECK_OK(mmc_wan_load(dir, false, &m));
    if (!m) return;
    snprintf(dir, sizeof dir, "wan/%s/expected.safetensors", name);
    mmc_st *exp = fixture_open(dir);
    if (!exp) { mmc_wan_free(m); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *hid = fixture_tensor(exp, "hidden", MMC_F32), *enc = fixture_tensor(exp, "encoder", MMC_F32);
    mmc_tensor *t = fixture_tensor(exp, "timestep", MMC_F32), *want = fixture_tensor(exp, "out", MMC_F32);
    mmc_tensor *img = mmc_st_find(exp, "image") ? fixture_tensor(exp, "image", MMC_F32) : NULL;
    mmc_wan_inputs in = {.hidden = hid, .timestep = t->data, .encoder = enc, .image = img};
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_wan_forward(ctx, m, &in, &out));
    if (out) {
        snprintf(what, sizeof what, "%s output", name);
        CHECK(mmc_same_shape(out, want));
        CHECK_CLOSE(out, want, TOL, 0, what);
        printf("%s: output %s max|diff| %.2e (max|v| %.2f)\n", name, mmc_shape_str(out, what, sizeof what),
               max_abs_diff(out, want), max_abs(want));
    }
    /* image states exactly when the checkpoint has the image branch */
    in.image = img ? NULL : enc;
    CHECK_ERR(mmc_wan_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), img ? "encoder_hidden_states_image" : "no image branch") != NULL);
    in.image = img;
    /* wrong inputs: text width, a frame count the patch does not divide */
    in.encoder = hid;
    CHECK_ERR(mmc_wan_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "encoder_hidden_states") != NULL);
    in.encoder = enc;
    mmc_tensor *odd = mmc_tensor_new(MMC_F32, 5, MMC_SHAPE(hid->shape[0], hid->shape[1], 2, 3, 6));
    in.hidden = odd;
    CHECK_ERR(mmc_wan_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "height 3") != NULL);
    mmc_tensor_free(odd);
    mmc_tensor *ts[] = {hid, enc, t, want, img};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_wan_free(m);
}

/* Training: gradients of sum(out * W) against torch's autograd; a diffusers LoRA (WanPipeline.save_lora_weights)
 * on the transformer's linears. */
static void check_grad_lora(void) {
    mmc_st *exp = fixture_open("wan/transformer/expected.safetensors"), *gx = fixture_open("wan/transformer/grad_expected.safetensors");
    mmc_st *lx = fixture_open("wan/lora/expected.safetensors");
    if (!exp || !gx || !lx) goto done;
    mmc_tensor *hid = fixture_tensor(exp, "hidden", MMC_F32), *enc = fixture_tensor(exp, "encoder", MMC_F32);
    mmc_tensor *t = fixture_tensor(exp, "timestep", MMC_F32), *W = fixture_tensor(gx, "loss_weight", MMC_F32);
    mmc_wan_inputs in = {.hidden = hid, .timestep = t->data, .encoder = enc};
    mmc_wan *m = NULL;
    CHECK_OK(mmc_wan_load(DIR_ "/transformer", true, &m));
    mmc_ctx *ctx = mmc_ctx_new();
    if (m) {
        mmc_set_grad_enabled(ctx, true);
        mmc_tensor *out = NULL;
        CHECK_OK(mmc_wan_forward(ctx, m, &in, &out));
        if (out) {
            mmc_backward(ctx, mmc_sum(ctx, mmc_mul(ctx, out, W)));
            mmc_tensor **ps;
            const char *const *names;
            const int np = mmc_wan_param_list(m, &ps, &names);
            int compared = 0;
            double worst = 0;
            for (int i = 0; i < np; i++) {
                char key[300];
                snprintf(key, sizeof key, "grad.%s", names[i]);
                if (!mmc_st_find(gx, key)) continue;
                mmc_tensor *want = fixture_tensor(gx, key, MMC_F32);
                CHECKF(ps[i]->grad != NULL, "%s has no gradient", names[i]);
                if (ps[i]->grad) {
                    const double d = max_abs_diff(ps[i]->grad, want), lim = 1e-4 + 1e-4 * max_abs(want);
                    CHECKF(d <= lim, "grad %s: max|diff| %.3g > %.3g", names[i], d, lim);
                    if (d / (max_abs(want) + 1e-12) > worst) worst = d / (max_abs(want) + 1e-12);
                }
                compared++;
                mmc_tensor_free(want);
            }
            CHECK(compared == 12);
            printf("gradients of %d parameters: worst max|diff| / max|grad| %.2e\n", compared, worst);
        }
        mmc_wan_free(m);
        m = NULL;
    }
    mmc_ctx_free(ctx);
    /* the LoRA, on an inference copy */
    ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    CHECK_OK(mmc_wan_load(DIR_ "/transformer", false, &m));
    if (m) {
        mmc_module_list ml = {0};
        mmc_lora_set *ls = NULL;
        CHECK_OK(mmc_wan_linears(m, &ml));
        CHECK_OK(mmc_lora_load_diffusers(DIR_ "/lora", "transformer", &ml, 1.0f, false, &ls));
        mmc_tensor *want = fixture_tensor(lx, "out", MMC_F32), *base = fixture_tensor(exp, "out", MMC_F32), *out = NULL;
        CHECK_OK(mmc_wan_forward(ctx, m, &in, &out));
        if (out && ls) {
            CHECK_CLOSE(out, want, TOL, 0, "output with the LoRA");
            CHECK(max_abs_diff(want, base) > 1e-2);    /* the adapter does change the output */
            printf("LoRA (diffusers save_lora_weights): output max|diff| %.2e (changes it by %.2f)\n",
                   max_abs_diff(out, want), max_abs_diff(want, base));
        }
        mmc_lora_free(ls);
        mmc_module_list_free(&ml);
        mmc_tensor_free(want), mmc_tensor_free(base);
        mmc_wan_free(m);
    }
    mmc_ctx_free(ctx);
    mmc_tensor_free(hid), mmc_tensor_free(enc), mmc_tensor_free(t), mmc_tensor_free(W);
done:
    if (exp) mmc_st_close(exp);
    if (gx) mmc_st_close(gx);
    if (lx) mmc_st_close(lx);
}

/* A config.json with one key replaced (or added) in a copy of the transformer folder's. */
static mmc_status config_with(const char *key_json, mmc_wan_config *c) {
    char *text = NULL;
    size_t len = 0;
    MMC_CHECK(mmc_read_file(DIR_ "/transformer/config.json", &text, &len) == MMC_OK, "fixture config");
    char buf[4096];
    /* insert the override right after the opening brace: a later duplicate key is read first by cJSON,
     * so remove the original occurrence of the key by renaming it */
    char key[64];
    snprintf(key, sizeof key, "%.*s", (int)(strchr(key_json, ':') - key_json), key_json);
    char *hit = strstr(text, key);
    if (hit) hit[1] = 'x';   /* "patch_size" -> "xatch_size": unknown, ignored */
    snprintf(buf, sizeof buf, "{%s,%s", key_json, text + 1);
    free(text);
    mmc_json *j = NULL;
    mmc_status st = mmc_json_parse(buf, strlen(buf), "transformer/config.json", &j);
    if (st) return st;
    st = mmc_wan_config_read(j, "transformer/config.json", c);
    mmc_json_free(j);
    return st;
}

static void check_configs(void) {
    mmc_wan_config c;
    CHECK_OK(config_with("\"eps\": 1e-6", &c));
    CHECK(c.rope_dims[0] == 4 && c.rope_dims[1] == 4 && c.rope_dims[2] == 4);
    CHECK_OK(config_with("\"attention_head_dim\": 128", &c));
    CHECK(c.rope_dims[0] == 44 && c.rope_dims[1] == 42 && c.rope_dims[2] == 42);   /* Wan2.1's split */
    CHECK_ERR(config_with("\"patch_size\": [2, 2]", &c), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "patch_size must list 3 sizes") != NULL);
    CHECK_ERR(config_with("\"patch_size\": [1, 0, 2]", &c), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "patch_size[1]") != NULL);
    CHECK_ERR(config_with("\"patch_size\": \"1,2,2\"", &c), MMC_ERR_FORMAT);
    CHECK_ERR(config_with("\"attention_head_dim\": 13", &c), MMC_ERR_FORMAT);
    CHECK_ERR(config_with("\"num_layers\": \"two\"", &c), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "num_layers") != NULL);
    CHECK_ERR(config_with("\"image_dim\": 1280", &c), MMC_ERR_FORMAT);    /* without added_kv_proj_dim */
    CHECK(strstr(mmc_last_error(), "image-to-video") != NULL);
    CHECK_ERR(config_with("\"pos_embed_seq_len\": 514", &c), MMC_ERR_FORMAT);   /* FLF2V without image_dim */
    CHECK(strstr(mmc_last_error(), "pos_embed_seq_len 514") != NULL);
    CHECK_ERR(config_with("\"pos_embed_seq_len\": 513, \"image_dim\": 12, \"added_kv_proj_dim\": 24", &c), MMC_ERR_FORMAT);

    /* a folder whose weights lack a tensor / were saved from another config */
    char tmp[] = "/tmp/mmc_wan_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    char path[512], cmd[1200];
    snprintf(cmd, sizeof cmd, "cp " DIR_ "/transformer/diffusion_pytorch_model.safetensors %s/ && "
             "sed 's/\"num_layers\": 2/\"num_layers\": 3/' " DIR_ "/transformer/config.json > %s/config.json", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "copy fixture");
    mmc_wan *m = NULL;
    CHECK_ERR(mmc_wan_load(tmp, false, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "missing tensor 'blocks.2.attn1.to_q.weight'") != NULL);
    snprintf(cmd, sizeof cmd, "sed 's/\"num_layers\": 2/\"num_layers\": 1/' " DIR_ "/transformer/config.json > %s/config.json",
             tmp);
    MMC_CHECK(system(cmd) == 0, "config");
    CHECK_ERR(mmc_wan_load(tmp, false, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "blocks.1.") != NULL);
    /* a truncated weights file */
    snprintf(cmd, sizeof cmd, "head -c 3000 " DIR_ "/transformer/diffusion_pytorch_model.safetensors > "
             "%s/diffusion_pytorch_model.safetensors && cp " DIR_ "/transformer/config.json %s/", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "truncate");
    CHECK(mmc_wan_load(tmp, false, &m) != MMC_OK);
    CHECK(strstr(mmc_last_error(), "diffusion_pytorch_model") != NULL);
    snprintf(path, sizeof path, "rm -rf %s", tmp);
    MMC_CHECK(system(path) == 0, "cleanup");
}

/* UMT5EncoderModel and the tokenizer on prompt_clean'd prompts */
static void check_umt5(void) {
    mmc_st *exp = fixture_open("wan/pipe/expected.safetensors");
    if (!exp) return;
    mmc_t5_tokenizer *tt = NULL;
    mmc_t5_encoder *te = NULL;
    CHECK_OK(mmc_t5_tokenizer_load_pipeline(DIR_ "/pipe/tokenizer", MMC_T5_PIPELINE_TRANSFORMERS5, &tt));
    CHECK_OK(mmc_t5_encoder_load(DIR_ "/pipe/text_encoder", &te));
    if (!tt || !te) goto done;
    CHECK(mmc_t5_encoder_cfg(te)->per_layer_bias);
    static const char *const texts[4] = {"a red cat walks on the beach", "a  blue dog\truns slowly ", "green grass", ""};
    mmc_ctx *ctx = mmc_ctx_new();
    for (int i = 0; i < 4; i++) {
        char key[32], clean[256];
        mmc_wan_prompt_clean(texts[i], clean, sizeof clean);
        snprintf(key, sizeof key, "ids%d", i);
        mmc_tensor *wid = fixture_tensor(exp, key, MMC_I32);
        const int L = (int)wid->shape[0];
        mmc_tensor *ids = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(1, L)), *mask = mmc_tensor_new(MMC_I32, 2, MMC_SHAPE(1, L));
        CHECK_OK(mmc_t5_tokenizer_encode_padded(tt, clean, L, ids->data, mask->data, NULL));
        CHECKF(!memcmp(ids->data, wid->data, (size_t)L * 4), "ids of prompt %d", i);
        snprintf(key, sizeof key, "umt5_hidden%d", i);
        mmc_tensor *want = fixture_tensor(exp, key, MMC_F32), *h = NULL;
        CHECK_OK(mmc_t5_encoder_forward(ctx, te, ids, mask, &h, NULL));
        if (h) {
            CHECK_CLOSE(h, want, TOL, 0, key);
            printf("UMT5 prompt %d: last_hidden_state max|diff| %.2e\n", i, max_abs_diff(h, want));
        }
        mmc_tensor_free(wid), mmc_tensor_free(ids), mmc_tensor_free(mask), mmc_tensor_free(want);
    }
    mmc_ctx_free(ctx);
done:
    mmc_t5_encoder_free(te);
    mmc_t5_tokenizer_free(tt);
    mmc_st_close(exp);
}

/* UniPCMultistepScheduler: schedules equal to diffusers', steps within 1e-6 */
static void check_unipc(void) {
    mmc_st *exp = fixture_open("wan/scheduler_expected.safetensors");
    if (!exp) return;
    static const char *const cases[3] = {"flow3", "flow5", "vp"};
    static const int ns[6] = {1, 2, 3, 7, 10, 50};
    for (int c = 0; c < 3; c++) {
        char dir[128], key[64];
        snprintf(dir, sizeof dir, DIR_ "/sched_%s", cases[c]);
        mmc_nsched s;
        CHECK_OK(mmc_nsched_load(dir, &s));
        if (s.cfg.kind != MMC_NSCHED_UNIPC) continue;
        double worst_sig = 0;
        for (int k = 0; k < 6; k++) {
            CHECK_OK(mmc_nsched_set_timesteps(&s, ns[k]));
            snprintf(key, sizeof key, "%s_sigmas_%d", cases[c], ns[k]);
            mmc_tensor *ws = fixture_tensor(exp, key, MMC_F32);
            snprintf(key, sizeof key, "%s_timesteps_%d", cases[c], ns[k]);
            mmc_tensor *wt = fixture_tensor(exp, key, MMC_F32);
            CHECKF(s.n == wt->shape[0] && ws->shape[0] == s.n + 1, "%s n=%d: %d timesteps", cases[c], ns[k], s.n);
            for (int i = 0; i < s.n && i < wt->shape[0]; i++)
                CHECKF(s.timesteps[i] == ((float *)wt->data)[i], "%s n=%d timestep %d: %g vs %g", cases[c], ns[k], i,
                       s.timesteps[i], ((float *)wt->data)[i]);
            for (int i = 0; i <= s.n && i < ws->shape[0]; i++) {
                double d = fabs((double)s.sigmas[i] - ((float *)ws->data)[i]);
                if (d > worst_sig) worst_sig = d;
                CHECKF(d <= 2.5e-7 * fabs(((float *)ws->data)[i]), "%s n=%d sigma %d: %.9g vs %.9g", cases[c], ns[k], i,
                       s.sigmas[i], ((float *)ws->data)[i]);
            }
            mmc_tensor_free(ws), mmc_tensor_free(wt);
        }
        /* 5 steps on fixed model outputs */
        CHECK_OK(mmc_nsched_set_timesteps(&s, 5));
        snprintf(key, sizeof key, "%s_x0", cases[c]);
        mmc_tensor *x = fixture_tensor(exp, key, MMC_F32);
        double worst = 0;
        for (int i = 0; i < 5; i++) {
            snprintf(key, sizeof key, "%s_mo_%d", cases[c], i);
            mmc_tensor *mo = fixture_tensor(exp, key, MMC_F32);
            snprintf(key, sizeof key, "%s_x_%d", cases[c], i);
            mmc_tensor *want = fixture_tensor(exp, key, MMC_F32);
            CHECK_OK(mmc_nsched_step(&s, i, mo->data, x->data, mmc_numel(x), NULL));
            double d = max_abs_diff(x, want);
            if (d > worst) worst = d;
            CHECK_CLOSE(x, want, 1e-6, 2e-7, key);   /* 1e-6, or a few ulp of the VP samples (|x| ~ 30) */
            memcpy(x->data, want->data, mmc_nbytes(x));   /* each step from diffusers' sample */
            mmc_tensor_free(mo), mmc_tensor_free(want);
        }
        printf("UniPC %s: schedules equal (sigma max|diff| %.1e), 5 steps max|diff| %.2e\n", cases[c], worst_sig, worst);
        mmc_tensor_free(x);
        mmc_nsched_free(&s);
    }
    mmc_st_close(exp);
    /* configurations mmc refuses by name */
    static const struct { const char *json, *needle; mmc_status code; } bad[] = {
        {"{\"_class_name\": \"UniPCMultistepScheduler\", \"solver_order\": 3}", "solver_order 3", MMC_ERR_UNSUPPORTED},
        {"{\"_class_name\": \"UniPCMultistepScheduler\", \"disable_corrector\": [0]}", "disable_corrector",
         MMC_ERR_UNSUPPORTED},
        {"{\"_class_name\": \"UniPCMultistepScheduler\", \"prediction_type\": \"flow_prediction\"}", "use_flow_sigmas",
         MMC_ERR_UNSUPPORTED},
        {"{\"_class_name\": \"UniPCMultistepScheduler\", \"solver_type\": \"bh3\"}", "solver_type", MMC_ERR_INVALID},
        {"{\"_class_name\": \"UniPCMultistepScheduler\", \"use_flow_sigmas\": true, \"flow_shift\": -1}", "flow_shift",
         MMC_ERR_INVALID},
        {"{\"_class_name\": \"UniPCMultistepScheduler\", \"use_karras_sigmas\": true}", "use_karras_sigmas",
         MMC_ERR_UNSUPPORTED},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mmc_json *j = NULL;
        mmc_nsched_config cfg;
        CHECK_OK(mmc_json_parse(bad[k].json, strlen(bad[k].json), "scheduler_config.json", &j));
        CHECK_ERR(mmc_nsched_config_read(j, "scheduler_config.json", &cfg), bad[k].code);
        CHECKF(strstr(mmc_last_error(), bad[k].needle) != NULL, "error '%s' names %s", mmc_last_error(), bad[k].needle);
        mmc_json_free(j);
    }
}

/* WanPipeline: encode_prompt, then the denoising loop from injected latents */
static void check_pipeline(void) {
    mmc_wan_pipeline *p = NULL;
    CHECK_OK(mmc_wan_pipeline_open(DIR_ "/pipe", &p));
    mmc_st *exp = fixture_open("wan/pipe/expected.safetensors");
    if (!p || !exp) { mmc_wan_pipeline_free(p); if (exp) mmc_st_close(exp); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    static const char *const prompts[2] = {"a red cat walks on the beach", "a  blue dog\truns slowly "};
    static const char *const negs[2] = {"green grass", "green grass"};
    mmc_tensor *pe = NULL, *ne = NULL, *pe0 = NULL;
    CHECK_OK(mmc_wan_encode_prompt(ctx, p, prompts, 2, 12, &pe));
    CHECK_OK(mmc_wan_encode_prompt(ctx, p, negs, 2, 12, &ne));
    CHECK_OK(mmc_wan_encode_prompt(ctx, p, prompts, 1, 12, &pe0));
    mmc_tensor *want = fixture_tensor(exp, "prompt_embeds", MMC_F32), *wneg = fixture_tensor(exp, "negative_prompt_embeds", MMC_F32);
    if (pe && ne) {
        CHECK(mmc_same_shape(pe, want));
        CHECK_CLOSE(pe, want, TOL, 0, "prompt_embeds");
        CHECK_CLOSE(ne, wneg, TOL, 0, "negative_prompt_embeds");
        printf("encode_prompt: prompt_embeds max|diff| %.2e, negative %.2e\n", max_abs_diff(pe, want), max_abs_diff(ne, wneg));
        /* the rows past the prompt's tokens are zero, as diffusers pads them */
        CHECK(((float *)pe->data)[11 * pe->shape[2]] == 0.0f);
    }
    mmc_tensor_free(want), mmc_tensor_free(wneg);
    /* (a) CFG 5 with a negative prompt, 3 steps, batch 2 */
    mmc_wan_sample_opts o = {.height = 32, .width = 48, .frames = 9, .steps = 3, .guidance = 5.0};
    mmc_tensor *lat = fixture_tensor(exp, "latents_a", MMC_F32);
    want = fixture_tensor(exp, "out_a", MMC_F32);
    if (pe && ne) {
        CHECK_OK(mmc_wan_sample(ctx, p, pe, ne, lat, &o));
        CHECK_CLOSE(lat, want, 1e-3, 0, "pipeline a latents");
        printf("pipeline a (CFG 5, 3 steps, batch 2): latents max|diff| %.2e (max|v| %.2f)\n", max_abs_diff(lat, want),
               max_abs(want));
    }
    /* (a) decoded as output_type="pt" */
    mmc_tensor *vid = NULL, *wvid = fixture_tensor(exp, "video_a", MMC_F32);
    if (pe && ne) {
        CHECK_OK(mmc_wan_decode(p, lat, NULL, NULL, &vid));
        if (vid) {
            CHECK(mmc_same_shape(vid, wvid));
            CHECK_CLOSE(vid, wvid, 1e-3, 0, "pipeline a video");
            printf("pipeline a decoded: video %s max|diff| %.2e\n", mmc_shape_str(vid, (char[64]){0}, 64),
                   max_abs_diff(vid, wvid));
        }
    }
    mmc_tensor_free(vid), mmc_tensor_free(wvid);
    mmc_tensor_free(lat), mmc_tensor_free(want);
    /* (b) no guidance, 2 steps (the transformer reloads after the decode freed it) */
    lat = fixture_tensor(exp, "latents_b", MMC_F32);
    want = fixture_tensor(exp, "out_b", MMC_F32);
    o.steps = 2, o.guidance = 1.0;
    if (pe0) {
        CHECK_OK(mmc_wan_sample(ctx, p, pe0, NULL, lat, &o));
        CHECK_CLOSE(lat, want, 1e-3, 0, "pipeline b latents");
        printf("pipeline b (no guidance, 2 steps): latents max|diff| %.2e\n", max_abs_diff(lat, want));
    }
    /* errors: guidance without a negative encoding, frame counts, sizes */
    o.guidance = 3.0;
    CHECK_ERR(mmc_wan_sample(ctx, p, pe0, NULL, lat, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "negative") != NULL);
    CHECK_ERR(mmc_wan_pipeline_check_frames(p, 10), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "4k + 1") && strstr(mmc_last_error(), "nearest valid count is 9"));
    CHECK_ERR(mmc_wan_pipeline_check_frames(p, 12), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "nearest valid count is 13") != NULL);
    CHECK_ERR(mmc_wan_pipeline_check_frames(p, 0), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "nearest valid count is 1") != NULL);
    CHECK_OK(mmc_wan_pipeline_check_frames(p, 81));
    o.frames = 8;
    CHECK_ERR(mmc_wan_sample(ctx, p, pe0, pe0, lat, &o), MMC_ERR_INVALID);
    o.frames = 9, o.height = 40;
    CHECK_ERR(mmc_wan_sample(ctx, p, pe0, pe0, lat, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "nearest valid size is 48x48") != NULL);
    o.height = 32, o.frames = 13;    /* latents of another clip length */
    CHECK_ERR(mmc_wan_sample(ctx, p, pe0, pe0, lat, &o), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "latents must be") != NULL);
    mmc_tensor_free(lat), mmc_tensor_free(want);
    mmc_tensor_free(pe), mmc_tensor_free(ne), mmc_tensor_free(pe0);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_wan_pipeline_free(p);
    /* malformed folders: a VAE config with a zero scale factor, an I2V pipeline class, a text encoder of
     * the wrong width */
    char tmp[] = "/tmp/mmc_wan_pipe_XXXXXX", cmd[1200];
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    snprintf(cmd, sizeof cmd, "cp -r " DIR_ "/pipe/. %s/ && sed -i 's/\"scale_factor_temporal\": 4/\"scale_factor_temporal\": 0/' "
             "%s/vae/config.json", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "copy");
    mmc_wan_pipeline *q = NULL;
    CHECK_ERR(mmc_wan_pipeline_open(tmp, &q), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "scale_factor_temporal") != NULL);
    snprintf(cmd, sizeof cmd, "cp " DIR_ "/pipe/vae/config.json %s/vae/ && sed -i 's/\"WanPipeline\"/\"WanImageToVideoPipeline\"/' "
             "%s/model_index.json", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "edit");
    CHECK_ERR(mmc_wan_pipeline_open(tmp, &q), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "WanImageToVideoPipeline") != NULL);
    snprintf(cmd, sizeof cmd, "cp " DIR_ "/pipe/model_index.json %s/ && sed -i 's/\"text_dim\": 16/\"text_dim\": 20/' "
             "%s/transformer/config.json", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "edit");
    CHECK_OK(mmc_wan_pipeline_open(tmp, &q));
    if (q) {
        mmc_ctx *c2 = mmc_ctx_new();
        mmc_tensor *e = NULL;
        CHECK_ERR(mmc_wan_encode_prompt(c2, q, prompts, 1, 12, &e), MMC_ERR_FORMAT);
        CHECK(strstr(mmc_last_error(), "text_dim is 20") != NULL);
        mmc_ctx_free(c2);
        mmc_wan_pipeline_free(q);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "cleanup");
    /* prompt_clean */
    char buf[128];
    mmc_wan_prompt_clean("  a &amp;amp; b&#33;\t\n c&lt;d  ", buf, sizeof buf);
    CHECKF(!strcmp(buf, "a & b! c<d"), "prompt_clean gave '%s'", buf);
}

/* Flow-matching LoRA training against diffusers + PEFT (20 steps, r 4, velocity target, shift 3, clip 1.0,
 * AdamW 1e-3): the uniform draws u give the fixture's sigmas / timesteps bitwise, each step's loss and pre-clip
 * gradient norm within 1e-3 (relative), the final adapter within 1e-3 of its largest entry.
 *   text to video  (tools/ref/gen_wan_train.py, wan_train): r 4 on attn1 / attn2 to_q / to_k / to_v / to_out.0
 *                  and ffn.net.0.proj / ffn.net.2 of tests/fixtures/wan/transformer;
 *   image to video (tools/ref/gen_wan_i2v_train.py, wan_i2v_train): the I2V transformer of the wan_i2v pipe, the
 *                  same modules plus attn2's add_k_proj / add_v_proj; the transformer sees cat([x_t, condition])
 *                  and the CLIP image states (text padded to 512 states as diffusers' I2V attention needs). */
static void check_train_lora(const char *tr_dir, const char *fix, int n_adapters) {
    char dir[128], key[160];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", fix);
    mmc_wan *m = NULL;
    CHECK_OK(mmc_wan_load(tr_dir, false, &m));
    snprintf(key, sizeof key, "%s/expected.safetensors", fix);
    mmc_st *exp = fixture_open(key);
    if (!m || !exp) { mmc_wan_free(m); mmc_st_close(exp); return; }
    const bool i2v = mmc_st_find(exp, "condition") != NULL;
    mmc_tensor *cond = i2v ? fixture_tensor(exp, "condition", MMC_F32) : NULL;
    mmc_tensor *img = i2v ? fixture_tensor(exp, "image_embeds", MMC_F32) : NULL;
    mmc_fm_config fc;
    mmc_json *j = NULL;
    char p[256];
    snprintf(p, sizeof p, "%s/scheduler_config.json", dir);
    CHECK_OK(mmc_json_load(p, &j));
    CHECK_OK(mmc_fm_config_read(j, "scheduler_config.json", &fc));
    mmc_json_free(j);
    mmc_module_list ml = {0};
    mmc_lora_set *s = NULL;
    CHECK_OK(mmc_wan_linears(m, &ml));
    snprintf(p, sizeof p, "%s/initial.safetensors", dir);
    CHECK_OK(mmc_lora_load_diffusers(p, "transformer", &ml, 1.0f, true, &s));
    if (!s) { mmc_module_list_free(&ml); mmc_wan_free(m); mmc_st_close(exp); return; }
    CHECKF(s->n == n_adapters, "adapters: %d, want %d", s->n, n_adapters);
    mmc_tensor **params = s->params;
    const int n_params = s->n_params;
    mmc_adamw opt;
    mmc_adamw_opts o = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-4};
    CHECK_OK(mmc_adamw_init(&opt, &o, params, n_params));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_flux_fm_batch b = {.prompt_embeds = fixture_tensor(exp, "prompt_embeds", MMC_F32), .weighting = MMC_FM_NONE};
    double worst_loss = 0, worst_norm = 0;
    const int steps = 20;
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
            CHECKF(sig[i] == ((float *)t[3]->data)[i] && ts[i] == ((float *)t[4]->data)[i],
                   "step %d sample %d: sigma %.9g timestep %.9g vs %.9g %.9g", step, i, sig[i], ts[i],
                   ((float *)t[3]->data)[i], ((float *)t[4]->data)[i]);   /* bitwise */
        }
        b.latents = t[0], b.noise = t[1], b.sigmas = sig, b.timesteps = ts;
        mmc_tensor *loss = NULL;
        CHECK_OK(mmc_wan_i2v_fm_loss(ctx, m, &b, cond, img, &loss));
        if (!loss) break;
        step_check(ctx, loss, params, n_params, &opt, o.lr, ((float *)t[5]->data)[0], ((float *)t[6]->data)[0], 1e-3,
                   "lora", step, &worst_loss, &worst_norm);
        for (int i = 0; i < 7; i++) mmc_tensor_free(t[i]);
    }
    double worst_w = 0;
    snprintf(key, sizeof key, "%s/final.safetensors", fix);
    mmc_st *fin = fixture_open(key);
    worst_w = lora_max_rel_diff(fin, "transformer.", s);
    mmc_st_close(fin);
    CHECKF(worst_w < 1e-3, "final adapter: max relative difference %.2e", worst_w);
    printf("%s lora: %d steps, loss rel diff <= %.2e, grad norm <= %.2e, final adapter <= %.2e\n", fix, steps,
           worst_loss, worst_norm, worst_w);
    /* activation recompute (model.recompute: full) gives the same loss and gradients (bitwise: the
     * blocks are re-run with the same inputs in the same order) */
    {
        mmc_tensor *t[3];
        static const char *keys[3] = {"x0_0", "noise_0", "u_0"};
        for (int i = 0; i < 3; i++) t[i] = fixture_tensor(exp, keys[i], MMC_F32);
        float sig[2], ts[2];
        for (int i = 0; i < 2; i++) mmc_fm_train_sigma(&fc, ((float *)t[2]->data)[i], &sig[i], &ts[i]);
        b.latents = t[0], b.noise = t[1], b.sigmas = sig, b.timesteps = ts;
        float lv[2];
        float **g = calloc((size_t)n_params, sizeof *g);
        for (int pass = 0; pass < 2 && g; pass++) {
            mmc_wan_set_recompute(m, pass == 1);
            mmc_tensor *loss = NULL;
            CHECK_OK(mmc_wan_i2v_fm_loss(ctx, m, &b, cond, img, &loss));
            if (!loss) break;
            lv[pass] = *(float *)loss->data;
            mmc_backward(ctx, loss);
            mmc_ctx_reset(ctx);
            int diff = 0, cmp = 0;
            for (int i = 0; i < n_params; i++) {
                const mmc_tensor *gr = params[i]->grad;
                if (!gr) continue;
                if (pass == 0) {
                    g[i] = malloc(mmc_nbytes(gr));
                    if (g[i]) memcpy(g[i], gr->data, mmc_nbytes(gr));
                } else if (g[i]) cmp++, diff += memcmp(g[i], gr->data, mmc_nbytes(gr)) != 0;
            }
            if (pass == 1) CHECKF(cmp == n_params && diff == 0 && lv[0] == lv[1], "recompute: loss %.9g vs %.9g, "
                                  "%d of %d gradients compared, %d differ", lv[1], lv[0], cmp, n_params, diff);
            mmc_zero_grad(params, n_params);
        }
        mmc_wan_set_recompute(m, false);
        for (int i = 0; g && i < n_params; i++) free(g[i]);
        free(g);
        for (int i = 0; i < 3; i++) mmc_tensor_free(t[i]);
    }
    mmc_tensor_free(b.prompt_embeds);
    mmc_tensor_free(cond), mmc_tensor_free(img);
    mmc_adamw_free(&opt);
    mmc_ctx_free(ctx);
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_wan_free(m);
    mmc_st_close(exp);
}

/* The training data of one video as `mmc train` prepares it (trainer_wan.c) against PyAV + PIL + diffusers
 * (tools/ref/gen_wan_train.py, data_expected.safetensors): 5 frames of tests/fixtures/video/moving.mp4 sampled
 * uniformly, resized and centre-cropped to 16x16, in [-1, 1]: within 1e-6 (the same bytes); the AutoencoderKLWan
 * latent distribution normalised by latents_mean / latents_std: mean and std within 1e-4. Also: too few frames
 * and a missing file are errors naming the file. */
static void check_train_data(void) {
    mmc_st *exp = fixture_open("wan_train/data_expected.safetensors");
    if (!exp) return;
    const int F = 5, R = 16;
    mmc_tensor *px = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(3, F, R, R));
    CHECK_OK(mmc_trainer_wan_load_video("tests/fixtures/video/moving.mp4", F, R, px->data, NULL, NULL));
    mmc_tensor *want = fixture_tensor(exp, "pixels", MMC_F32);
    const double dp = max_abs_diff(px, want);
    CHECKF(dp < 1e-6, "pixels: max difference %.3g", dp);
    mmc_tensor_free(want);
    mmc_wan_vae *vae = NULL;
    CHECK_OK(mmc_wan_vae_load(DIR_ "/pipe/vae", &vae));
    double dm = 1, ds = 1;
    if (vae) {
        mmc_tensor *wm = fixture_tensor(exp, "mean", MMC_F32), *ws = fixture_tensor(exp, "std", MMC_F32);
        mmc_tensor *m = mmc_tensor_new(MMC_F32, wm->ndim, wm->shape), *sd = mmc_tensor_new(MMC_F32, wm->ndim, wm->shape);
        float *lv = malloc(mmc_nbytes(m));
        CHECK_OK(mmc_trainer_wan_encode_clip(vae, px->data, F, R, m->data, sd->data, lv));
        dm = max_abs_diff(m, wm), ds = max_abs_diff(sd, ws);
        CHECKF(dm < 1e-4 && ds < 1e-4, "latent distribution: mean %.3g, std %.3g", dm, ds);
        free(lv);
        mmc_tensor_free(m), mmc_tensor_free(sd), mmc_tensor_free(wm), mmc_tensor_free(ws);
        mmc_wan_vae_free(vae);
    }
    printf("train_data: pixels %.2e, latent mean %.2e, std %.2e\n", dp, dm, ds);
    float *big = malloc((size_t)3 * 33 * R * R * sizeof *big);
    CHECK_ERR(mmc_trainer_wan_load_video("tests/fixtures/video/moving.mp4", 33, R, big, NULL, NULL), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "moving.mp4") && strstr(mmc_last_error(), "data.num_frames"));
    CHECK(mmc_trainer_wan_load_video("tests/fixtures/video/absent.mp4", F, R, big, NULL, NULL) != MMC_OK);
    CHECK(strstr(mmc_last_error(), "absent.mp4") != NULL);
    free(big);
    mmc_tensor_free(px);
    mmc_st_close(exp);
}

/* Image-to-video training data (trainer_wan.c) against diffusers (gen_wan_i2v_train.py, data_expected): the
 * first training frame of tests/fixtures/video/moving.mp4 (5 frames, 16x16 crop) byte-equal; encode_image of it
 * (CLIP hidden_states[-2]) within 1e-5 and prepare_latents' condition for 5 frames of 16x16 within 1e-4.
 * First-last-frame (flf2v, gen_wan_i2v_train.py --flf2v): the last sampled frame byte-equal too, encode_image
 * of [first, last] side by side ([1, 34, 12]) and the condition with last_image, same tolerances. */
static void check_train_i2v_data(const char *fix, const char *pipe, bool flf2v) {
    char key[160];
    snprintf(key, sizeof key, "%s/data_expected.safetensors", fix);
    mmc_st *exp = fixture_open(key);
    mmc_wan_pipeline *p = NULL;
    CHECK_OK(mmc_wan_pipeline_open(pipe, &p));
    if (!exp || !p) { mmc_st_close(exp); mmc_wan_pipeline_free(p); return; }
    const int F = 5, R = 16;
    float *px = malloc((size_t)3 * F * R * R * sizeof *px);
    mmc_image fr[2] = {0};
    CHECK_OK(mmc_trainer_wan_load_video("tests/fixtures/video/moving.mp4", F, R, px, &fr[0], flf2v ? &fr[1] : NULL));
    for (int k = 0; k < (flf2v ? 2 : 1); k++) {
        mmc_tensor *wf = fixture_tensor(exp, k ? "last_frame" : "frame", MMC_F32);
        int bad = fr[k].data && wf ? 0 : 1;
        for (int64_t i = 0; !bad && i < (int64_t)R * R * 3; i++) bad += fr[k].data[i] != (uint8_t)((float *)wf->data)[i];
        CHECKF(bad == 0, "%s frame: %d bytes differ", k ? "last" : "first", bad);
        mmc_tensor_free(wf);
    }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *ie = NULL, *cond = NULL, *wi = fixture_tensor(exp, "image_embeds", MMC_F32),
               *wc = fixture_tensor(exp, "condition", MMC_F32);
    double di = 1, dc = 1;
    CHECK_OK(mmc_wan_encode_images(ctx, p, fr, flf2v ? 2 : 1, &ie));
    if (ie && flf2v) ie->shape[1] *= 2, ie->shape[0] = 1, mmc_set_contiguous_strides(ie);   /* [2, S, D] -> [1, 2S, D] */
    if (ie && mmc_same_shape(ie, wi)) di = max_abs_diff(ie, wi);
    CHECKF(di < 1e-5, "image states: max difference %.3g", di);
    CHECK_OK(mmc_wan_i2v_condition(p, &fr[0], flf2v ? &fr[1] : NULL, F, R, R, &cond));
    if (cond && mmc_same_shape(cond, wc)) dc = max_abs_diff(cond, wc);
    CHECKF(dc < 1e-4, "condition: max difference %.3g", dc);
    printf("%s data: %s byte-equal, image states %.2e, condition %.2e\n", fix, flf2v ? "first and last frames" :
           "first frame", di, dc);
    mmc_tensor_free(ie), mmc_tensor_free(cond), mmc_tensor_free(wi), mmc_tensor_free(wc);
    mmc_image_free(&fr[0]), mmc_image_free(&fr[1]);
    free(px);
    mmc_ctx_free(ctx);
    mmc_wan_pipeline_free(p);
    mmc_st_close(exp);
}

/* Full fine-tuning (every parameter trainable, AdamW 1e-4, clip 1.0) against diffusers + torch
 * (full_expected.safetensors of gen_wan_train.py / gen_wan_i2v_train.py): 4 steps, each loss and pre-clip
 * gradient norm within 1e-3 (relative), the five final parameters the fixture holds within 1e-3 of their
 * largest entry and within 1% of how far training moved them. */
static void check_train_full(const char *tr_dir, const char *fix) {
    char key[160];
    mmc_wan *m = NULL;
    CHECK_OK(mmc_wan_load(tr_dir, true, &m));
    snprintf(key, sizeof key, "%s/full_expected.safetensors", fix);
    mmc_st *exp = fixture_open(key);
    if (!m || !exp) { mmc_wan_free(m); mmc_st_close(exp); return; }
    const bool i2v = mmc_st_find(exp, "condition") != NULL;
    mmc_tensor *cond = i2v ? fixture_tensor(exp, "condition", MMC_F32) : NULL;
    mmc_tensor *img = i2v ? fixture_tensor(exp, "image_embeds", MMC_F32) : NULL;
    mmc_fm_config fc;
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_load("tests/fixtures/wan_train/scheduler_config.json", &j));
    CHECK_OK(mmc_fm_config_read(j, "scheduler_config.json", &fc));
    mmc_json_free(j);
    mmc_tensor **params = NULL;
    const char *const *names = NULL;
    const int n_params = mmc_wan_param_list(m, &params, &names);
    mmc_adamw opt;
    mmc_adamw_opts o = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-4};
    CHECK_OK(mmc_adamw_init(&opt, &o, params, n_params));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_flux_fm_batch b = {.prompt_embeds = fixture_tensor(exp, "prompt_embeds", MMC_F32), .weighting = MMC_FM_NONE};
    double worst_loss = 0, worst_norm = 0, worst_w = 0;
    mmc_tensor *before[n_params];   /* the checked parameters before training (they must move) */
    for (int q = 0; q < n_params; q++) {
        char k[320];
        snprintf(k, sizeof k, "final.%s", names[q]);
        before[q] = mmc_st_find(exp, k) ? mmc_tensor_new(MMC_F32, params[q]->ndim, params[q]->shape) : NULL;
        if (before[q]) memcpy(before[q]->data, params[q]->data, mmc_nbytes(before[q]));
    }
    for (int step = 0; step < 4; step++) {
        char k[64];
        mmc_tensor *t[5];
        static const char *keys[5] = {"x0", "noise", "u", "loss", "grad_norm"};
        for (int i = 0; i < 5; i++) {
            snprintf(k, sizeof k, "%s_%d", keys[i], step);
            t[i] = fixture_tensor(exp, k, MMC_F32);
        }
        float sig[2], ts[2];
        for (int i = 0; i < 2; i++) mmc_fm_train_sigma(&fc, ((float *)t[2]->data)[i], &sig[i], &ts[i]);
        b.latents = t[0], b.noise = t[1], b.sigmas = sig, b.timesteps = ts;
        mmc_tensor *loss = NULL;
        CHECK_OK(mmc_wan_i2v_fm_loss(ctx, m, &b, cond, img, &loss));
        if (!loss) break;
        step_check(ctx, loss, params, n_params, &opt, o.lr, ((float *)t[3]->data)[0], ((float *)t[4]->data)[0], 1e-3,
                   "full", step, &worst_loss, &worst_norm);
        for (int i = 0; i < 5; i++) mmc_tensor_free(t[i]);
    }
    int n_final = 0;
    for (int e = 0; e < mmc_st_count(exp); e++) {   /* every "final.<parameter>" of the fixture */
        const char *nm = mmc_st_at(exp, e)->name;
        if (strncmp(nm, "final.", 6) != 0) continue;
        mmc_tensor *want = fixture_tensor(exp, nm, MMC_F32), *got = NULL, *b0 = NULL;
        for (int q = 0; q < n_params; q++)
            if (!strcmp(names[q], nm + 6)) got = params[q], b0 = before[q];
        CHECKF(got != NULL, "no parameter %s", nm + 6);
        if (got && want) {
            const double d = max_abs_diff(got, want), moved = b0 ? max_abs_diff(b0, want) : 0;
            worst_w = fmax(worst_w, d / fmax(max_abs(want), 1e-6)), n_final++;
            CHECKF(d <= 0.01 * moved, "full: %s moved %.3g in training, mmc differs from torch by %.3g", nm + 6, moved, d);
        }
        mmc_tensor_free(want);
    }
    CHECKF(n_final == 5, "%d final parameters compared, want 5", n_final);
    for (int q = 0; q < n_params; q++) mmc_tensor_free(before[q]);
    CHECKF(worst_w < 1e-3, "full: final parameters: max relative difference %.2e", worst_w);
    printf("%s full: 4 steps, loss rel diff <= %.2e, grad norm <= %.2e, final parameters <= %.2e\n", fix, worst_loss,
           worst_norm, worst_w);
    mmc_tensor_free(b.prompt_embeds);
    mmc_tensor_free(cond), mmc_tensor_free(img);
    mmc_adamw_free(&opt);
    mmc_ctx_free(ctx);
    mmc_wan_free(m);
    mmc_st_close(exp);
}

int main(int argc, char **argv) {
    if (access(DIR_ "/transformer/config.json", R_OK) != 0) {
        fprintf(stderr, "test_wan: fixtures absent (tools/ref/gen_wan.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "transformer")) {
        check_transformer("transformer");
        check_transformer("transformer_b");
        check_transformer("transformer_i2v");
        check_configs();
    }
    if (test_part(argc, argv, "train")) check_grad_lora();
    if (test_part(argc, argv, "train_lora")) {
        check_train_lora(DIR_ "/transformer", "wan_train", 2 * 10);
        check_train_data();
        check_train_full(DIR_ "/transformer", "wan_train");
    }
    if (test_part(argc, argv, "train_i2v")) {
        check_train_lora("tests/fixtures/wan_i2v/pipe/transformer", "wan_i2v_train", 2 * 12);
        check_train_i2v_data("wan_i2v_train", "tests/fixtures/wan_i2v/pipe", false);
        check_train_full("tests/fixtures/wan_i2v/pipe/transformer", "wan_i2v_train");
    }
    if (test_part(argc, argv, "train_flf2v")) {   /* first-last-frame: the I2V checks on the FLF2V transformer */
        check_train_lora("tests/fixtures/wan_flf2v/pipe/transformer", "wan_flf2v_train", 2 * 12);
        check_train_i2v_data("wan_flf2v_train", "tests/fixtures/wan_flf2v/pipe", true);
        check_train_full("tests/fixtures/wan_flf2v/pipe/transformer", "wan_flf2v_train");
    }
    if (test_part(argc, argv, "umt5")) check_umt5();
    if (test_part(argc, argv, "unipc")) check_unipc();
    if (test_part(argc, argv, "pipeline")) check_pipeline();
    return test_done("test_wan");
}
