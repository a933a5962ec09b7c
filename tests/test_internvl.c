/* test_internvl.c — InternVL (InternViT tower + pixel shuffle + projector + Qwen2) against
 * transformers 5.23 (tools/ref/gen_internvl.py) on the checkpoints as save_pretrained writes them:
 * the tower's last hidden state and the projected image features (1e-4), the logits of a full
 * forward over the processor's prompt with one image tiled 3x2 + thumbnail (1e-4 max-abs, f32),
 * greedy decoding through the KV cache (token-identical); v5_rms adds RMSNorm, QK-norm, the final
 * LayerNorm (use_mean_pooling false), 84-pixel tiles on a 56-pixel tower (bicubic position
 * interpolation) and a tied head. The processor: pixel_values (PIL backend, and the torchvision
 * backend of transformers 5's default processor) within 1e-5 and the
 * chat-templated, expanded ids equal to InternVLProcessor's; OpenGVLab's remote-code layout
 * (InternVLChatModel, ps_version v2 and v1); config errors. */
#include "test_util.h"
#include "greedy_check.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mmc_infer.h"
#include "mmc_internvl.h"
#include "mmc_tokenizer.h"
#include "mmc_io.h"

static mmc_st *ref;

static void test_model(const char *name) {
    char dir[256], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/internvl/%s", name);
    mmc_internvl *m = NULL;
    if (mmc_internvl_load(dir, &m) != MMC_OK) {
        fprintf(stderr, "load %s: %s\n", dir, mmc_last_error());
        g_fail++;
        return;
    }
    snprintf(key, sizeof key, "%s.ids", name);
    mmc_tensor *ids = fixture_tensor(ref, key, MMC_I64);
    snprintf(key, sizeof key, "%s.pixel_values", name);
    mmc_tensor *px = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.logits", name);
    mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.greedy", name);
    mmc_tensor *greedy = fixture_tensor(ref, key, MMC_I64);
    snprintf(key, sizeof key, "%s.vision_last", name);
    mmc_tensor *vlast = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.image_features", name);
    mmc_tensor *feats = fixture_tensor(ref, key, MMC_F32);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    /* the tower alone: the last layer's output (hidden_states[-1]) */
    mmc_tensor **hs = NULL, *last = NULL;
    CHECK_OK(mmc_intern_vit_forward(ctx, m->vision, px, 3, &hs, &last));
    if (hs) {
        printf("internvl %-7s tower hidden_states[-1] max|diff| %.4e\n", name, max_abs_diff(hs[3], vlast));
        CHECK_CLOSE(hs[3], vlast, 1e-4, 0, "vision_last");
    }
    mmc_tensor *f = NULL;
    CHECK_OK(mmc_internvl_image_features(ctx, m, px, &f));
    if (f) {
        mmc_tensor *fw = mmc_reshape(ctx, feats, 2, MMC_SHAPE(feats->shape[0] * feats->shape[1], feats->shape[2]));
        printf("internvl %-7s image features [%lld, %lld] max|diff| %.4e\n", name, (long long)f->shape[0],
               (long long)f->shape[1], max_abs_diff(f, fw));
        CHECK_CLOSE(f, fw, 1e-4, 0, "image_features");
    }
    mmc_ctx_reset(ctx);
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_internvl_forward(ctx, m, ids, px, NULL, &h));
    if (h) {
        mmc_tensor *got = mmc_internvl_logits(ctx, m, h);
        double d = max_abs_diff(got, want);
        printf("internvl %-7s logits [%lld, %lld, %lld] max|diff| %.4e\n", name, (long long)got->shape[0],
               (long long)got->shape[1], (long long)got->shape[2], d);
        CHECK_CLOSE(got, want, 1e-4, 0, dir);
    }
    mmc_ctx_reset(ctx);
    mmc_internvl_request r = {m, px};
    mmc_decoder dec = mmc_internvl_decoder(&r);
    check_greedy(&dec, ids, greedy, dir);
    /* the placeholder count must match the features */
    mmc_tensor *few = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(1, 3));
    for (int i = 0; i < 3; i++) ((int64_t *)few->data)[i] = i;
    CHECK(mmc_internvl_forward(ctx, m, few, px, NULL, &h) == MMC_ERR_INVALID);
    mmc_tensor_free(ids);
    mmc_tensor_free(px);
    mmc_tensor_free(want);
    mmc_tensor_free(greedy);
    mmc_tensor_free(vlast);
    mmc_tensor_free(feats);
    mmc_ctx_free(ctx);
    mmc_internvl_free(m);
}

