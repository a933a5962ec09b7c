/* test_llava.c — LLaVA-1.5 (CLIP vision tower + projector + Llama) against transformers
 * (tools/ref/gen_llava.py): last-layer logits of a full forward over a prompt with one image
 * (1e-4 max-abs, f32) and greedy decoding through the KV cache (token-identical), for the
 * checkpoint as transformers 5 saves it, as 4.52-4.57 name it and in the Hub's 4.4x layout (bf16
 * matrices), plus a second config (list vision_feature_layer, "full" strategy, attention and
 * MLP biases, linear rope scaling, tied head); Llama's llama3 rope remap; config errors. */
#include "test_util.h"
#include "greedy_check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mmc_infer.h"
#include "mmc_llava.h"
#include "mmc_vlproc.h"

static mmc_st *ref;

static void test_model(const char *name, const char *refname) {
    char dir[256], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/llava/%s", name);
    mmc_llava *m = NULL;
    if (mmc_llava_load(dir, &m) != MMC_OK) {
        fprintf(stderr, "load %s: %s\n", dir, mmc_last_error());
        g_fail++;
        return;
    }
    snprintf(key, sizeof key, "%s.ids", refname);
    mmc_tensor *ids = fixture_tensor(ref, key, MMC_I64);
    snprintf(key, sizeof key, "%s.pixel_values", refname);
    mmc_tensor *px = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.logits", name);
    mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.greedy", name);
    mmc_tensor *greedy = fixture_tensor(ref, key, MMC_I64);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_llava_forward(ctx, m, ids, px, NULL, &h));
    if (h) {
        mmc_tensor *got = mmc_llava_logits(ctx, m, h);
        double d = max_abs_diff(got, want);
        printf("llava %-8s logits [%lld, %lld, %lld] max|diff| %.4e\n", name, (long long)got->shape[0],
               (long long)got->shape[1], (long long)got->shape[2], d);
        CHECK_CLOSE(got, want, 1e-4, 0, dir);
    }
    mmc_ctx_reset(ctx);
    /* greedy decoding with the KV cache */
    mmc_llava_request r = {m, px, NULL, 0, NULL};
    mmc_decoder dec = mmc_llava_decoder(&r);
    check_greedy(&dec, ids, greedy, dir);
    /* the placeholder count must match the features */
    mmc_tensor *few = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(1, 3));
    for (int i = 0; i < 3; i++) ((int64_t *)few->data)[i] = i;
    CHECK(mmc_llava_forward(ctx, m, few, px, NULL, &h) == MMC_ERR_INVALID);
    mmc_tensor_free(ids);
    mmc_tensor_free(px);
    mmc_tensor_free(want);
    mmc_tensor_free(greedy);
    mmc_ctx_free(ctx);
    mmc_llava_free(m);
}

/* The configs as read: v5's text model uses llama3 rope scaling (original_max_position_embeddings
 * 16, head_dim 8: one band is smoothed, three divided by the factor; the logits parity above is
 * what checks the remap), v5_full's linear scaling, biases, tied head, two feature layers. */
static void test_configs(void) {
    mmc_llava *m = NULL;
    if (mmc_llava_load("tests/fixtures/llava/v5", &m) != MMC_OK) { g_fail++; return; }
    const mmc_qwen2_config *c = &m->lm->cfg;
    CHECK(c->rope_kind == MMC_ROPE_LLAMA3 && c->rope_factor == 8.0 && c->rope_original_max_pos == 16);
    CHECK(!c->qkv_bias && !c->o_bias && !c->mlp_bias && c->num_kv_heads == 2 && c->head_dim == 8);
    CHECK(m->n_feature_layers == 1 && m->feature_layers[0] == 2 && !m->feature_full);
    CHECK(mmc_llava_image_tokens(m) == 25);
    mmc_llava_free(m);
    CHECK_OK(mmc_llava_load("tests/fixtures/llava/v5_full", &m));
    if (m) {
        const mmc_qwen2_config *f = &m->lm->cfg;
        CHECK(f->rope_kind == MMC_ROPE_LINEAR && f->qkv_bias && f->o_bias && f->mlp_bias);
        CHECK(m->lm->lm_head == m->lm->embed);
        CHECK(m->n_feature_layers == 2 && m->feature_layers[0] == 1 && m->feature_layers[1] == 3 && m->feature_full);
        CHECK(mmc_llava_image_tokens(m) == 26);
        mmc_llava_free(m);
    }
}

