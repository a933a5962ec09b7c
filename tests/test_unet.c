/* test_unet.c — UNet2DConditionModel against diffusers 0.42 on tiny random checkpoints written by
 * save_pretrained (tests/fixtures/unet, tools/ref/gen_unet.py): an SDXL-shaped one (DownBlock2D +
 * two CrossAttnDownBlock2D, 2 resnets per level, 1/1/2 transformer layers, linear projections,
 * "text_time" micro-conditioning) and an SD 1.5-shaped one (conv projections, no addition embedding,
 * flip_sin_to_cos false, freq_shift 1, mid_block_scale_factor 0.5), each on a non-square 8x12 latent
 * with two different timesteps: the noise prediction within 1e-4 of diffusers; the SDXL one also stored
 * in f16 (SDXL's fp16 variant) and bf16, against diffusers' f32 forward of those weights. Also the errors of bad
 * inputs and configs. */
#include "test_util.h"
#include "mmc_diffusion.h"

#define TOL 1e-4

static void check_case(const char *name) {
    char dir[256], rel[256], what[128];
    snprintf(dir, sizeof dir, "tests/fixtures/unet/%s", name);
    snprintf(rel, sizeof rel, "unet/%s/expected.safetensors", name);
    mmc_unet *m = NULL;
    CHECK_OK(mmc_unet_load(dir, false, &m));
    if (!m) return;
    mmc_st *exp = fixture_open(rel);
    if (!exp) { mmc_unet_free(m); return; }
    mmc_tensor *x = fixture_tensor(exp, "sample", MMC_F32), *t = fixture_tensor(exp, "timestep", MMC_F32);
    mmc_tensor *enc = fixture_tensor(exp, "encoder_hidden_states", MMC_F32), *want = fixture_tensor(exp, "out", MMC_F32);
    mmc_tensor *te = NULL, *ids = NULL;
    mmc_unet_inputs in = {.sample = x, .timestep = t->data, .encoder = enc};
    if (mmc_unet_cfg(m)->text_time) {
        te = fixture_tensor(exp, "text_embeds", MMC_F32), ids = fixture_tensor(exp, "time_ids", MMC_F32);
        in.text_embeds = te, in.time_ids = ids->data, in.n_time_ids = (int)ids->shape[1];
    }
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_unet_forward(ctx, m, &in, &out));
    if (out) {
        CHECK(mmc_same_shape(out, want));
        snprintf(what, sizeof what, "%s noise prediction", name);
        CHECK_CLOSE(out, want, TOL, 0, what);
        printf("%s: %lld parameters, prediction %s max|diff| %.2e (max|out| %.2f)\n", name,
               (long long)mmc_unet_param_count(m), mmc_shape_str(out, what, sizeof what), max_abs_diff(out, want),
               max_abs(want));
    }
    /* bad inputs are errors naming what is wrong */
    mmc_tensor *odd = mmc_zeros(ctx, MMC_F32, 4, MMC_SHAPE(2, 4, 6, 12));
    in.sample = odd;
    CHECK_ERR(mmc_unet_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "multiples of 4") != NULL);
    in.sample = x, in.encoder = x;
    CHECK_ERR(mmc_unet_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "encoder_hidden_states") != NULL);
    in.encoder = enc;
    if (te) {
        in.n_time_ids = 5;
        CHECK_ERR(mmc_unet_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
        CHECK(strstr(mmc_last_error(), "projection_class_embeddings_input_dim") != NULL);
    }
    mmc_ctx_free(ctx);
    mmc_tensor *ts[] = {x, t, enc, want, te, ids};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) mmc_tensor_free(ts[i]);
    mmc_st_close(exp);
    mmc_unet_free(m);
}

static void check_config_errors(void) {
    const char *bad[][2] = {
        {"{\"_class_name\": \"UNet2DModel\"}", "_class_name"},
        {"{\"block_out_channels\": [8, 16], \"down_block_types\": [\"DownBlock2D\", \"SimpleCrossAttnDownBlock2D\"], "
         "\"up_block_types\": [\"UpBlock2D\", \"UpBlock2D\"], \"norm_num_groups\": 4}", "SimpleCrossAttnDownBlock2D"},
        {"{\"block_out_channels\": [8, 16], \"down_block_types\": [\"DownBlock2D\"], "
         "\"up_block_types\": [\"UpBlock2D\", \"UpBlock2D\"], \"norm_num_groups\": 4}", "down_block_types"},
        {"{\"block_out_channels\": [8, 16], \"down_block_types\": [\"DownBlock2D\", \"DownBlock2D\"], "
         "\"up_block_types\": [\"UpBlock2D\", \"UpBlock2D\"], \"norm_num_groups\": 4, "
         "\"class_embed_type\": \"timestep\"}", "class_embed_type"},
        {"{\"block_out_channels\": [8, 16], \"down_block_types\": [\"DownBlock2D\", \"DownBlock2D\"], "
         "\"up_block_types\": [\"UpBlock2D\", \"UpBlock2D\"], \"norm_num_groups\": 4, "
         "\"addition_embed_type\": \"text_image\"}", "addition_embed_type"},
        {"{\"block_out_channels\": [8, 16], \"down_block_types\": [\"DownBlock2D\", \"DownBlock2D\"], "
         "\"up_block_types\": [\"UpBlock2D\", \"UpBlock2D\"], \"norm_num_groups\": 3}", "norm_num_groups"},
        {"{\"block_out_channels\": [8, 16], \"down_block_types\": [\"DownBlock2D\", \"DownBlock2D\"], "
         "\"up_block_types\": [\"UpBlock2D\", \"UpBlock2D\"], \"norm_num_groups\": 4, "
         "\"transformer_layers_per_block\": [1, 2, 3]}", "transformer_layers_per_block"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        mmc_json *j = NULL;
        CHECK_OK(mmc_json_parse(bad[i][0], strlen(bad[i][0]), "test", &j));
        mmc_unet_config c;
        mmc_status st = mmc_unet_config_read(j, "unet/config.json", &c);
        CHECKF(st != MMC_OK && strstr(mmc_last_error(), bad[i][1]) && strstr(mmc_last_error(), "unet/config.json"),
               "%s: status %d, message '%s'", bad[i][0], st, mmc_last_error());
        mmc_json_free(j);
    }
}

int main(int argc, char **argv) {
    if (test_part(argc, argv, "sdxl")) check_case("sdxl");
    if (test_part(argc, argv, "half")) {   /* the fp16 variant and a bf16 copy, computed in f32 */
        check_case("sdxl_f16");
        check_case("sdxl_bf16");
    }
    if (test_part(argc, argv, "sd15")) check_case("sd15");
    if (test_part(argc, argv, "errors")) check_config_errors();
    return test_done("test_unet");
}