/* OpenGVLab's remote-code layout (remote/: v5 renamed, ps_version v2; remote_v1/: the same weights
 * with ps_version v1): v5's ids and tiles give transformers' logits (v5's; remote_v1's from
 * transformers with pixel_shuffle patched to v1, its last position) and greedy tokens. */
static void test_remote(const char *name) {
    char dir[256], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/internvl/%s", name);
    mmc_internvl *m = NULL;
    if (mmc_internvl_load(dir, &m) != MMC_OK) {
        fprintf(stderr, "load %s: %s\n", dir, mmc_last_error());
        g_fail++;
        return;
    }
    bool v1 = !strcmp(name, "remote_v1");
    CHECK(m->remote_layout && m->ps_v1 == v1 && m->image_token_id == 1394 && m->feature_layer == 2);
    mmc_tensor *ids = fixture_tensor(ref, "v5.ids", MMC_I64), *px = fixture_tensor(ref, "v5.pixel_values", MMC_F32);
    snprintf(key, sizeof key, "%s.logits", v1 ? "remote_v1" : "v5");
    mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
    snprintf(key, sizeof key, "%s.greedy", v1 ? "remote_v1" : "v5");
    mmc_tensor *greedy = fixture_tensor(ref, key, MMC_I64);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_internvl_forward(ctx, m, ids, px, NULL, &h));
    if (h) {
        mmc_tensor *got = mmc_internvl_logits(ctx, m, h);
        if (v1) got = mmc_contiguous(ctx, mmc_narrow(ctx, got, 1, got->shape[1] - 1, 1));
        printf("internvl %-9s logits [%lld, %lld, %lld] max|diff| %.4e\n", name, (long long)got->shape[0],
               (long long)got->shape[1], (long long)got->shape[2], max_abs_diff(got, want));
        CHECK_CLOSE(got, want, 1e-4, 0, dir);
    }
    mmc_ctx_reset(ctx);
    mmc_internvl_request r = {m, px};
    mmc_decoder dec = mmc_internvl_decoder(&r);
    check_greedy(&dec, ids, greedy, dir);
    /* the tiling settings from config.json: v5's tiles */
    mmc_internvl_proc p;
    mmc_internvl_proc_default(&p);
    CHECK_OK(mmc_internvl_proc_load_dir(dir, &p, NULL, 0));
    CHECK(p.size_h == 56 && p.max_patches == 6 && p.use_thumbnail && p.crop_to_patches && p.image_seq_length == 4);
    mmc_image img;
    if (mmc_image_load("tests/fixtures/e2e/shapes_160x120.png", NULL, &img) == MMC_OK) {
        mmc_tensor *tp = NULL;
        int64_t tiles = 0;
        CHECK_OK(mmc_internvl_preprocess(&p, &img, 1, &tp, &tiles));
        if (tp) CHECK_CLOSE(tp, px, 1e-5, 0, "remote tiles");
        mmc_tensor_free(tp);
        mmc_image_free(&img);
    } else g_fail++;
    mmc_tensor_free(ids);
    mmc_tensor_free(px);
    mmc_tensor_free(want);
    mmc_tensor_free(greedy);
    mmc_ctx_free(ctx);
    mmc_internvl_free(m);
}

/* transformers 4.52-4.57's weight names (model.vision_tower.*, model.multi_modal_projector.*,
 * model.language_model.*, lm_head.*): v5's tensors renamed into a temporary directory give v5's logits. */