/* CLIPImageProcessor from each directory's saved processor config, on the non-square fixture
 * image: PIL backend within 1e-5 of transformers' CLIPImageProcessorPil, the torchvision mode
 * against transformers 5's default (torchvision) CLIPImageProcessor. */
static void test_processor(const char *name, const char *refname) {
    char dir[256], used[4300], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/llava/%s", name);
    mmc_clip_proc p;
    mmc_clip_proc_default(&p);
    CHECK_OK(mmc_clip_proc_load_dir(dir, &p, used, sizeof used));
    CHECKF(p.shortest_edge == 30 && p.crop_h == 30 && p.crop_w == 30 && used[0], "%s: processor config %s", dir, used);
    mmc_image img;
    if (mmc_image_load("tests/fixtures/e2e/shapes_160x120.png", NULL, &img) != MMC_OK) { g_fail++; return; }
    for (int mode = 0; mode < 2; mode++) {
        p.resize_mode = mode ? MMC_VLPROC_RESIZE_TORCH : MMC_VLPROC_RESIZE_PIL;
        mmc_tensor *px = NULL;
        CHECK_OK(mmc_clip_preprocess(&p, &img, 1, &px));
        snprintf(key, sizeof key, "%s.pixel_values%s", refname, mode ? "_torchvision" : "");
        mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
        if (px) {
            printf("clip processor %-8s %-11s pixel_values max|diff| %.4e (%s)\n", name, mode ? "torchvision" : "pil",
                   max_abs_diff(px, want), used);
            CHECK_CLOSE(px, want, 1e-5, 0, key);
        }
        mmc_tensor_free(want);
        mmc_tensor_free(px);
    }
    mmc_image_free(&img);
}

/* The Hub's llava-hf/llava-1.5-7b-hf config.json gives only a few text_config keys (the rest are
 * LlamaConfig's defaults in transformers) and a vision_config without hidden_act / eps */
static void test_hub_config(void) {
    const char *txt =
        "{\"architectures\": [\"LlavaForConditionalGeneration\"], \"ignore_index\": -100, \"image_token_index\": 32000,"
        " \"model_type\": \"llava\", \"pad_token_id\": 32001, \"projector_hidden_act\": \"gelu\","
        " \"text_config\": {\"_name_or_path\": \"lmsys/vicuna-7b-v1.5\", \"architectures\": [\"LlamaForCausalLM\"],"
        " \"max_position_embeddings\": 4096, \"model_type\": \"llama\", \"rms_norm_eps\": 1e-05,"
        " \"torch_dtype\": \"float16\", \"vocab_size\": 32064}, \"tie_word_embeddings\": false,"
        " \"torch_dtype\": \"float16\", \"vision_config\": {\"hidden_size\": 1024, \"image_size\": 336,"
        " \"intermediate_size\": 4096, \"model_type\": \"clip_vision_model\", \"num_attention_heads\": 16,"
        " \"num_hidden_layers\": 24, \"patch_size\": 14, \"projection_dim\": 768, \"vocab_size\": 32000},"
        " \"vision_feature_layer\": -2, \"vision_feature_select_strategy\": \"default\", \"vocab_size\": 32064}";
    mmc_json *j = NULL;
    CHECK_OK(mmc_json_parse(txt, strlen(txt), "llava-1.5-7b-hf config.json", &j));
    if (!j) return;
    mmc_qwen2_config t;
    CHECK_OK(mmc_llama_config_read_section(j, mmc_json_get(j, "text_config"), &t));
    CHECK(t.vocab_size == 32064 && t.hidden_size == 4096 && t.intermediate_size == 11008 && t.num_layers == 32 &&
          t.num_heads == 32 && t.num_kv_heads == 32 && t.head_dim == 128 && t.rms_norm_eps == 1e-5 &&
          t.rope_theta == 10000.0 && t.rope_kind == MMC_ROPE_DEFAULT && !t.tie_word_embeddings && !t.qkv_bias);
    mmc_clip_vision_config v;
    CHECK_OK(mmc_clip_vision_config_read(mmc_json_get(j, "vision_config"), "test", &v));
    CHECK(v.hidden_size == 1024 && v.num_hidden_layers == 24 && v.image_size == 336 && v.patch_size == 14 &&
          v.num_channels == 3 && v.layer_norm_eps == 1e-5 && v.hidden_act == MMC_ACT_QUICK_GELU);
    mmc_json_free(j);
}