static void test_v452(void) {
    char dir[] = "/tmp/mmc_test_internvl.XXXXXX", path[256], cmd[4400], cwd[4096];
    if (!mkdtemp(dir) || !getcwd(cwd, sizeof cwd)) { g_fail++; return; }
    snprintf(cmd, sizeof cmd, "ln -s %s/tests/fixtures/internvl/v5/config.json %s/", cwd, dir);
    if (system(cmd) != 0) { g_fail++; return; }
    mmc_st *st = NULL;
    CHECK_OK(mmc_st_open("tests/fixtures/internvl/v5/model.safetensors", &st));
    mmc_stw *w = mmc_stw_new();
    if (!st || !w) { g_fail++; mmc_st_close(st); mmc_stw_free(w); return; }
    static char names[256][160];
    int n = mmc_st_count(st);
    for (int i = 0; i < n && i < 256; i++) {
        const mmc_st_entry *e = mmc_st_at(st, i);
        const char *k = e->name;
        if (!strncmp(k, "language_model.model.", 21)) snprintf(names[i], sizeof names[i], "model.language_model.%s", k + 21);
        else if (!strcmp(k, "language_model.lm_head.weight")) snprintf(names[i], sizeof names[i], "lm_head.weight");
        else snprintf(names[i], sizeof names[i], "model.%s", k);
        CHECK_OK(mmc_stw_add_raw(w, names[i], e->dtype, e->ndim, e->shape, e->data));
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_OK(mmc_stw_write(w, path));
    mmc_stw_free(w);
    mmc_st_close(st);
    mmc_internvl *m = NULL;
    CHECK_OK(mmc_internvl_load(dir, &m));
    if (m) {
        CHECK(!m->hub_layout);
        mmc_tensor *ids = fixture_tensor(ref, "v5.ids", MMC_I64), *px = fixture_tensor(ref, "v5.pixel_values", MMC_F32);
        mmc_tensor *want = fixture_tensor(ref, "v5.logits", MMC_F32), *h = NULL;
        mmc_ctx *ctx = mmc_ctx_new();
        CHECK_OK(mmc_internvl_forward(ctx, m, ids, px, NULL, &h));
        if (h) {
            mmc_tensor *got = mmc_internvl_logits(ctx, m, h);
            printf("internvl v452 (renamed v5) logits max|diff| %.4e\n", max_abs_diff(got, want));
            CHECK_CLOSE(got, want, 1e-4, 0, "v452 layout");
        }
        mmc_ctx_free(ctx);
        mmc_tensor_free(ids);
        mmc_tensor_free(px);
        mmc_tensor_free(want);
        mmc_internvl_free(m);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) g_fail++;
}

/* The processor from the saved processor_config.json on the non-square fixture image: the tiles
 * within 1e-5 of GotOcr2ImageProcessorPil's, and the chat template (mmc's Jinja engine) + the
 * <img><IMG_CONTEXT>*N</img> expansion equal to InternVLProcessor's ids. */
static void test_processor(const char *name, int64_t want_tiles, int64_t want_seq) {
    char dir[256], used[4300], key[128];
    snprintf(dir, sizeof dir, "tests/fixtures/internvl/%s", name);
    mmc_internvl_proc p;
    mmc_internvl_proc_default(&p);
    CHECK_OK(mmc_internvl_proc_load_dir(dir, &p, used, sizeof used));
    CHECKF(p.image_seq_length == want_seq && used[0], "%s: image_seq_length %lld (%s)", dir,
           (long long)p.image_seq_length, used);
    mmc_image img;
    if (mmc_image_load("tests/fixtures/e2e/shapes_160x120.png", NULL, &img) != MMC_OK) { g_fail++; return; }
    mmc_tensor *px = NULL;
    int64_t tiles = 0;
    CHECK_OK(mmc_internvl_preprocess(&p, &img, 1, &px, &tiles));
    snprintf(key, sizeof key, "%s.pixel_values", name);
    mmc_tensor *want = fixture_tensor(ref, key, MMC_F32);
    CHECKF(tiles == want_tiles, "%s: %lld tiles, transformers %lld", dir, (long long)tiles, (long long)want_tiles);
    if (px) {
        printf("internvl processor %-7s %lld tiles pixel_values max|diff| %.4e (%s)\n", name, (long long)tiles,
               max_abs_diff(px, want), used);
        CHECK_CLOSE(px, want, 1e-5, 0, key);
    }
    if (!strcmp(name, "v5")) {   /* transformers 5's default GotOcr2ImageProcessor (torchvision backend) */
        mmc_internvl_proc pt = p;
        pt.resize_mode = MMC_VLPROC_RESIZE_TORCH;
        mmc_tensor *tv = NULL, *wtv = fixture_tensor(ref, "v5.pixel_values_torchvision", MMC_F32);
        int64_t nt = 0;
        CHECK_OK(mmc_internvl_preprocess(&pt, &img, 1, &tv, &nt));
        if (tv) {
            printf("internvl processor v5      torchvision pixel_values max|diff| %.4e\n", max_abs_diff(tv, wtv));
            CHECK_CLOSE(tv, wtv, 1e-5, 0, "v5.pixel_values_torchvision");
        }
        mmc_tensor_free(tv);
        mmc_tensor_free(wtv);
    }
    /* the prompt */
    mmc_tokenizer *tok = NULL;
    CHECK_OK(mmc_tokenizer_load(dir, &tok));
    if (tok) {
        mmc_chat_part parts[2] = {{.type = MMC_CHAT_IMAGE}, {.type = MMC_CHAT_TEXT, .text = "What is in the image?"}};
        mmc_chat_message msg = {.role = "user", .parts = parts, .n_parts = 2};
        mmc_chat_options co = {.add_generation_prompt = true, .add_special_tokens = true};
        int32_t *ids = NULL, *ex = NULL;
        int64_t n = 0, nx = 0;
        CHECK_OK(mmc_chat_encode(tok, &msg, 1, &co, &ids, NULL, &n));
        int32_t ctx_id = mmc_tokenizer_token_to_id(tok, "<IMG_CONTEXT>"), start = mmc_tokenizer_token_to_id(tok, "<img>"),
                end = mmc_tokenizer_token_to_id(tok, "</img>");
        CHECK(ctx_id >= 0 && start >= 0 && end >= 0);
        int64_t per = tiles * p.image_seq_length;
        CHECK_OK(mmc_internvl_expand(ids, n, ctx_id, start, end, &per, 1, &ex, &nx));
        snprintf(key, sizeof key, "%s.ids", name);
        mmc_tensor *wids = fixture_tensor(ref, key, MMC_I64);
        bool same = ex && nx == wids->shape[1];
        for (int64_t i = 0; same && i < nx; i++) same = ex[i] == ((int64_t *)wids->data)[i];
        CHECKF(same, "%s: expanded prompt (%lld ids) differs from InternVLProcessor's (%lld)", dir, (long long)nx,
               (long long)wids->shape[1]);
        /* two images for one placeholder: an error naming both counts */
        int64_t two[2] = {per, per};
        int32_t *bad = NULL;
        CHECK(mmc_internvl_expand(ids, n, ctx_id, start, end, two, 2, &bad, &nx) == MMC_ERR_INVALID);
        free(ids);
        free(ex);
        mmc_tensor_free(wids);
        mmc_tokenizer_free(tok);
    }
    mmc_tensor_free(want);
    mmc_tensor_free(px);
    mmc_image_free(&img);
}

/* get_optimal_tiled_canvas on a few shapes (values from transformers 5.23) */
static void test_grid(void) {
    mmc_internvl_proc p;
    mmc_internvl_proc_default(&p);   /* 448 tiles, 1 .. 12 */
    static const struct { int h, w, cols, rows; } c[] = {
        {120, 160, 4, 3}, {448, 448, 1, 1}, {1000, 300, 1, 3}, {300, 1000, 3, 1}, {500, 1400, 3, 1}, {2000, 2000, 3, 3},
        {10, 2000, 12, 1},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        int cols, rows;
        mmc_internvl_tile_grid(&p, c[i].h, c[i].w, &cols, &rows);
        CHECKF(cols == c[i].cols && rows == c[i].rows, "grid of %d x %d: %d x %d, want %d x %d", c[i].w, c[i].h, cols,
               rows, c[i].cols, c[i].rows);
    }
}

/* Config problems are errors naming the file and key (a top-level key given first wins over the
 * defaults written after it: the JSON reader takes a key's first occurrence) */
static void test_errors(void) {
    static const struct { const char *vision, *top, *want; } cases[] = {
        {", \"norm_type\": \"batch_norm\"", "", "norm_type 'batch_norm'"},
        {"", "\"downsample_ratio\": 0.3, ", "downsample_ratio 0.3"},
        {"", "\"vision_feature_select_strategy\": \"full\", ", "vision_feature_select_strategy 'full'"},
        {"", "\"vision_feature_layer\": -9, ", "vision_feature_layer -9"},
        {"", "\"image_token_id\": 5000, ", "image_token_id 5000"},
        {", \"model_type\": \"siglip_vision_model\"", "", "vision_config.model_type 'siglip_vision_model'"},
        {"", "", NULL},   /* the control */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[] = "/tmp/mmc_test_internvl.XXXXXX", path[256], cmd[4400], cwd[4096];
        if (!mkdtemp(dir) || !getcwd(cwd, sizeof cwd)) { g_fail++; return; }
        snprintf(cmd, sizeof cmd, "ln -s %s/tests/fixtures/internvl/v5/model.safetensors %s/", cwd, dir);
        if (system(cmd) != 0) { g_fail++; continue; }
        snprintf(path, sizeof path, "%s/config.json", dir);
        FILE *f = fopen(path, "w");
        if (!f) { g_fail++; continue; }
        fprintf(f, "{%s\"model_type\": \"internvl\", \"image_token_id\": 1394, \"vision_feature_layer\": -2, "
                   "\"text_config\": {\"model_type\": \"qwen2\", \"vocab_size\": 1396, \"hidden_size\": 32, "
                   "\"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                   "\"num_key_value_heads\": 2, \"tie_word_embeddings\": false}, \"vision_config\": {\"hidden_size\": 36, "
                   "\"intermediate_size\": 52, \"num_hidden_layers\": 3, \"num_attention_heads\": 3, \"image_size\": [56, 56], "
                   "\"patch_size\": [14, 14], \"attention_bias\": true%s}}", cases[i].top, cases[i].vision);
        fclose(f);
        mmc_internvl *m = NULL;
        mmc_status st = mmc_internvl_load(dir, &m);
        if (cases[i].want)
            CHECKF(st != MMC_OK && strstr(mmc_last_error(), cases[i].want) && strstr(mmc_last_error(), "config.json"),
                   "case %zu: %s", i, st ? mmc_last_error() : "loaded");
        else
            CHECKF(st == MMC_OK, "control config: %s", mmc_last_error());
        mmc_internvl_free(m);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) g_fail++;
    }
}