/* Config problems are errors naming the file and key (v5's weights, a hand-written config with
 * one thing wrong: text_config / vision_config extras and a top-level key). */
static void test_errors(void) {
    static const struct { const char *text, *vision, *top, *want; } cases[] = {
        {"", ", \"model_type\": \"dinov2\"", "", "vision_config.model_type 'dinov2'"},
        {", \"model_type\": \"gemma\"", "", "", "text_config.model_type 'gemma'"},
        {"", "", ", \"vision_feature_layer\": -9", "vision_feature_layer -9"},
        {"", "", ", \"vision_feature_select_strategy\": \"cls\"", "vision_feature_select_strategy 'cls'"},
        {", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0}", "", "", "rope_type 'yarn'"},
        {"", "", ", \"image_token_id\": 5000", "image_token_id 5000"},
        {"", "", "", NULL},   /* the control: without a mistake it loads */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[] = "/tmp/mmc_test_llava.XXXXXX", path[256], cmd[4400], cwd[4096];
        if (!mkdtemp(dir) || !getcwd(cwd, sizeof cwd)) { g_fail++; return; }
        snprintf(cmd, sizeof cmd, "ln -s %s/tests/fixtures/llava/v5/model.safetensors %s/", cwd, dir);
        if (system(cmd) != 0) { g_fail++; continue; }
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (!f) { g_fail++; continue; }
        fprintf(f, "{\"model_type\": \"llava\", \"image_token_index\": 1392, \"text_config\": {\"vocab_size\": 1393, "
                   "\"hidden_size\": 48, \"intermediate_size\": 100, \"num_hidden_layers\": 2, \"num_attention_heads\": 6, "
                   "\"num_key_value_heads\": 2, \"head_dim\": 8%s}, \"vision_config\": {\"hidden_size\": 30, "
                   "\"intermediate_size\": 52, \"num_hidden_layers\": 3, \"num_attention_heads\": 3, \"image_size\": 30, "
                   "\"patch_size\": 6%s}%s}", cases[i].text, cases[i].vision, cases[i].top);
        fclose(f);
        mmc_llava *m = NULL;
        mmc_status st = mmc_llava_load(dir, &m);
        if (cases[i].want)
            CHECKF(st != MMC_OK && strstr(mmc_last_error(), cases[i].want) && strstr(mmc_last_error(), "config.json"),
                   "case %zu: %s", i, st ? mmc_last_error() : "loaded");
        else
            CHECKF(st == MMC_OK, "control config: %s", mmc_last_error());
        mmc_llava_free(m);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) g_fail++;
    }
}

int main(void) {
    ref = fixture_open("llava/ref.safetensors");
    if (!ref) return test_done("test_llava");
    test_model("v5", "v5");
    test_model("v452", "v5");
    test_model("hub", "v5");
    test_model("v5_full", "v5_full");
    /* the inference forms' row chunks capped at 3 rows: the LM's MLP crosses chunk boundaries */
    setenv("MMC_INFER_CHUNK_ROWS", "3", 1);
    test_model("v5", "v5");
    unsetenv("MMC_INFER_CHUNK_ROWS");
    test_errors();
    test_configs();
    test_hub_config();
    test_processor("v5", "v5");
    test_processor("hub", "v5");
    mmc_st_close(ref);
    return test_done("test_llava");
}