/* OpenGVLab's layout with an InternLM2 language model (InternVL2 / 2.5-8B's; remote_internlm2/, made by
 * tools/ref/gen_internvl_internlm2.py): remote's vision tower and projector, a random InternLM2 with GQA (4 query
 * heads over 2 key/value heads: the packed wqkv's grouped rows), its logits and greedy tokens from the InternLM
 * team's modeling_internlm2.py (xtuner 0.2.0's copy, transformers 4.44.2) on v5's prompt and transformers 5's
 * image features. Then a checkpoint whose wqkv has the wrong size is refused, naming it. */
static void test_remote_internlm2(void) {
    const char *dir = "tests/fixtures/internvl/remote_internlm2";
    mmc_st *r2 = fixture_open("internvl/internlm2_ref.safetensors");
    mmc_internvl *m = NULL;
    if (!r2 || mmc_internvl_load(dir, &m) != MMC_OK) {
        fprintf(stderr, "load %s: %s\n", dir, r2 ? mmc_last_error() : "no internlm2_ref.safetensors");
        g_fail++;
        mmc_st_close(r2);
        return;
    }
    const mmc_qwen2_config *c = &m->lm->cfg;
    CHECK(m->remote_layout && m->lm_internlm2 && m->image_token_id == 1394);
    CHECK(c->num_heads == 4 && c->num_kv_heads == 2 && c->head_dim == 8 && !c->qkv_bias && !c->o_bias &&
          c->rope_kind == MMC_ROPE_DYNAMIC && c->rope_theta == 1e6 && !c->tie_word_embeddings);
    mmc_tensor *ids = fixture_tensor(r2, "ids", MMC_I64), *px = fixture_tensor(ref, "v5.pixel_values", MMC_F32),
               *want = fixture_tensor(r2, "logits", MMC_F32), *greedy = fixture_tensor(r2, "greedy", MMC_I64);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);
    mmc_tensor *h = NULL;
    CHECK_OK(mmc_internvl_forward(ctx, m, ids, px, NULL, &h));
    if (h) {
        mmc_tensor *got = mmc_internvl_logits(ctx, m, h);
        printf("internvl remote_internlm2 logits [%lld, %lld, %lld] max|diff| %.4e (InternLM2 reference)\n",
               (long long)got->shape[0], (long long)got->shape[1], (long long)got->shape[2], max_abs_diff(got, want));
        CHECK_CLOSE(got, want, 1e-4, 0, dir);
    }
    mmc_ctx_reset(ctx);
    mmc_internvl_request rq = {m, px};
    mmc_decoder dec = mmc_internvl_decoder(&rq);
    check_greedy(&dec, ids, greedy, dir);
    mmc_tensor_free(ids), mmc_tensor_free(px), mmc_tensor_free(want), mmc_tensor_free(greedy);
    mmc_ctx_free(ctx);
    mmc_internvl_free(m);
    mmc_st_close(r2);

    /* the same config over weights with 3 key/value heads' worth of wqkv rows: refused, naming the tensor */
    char tmp[] = "/tmp/mmc_test_internvl.XXXXXX", path[256], cmd[1200];
    if (!mkdtemp(tmp)) { g_fail++; return; }
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/tokenizer_config.json %s/ && cp -L %s/tokenizer.json %s/ && "
             "sed -i 's/\"num_key_value_heads\": 2/\"num_key_value_heads\": 1/' %s/config.json", dir, dir, tmp, dir,
             tmp, tmp);
    CHECK(system(cmd) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    char cwd[200];
    if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, ".");
    snprintf(cmd, sizeof cmd, "ln -s %s/%s/model.safetensors %s", cwd, dir, path);
    CHECK(system(cmd) == 0);
    m = NULL;
    mmc_status st = mmc_internvl_load(tmp, &m);
    CHECKF(st == MMC_ERR_FORMAT && strstr(mmc_last_error(), "language_model.model.layers.0.attention.wqkv.weight") &&
           strstr(mmc_last_error(), "[48, 32]"), "internlm2 with a mis-sized wqkv: %s", st ? mmc_last_error() : "loaded");
    mmc_internvl_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) g_fail++;
}

int main(void) {
    ref = fixture_open("internvl/ref.safetensors");
    if (!ref) return test_done("test_internvl");
    test_grid();
    test_processor("v5", 7, 4);
    test_processor("v5_rms", 3, 9);
    test_model("v5");
    test_model("v5_rms");
    test_v452();
    test_remote("remote");
    test_remote("remote_v1");
    test_errors();
    test_remote_internlm2();
    mmc_st_close(ref);
    return test_done("test_internvl");
}
