/* test_hunyuan.c — HunyuanDiT against diffusers 0.42 / transformers 5.23 on tiny random checkpoints
 * written by save_pretrained (tests/fixtures/hunyuan, tools/ref/gen_hunyuan.py). HunyuanDiT2DModel: a
 * v1.1-shaped model (image-size and style conditioning, 6 blocks so two long skips pop in stack order),
 * a v1.2-shaped one (no size / style conditioning, 4 blocks), with padded BERT and T5 masks (the
 * learned padding rows are read) and non-square latents, and a 2-block v1.1 model stored in bf16: the
 * prediction (8 channels: learn_sigma) within 1e-4 of diffusers (f32); the rotary table
 * mmc_hunyuan_rope builds within 1e-5 of the pipeline's get_2d_rotary_pos_embed over
 * get_resize_crop_region_for_grid; the gradient against finite differences. BertModel within 1e-4,
 * the BERT tokenizer's ids equal (tokenizer.json and vocab.txt layouts), the whole HunyuanDiTPipeline
 * from injected latents and recorded scheduler draws within 1e-3 (latents and images; CFG, no CFG,
 * guidance_rescale). Also the loaders' errors on malformed configs / checkpoints / tokenizer files and
 * the forward's errors on mis-sized inputs. Part "train": DDPM training against a diffusers + PEFT loop
 * (tools/ref/gen_hunyuan_train.py, tests/fixtures/hunyuan_train): 20 LoRA steps on the v1.1 model
 * (v_prediction, min-SNR 5, offset noise, image_meta_size per step; the adapter PEFT saved) and 6 full
 * steps on the v1.2 one (epsilon): losses, clipped grad norms and final weights within 1e-3 relative;
 * the LoRA run again with every block checkpointed (recompute): the same losses. Part "merge": `mmc merge` of a
 * PEFT adapter into the pipeline folder against PEFT's merge_and_unload (check_merge). */
#include "test_util.h"
#include "lora_check.h"
#include "step_check.h"
#include "mmc_diffusion.h"
#include "mmc_encoders.h"
#include "mmc_io.h"
#include "mmc_train.h"

#include <unistd.h>

#define TOL 1e-4        /* model output, f32 */
#define ROPE_TOL 1e-5   /* cos / sin table */
#define BERT_TOL 1e-4   /* BertModel last_hidden_state, f32 */
#define ENC_TOL 1e-4    /* the pipeline's prompt encodings */
#define PIPE_TOL 1e-3   /* the whole pipeline: latents and images after 2-3 steps */
#define TRAIN_TOL 1e-3  /* training: each step's loss and clipped grad norm, the final weights (relative) */
/* recompute against no recompute: step 0 is bit-equal; the gradients sum in another order, so later steps
 * differ by float rounding (measured <= 1.2e-7 relative) */
#define RECOMPUTE_TOL 1e-6

typedef struct {
    mmc_tensor *hid, *t, *enc, *mask, *enc5, *mask5, *meta, *style, *cos, *sin, *want;
} hy_case;

static mmc_st *open_case(const char *name, hy_case *k) {
    char rel[256];
    snprintf(rel, sizeof rel, "hunyuan/%s/expected.safetensors", name);
    mmc_st *exp = fixture_open(rel);
    if (!exp) return NULL;
    k->hid = fixture_tensor(exp, "hidden", MMC_F32), k->t = fixture_tensor(exp, "timestep", MMC_F32);
    k->enc = fixture_tensor(exp, "encoder", MMC_F32), k->mask = fixture_tensor(exp, "mask", MMC_I32);
    k->enc5 = fixture_tensor(exp, "encoder_t5", MMC_F32), k->mask5 = fixture_tensor(exp, "mask_t5", MMC_I32);
    k->meta = fixture_tensor(exp, "image_meta_size", MMC_F32), k->style = fixture_tensor(exp, "style", MMC_I64);
    k->cos = fixture_tensor(exp, "rope_cos", MMC_F32), k->sin = fixture_tensor(exp, "rope_sin", MMC_F32);
    k->want = fixture_tensor(exp, "out", MMC_F32);
    return exp;
}

static void free_case(hy_case *k) {
    mmc_tensor *ts[] = {k->hid, k->t, k->enc, k->mask, k->enc5, k->mask5, k->meta, k->style, k->cos, k->sin, k->want};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
}

static void check_model(const char *name) {
    char dir[256], what[160];
    snprintf(dir, sizeof dir, "tests/fixtures/hunyuan/%s", name);
    mmc_hunyuan_dit *m = NULL;
    CHECK_OK(mmc_hunyuan_dit_load(dir, false, &m));
    if (!m) return;
    hy_case k;
    mmc_st *exp = open_case(name, &k);
    if (!exp) { mmc_hunyuan_dit_free(m); return; }
    const mmc_hunyuan_dit_config *c = mmc_hunyuan_dit_cfg(m);
    CHECK(c->out_channels == 2 * c->in_channels);
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_set_grad_enabled(ctx, false);

    /* the pipeline's rotary table for this latent size */
    const int64_t p = c->patch_size, gh = k.hid->shape[2] / p, gw = k.hid->shape[3] / p;
    mmc_tensor *cos = NULL, *sin = NULL;
    mmc_hunyuan_rope(ctx, c->attention_head_dim, gh, gw, 512 / 8 / p, &cos, &sin);
    CHECK(mmc_same_shape(cos, k.cos) && mmc_same_shape(sin, k.sin));
    CHECK_CLOSE(cos, k.cos, ROPE_TOL, 0, "rope cos");
    CHECK_CLOSE(sin, k.sin, ROPE_TOL, 0, "rope sin");
    printf("%s: rope %lldx%lld max|diff| cos %.2e sin %.2e\n", name, (long long)gh, (long long)gw,
           max_abs_diff(cos, k.cos), max_abs_diff(sin, k.sin));

    mmc_hunyuan_dit_inputs in = {.hidden = k.hid, .timestep = k.t->data, .encoder = k.enc, .mask = k.mask->data,
                                 .encoder_t5 = k.enc5, .mask_t5 = k.mask5->data, .image_meta_size = k.meta->data,
                                 .style = k.style->data, .rope_cos = k.cos, .rope_sin = k.sin};
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_hunyuan_dit_forward(ctx, m, &in, &out));
    if (out) {
        snprintf(what, sizeof what, "%s prediction", name);
        CHECK(mmc_same_shape(out, k.want));
        CHECK_CLOSE(out, k.want, TOL, 0, what);
        printf("%s: prediction %s max|diff| %.2e (max|out| %.2f)\n", name, mmc_shape_str(out, what, sizeof what),
               max_abs_diff(out, k.want), max_abs(k.want));
    }
    /* with mmc's own table: the same within the tolerance */
    in.rope_cos = cos, in.rope_sin = sin;
    CHECK_OK(mmc_hunyuan_dit_forward(ctx, m, &in, &out));
    if (out) CHECK_CLOSE(out, k.want, TOL, 0, "prediction with mmc_hunyuan_rope");
    /* a mask flip changes the output (the padding rows are read) */
    int32_t *mk = k.mask->data;
    mk[0] ^= 1;
    CHECK_OK(mmc_hunyuan_dit_forward(ctx, m, &in, &out));
    if (out) CHECK(max_abs_diff(out, k.want) > 1e-3);
    mk[0] ^= 1;

    /* bad inputs are errors naming what is wrong */
    mmc_tensor *odd = mmc_zeros(ctx, MMC_F32, 4, MMC_SHAPE(2, c->in_channels, p + 1, 2 * p));
    in.hidden = odd;
    CHECK_ERR(mmc_hunyuan_dit_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "multiples of patch_size") != NULL);
    in.hidden = k.enc;
    CHECK_ERR(mmc_hunyuan_dit_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "hidden_states") != NULL);
    in.hidden = k.hid, in.encoder = k.enc5;
    CHECK_ERR(mmc_hunyuan_dit_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "encoder_hidden_states must") != NULL);
    in.encoder = k.enc, in.encoder_t5 = k.enc;
    CHECK_ERR(mmc_hunyuan_dit_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "encoder_hidden_states_t5") != NULL);
    in.encoder_t5 = k.enc5, in.rope_cos = k.sin->shape[0] > 1 ? k.hid : k.sin;
    CHECK_ERR(mmc_hunyuan_dit_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "image_rotary_emb") != NULL);
    in.rope_cos = k.cos;
    if (c->use_style_cond_and_image_meta_size) {
        in.image_meta_size = NULL;
        CHECK_ERR(mmc_hunyuan_dit_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
        CHECK(strstr(mmc_last_error(), "image_meta_size") != NULL);
        in.image_meta_size = k.meta->data;
        const int64_t bad_style[2] = {0, 1};
        in.style = bad_style;
        CHECK_ERR(mmc_hunyuan_dit_forward(ctx, m, &in, &out), MMC_ERR_INVALID);
        CHECK(strstr(mmc_last_error(), "style[1]") != NULL);
    }
    free_case(&k);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_hunyuan_dit_free(m);
}

/* The forward's gradient against finite differences (latents, BERT and T5 states) on the v1.1 fixture
 * (skips, pooler, size / style conditioning): the path a training loop would take. f32 central
 * differences leave ~1e-3 of noise: hence the absolute tolerance. */
static hy_case g_case;
static mmc_hunyuan_dit *g_model;
static mmc_tensor *f_model(mmc_ctx *ctx, mmc_tensor **in, void *u) {
    (void)u;
    mmc_hunyuan_dit_inputs x = {.hidden = in[0], .timestep = g_case.t->data, .encoder = in[1],
                                .mask = g_case.mask->data, .encoder_t5 = in[2], .mask_t5 = g_case.mask5->data,
                                .image_meta_size = g_case.meta->data, .style = g_case.style->data,
                                .rope_cos = g_case.cos, .rope_sin = g_case.sin};
    mmc_tensor *out = NULL;
    MMC_CHECK(mmc_hunyuan_dit_forward(ctx, g_model, &x, &out) == MMC_OK, "%s", mmc_last_error());
    return out;
}

static void check_grad(void) {
    CHECK_OK(mmc_hunyuan_dit_load("tests/fixtures/hunyuan/v11", false, &g_model));
    if (!g_model) return;
    mmc_st *exp = open_case("v11", &g_case);
    if (!exp) { mmc_hunyuan_dit_free(g_model); return; }
    mmc_tensor *in[3] = {g_case.hid, g_case.enc, g_case.enc5};
    for (int i = 0; i < 3; i++) in[i]->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    CHECK(gradcheck("hunyuan forward", f_model, in, 3, NULL, 1e-2, 6e-3, 2e-2, 10) == 0);
    free_case(&g_case);
    mmc_st_close(exp);
    mmc_hunyuan_dit_free(g_model);
}

static void edit_load(const char *tmp, const char *src, const char *sed, mmc_status want, const char *needle) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sed '%s' %s/config.json > %s/config.json", sed, src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    mmc_hunyuan_dit *m = NULL;
    CHECK_ERR(mmc_hunyuan_dit_load(tmp, false, &m), want);
    CHECKF(strstr(mmc_last_error(), needle) != NULL, "'%s' not in: %s", needle, mmc_last_error());
    mmc_hunyuan_dit_free(m);
}

static void check_errors(void) {
    mmc_hunyuan_dit *m = NULL;
    CHECK_ERR(mmc_hunyuan_dit_load("tests/fixtures/hunyuan/nonexistent", false, &m), MMC_ERR_NOT_FOUND);
    char tmp[] = "/tmp/mmc_hunyuan_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    char cmd[768];
    const char *src = "tests/fixtures/hunyuan/v11";
    snprintf(cmd, sizeof cmd, "cp %s/diffusion_pytorch_model.safetensors %s/", src, tmp);
    MMC_CHECK(system(cmd) == 0, "cp");
    /* a config that does not match the checkpoint: the mis-shaped and missing tensors are named */
    edit_load(tmp, src, "s/\"num_layers\": 6/\"num_layers\": 8/", MMC_ERR_FORMAT,
              "missing tensor 'blocks.6.skip_norm.weight'");
    edit_load(tmp, src, "s/\"num_layers\": 6/\"num_layers\": 4/", MMC_ERR_FORMAT,
              "missing tensor 'blocks.3.skip_linear.weight'");
    edit_load(tmp, src, "s/\"use_style_cond_and_image_meta_size\": true/\"use_style_cond_and_image_meta_size\": false/",
              MMC_ERR_FORMAT, "extra_embedder.linear_1.weight");
    edit_load(tmp, src, "s/\"learn_sigma\": true/\"learn_sigma\": false/", MMC_ERR_FORMAT, "proj_out.weight");
    edit_load(tmp, src, "s/\"num_layers\": 6/\"num_layers\": 5/", MMC_ERR_FORMAT, "must be even");
    edit_load(tmp, src, "s/\"hidden_size\": 16/\"hidden_size\": 24/", MMC_ERR_FORMAT, "hidden_size");
    edit_load(tmp, src, "s/\"cross_attention_dim_t5\": 16/\"cross_attention_dim_t5\": 12/", MMC_ERR_FORMAT,
              "cross_attention_dim_t5");
    edit_load(tmp, src, "s/\"gelu-approximate\"/\"geglu\"/", MMC_ERR_UNSUPPORTED, "activation_fn");
    edit_load(tmp, src, "/\"patch_size\"/d", MMC_ERR_FORMAT, "patch_size");
    edit_load(tmp, src, "s/\"num_attention_heads\": 2/\"num_attention_heads\": \"2\"/", MMC_ERR_FORMAT,
              "num_attention_heads");
    /* a truncated checkpoint */
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/ && head -c 5000 %s/diffusion_pytorch_model.safetensors > "
             "%s/diffusion_pytorch_model.safetensors", src, tmp, src, tmp);
    MMC_CHECK(system(cmd) == 0, "truncate");
    CHECK(mmc_hunyuan_dit_load(tmp, false, &m) != MMC_OK);
    CHECK(strstr(mmc_last_error(), "diffusion_pytorch_model") != NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "rm");
}

/* BertModel (tests/fixtures/hunyuan/text_encoder: 2 post-LN layers of 3 heads) on two prompts
 * tokenized by transformers' BertTokenizer (padded to 16, so the key mask is exercised) */
static void check_bert(void) {
    mmc_bert *m = NULL;
    CHECK_OK(mmc_bert_load("tests/fixtures/hunyuan/text_encoder", &m));
    if (!m) return;
    mmc_st *exp = fixture_open("hunyuan/text_encoder/expected.safetensors");
    if (!exp) { mmc_bert_free(m); return; }
    mmc_tensor *want = fixture_tensor(exp, "hidden", MMC_F32);
    mmc_tensor *i0 = fixture_tensor(exp, "ids_0", MMC_I32), *i1 = fixture_tensor(exp, "ids_1", MMC_I32);
    mmc_tensor *m0 = fixture_tensor(exp, "mask_0", MMC_I32), *m1 = fixture_tensor(exp, "mask_1", MMC_I32);
    const int64_t T = i0->shape[0];
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(2, T)), *mask = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(2, T));
    memcpy(ids->data, i0->data, (size_t)T * 4), memcpy((int32_t *)ids->data + T, i1->data, (size_t)T * 4);
    memcpy(mask->data, m0->data, (size_t)T * 4), memcpy((int32_t *)mask->data + T, m1->data, (size_t)T * 4);
    mmc_tensor *out = NULL;
    CHECK_OK(mmc_bert_forward(ctx, m, ids, mask, &out));
    if (out) {
        CHECK(mmc_same_shape(out, want));
        CHECK_CLOSE(out, want, BERT_TOL, 0, "BertModel last_hidden_state");
        printf("bert: last_hidden_state max|diff| %.2e (max|h| %.2f)\n", max_abs_diff(out, want), max_abs(want));
    }
    /* ids past the vocabulary and sequences past max_position_embeddings are errors */
    ((int32_t *)ids->data)[1] = (int32_t)mmc_bert_cfg(m)->vocab_size;
    CHECK_ERR(mmc_bert_forward(ctx, m, ids, mask, &out), MMC_ERR_INVALID);
    mmc_tensor *longer = mmc_zeros(ctx, MMC_I32, 2, MMC_SHAPE(1, mmc_bert_cfg(m)->max_position_embeddings + 1));
    CHECK_ERR(mmc_bert_forward(ctx, m, longer, NULL, &out), MMC_ERR_INVALID);
    mmc_tensor *ts[] = {want, i0, i1, m0, m1};
    for (size_t i = 0; i < 5; i++) mmc_tensor_free(ts[i]);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_bert_free(m);
    /* malformed configs / checkpoints */
    char tmp[] = "/tmp/mmc_hybert_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    char cmd[768];
    const char *src = "tests/fixtures/hunyuan/text_encoder";
    snprintf(cmd, sizeof cmd, "cp %s/model.safetensors %s/ && sed 's/\"num_hidden_layers\": 2/\"num_hidden_layers\""
             ": 3/' %s/config.json > %s/config.json", src, tmp, src, tmp);
    MMC_CHECK(system(cmd) == 0, "cp");
    CHECK_ERR(mmc_bert_load(tmp, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "encoder.layer.2.attention.self.query.weight") != NULL);
    snprintf(cmd, sizeof cmd, "sed 's/\"hidden_size\": 12/\"hidden_size\": 13/' %s/config.json > %s/config.json",
             src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_bert_load(tmp, &m), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "num_attention_heads") != NULL);
    snprintf(cmd, sizeof cmd, "sed 's/\"model_type\": \"bert\"/\"model_type\": \"bert\", "
             "\"position_embedding_type\": \"relative_key\"/' %s/config.json > %s/config.json", src, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_bert_load(tmp, &m), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "position_embedding_type") != NULL);
    snprintf(cmd, sizeof cmd, "cp %s/config.json %s/ && head -c 3000 %s/model.safetensors > %s/model.safetensors",
             src, tmp, src, tmp);
    MMC_CHECK(system(cmd) == 0, "truncate");
    CHECK(mmc_bert_load(tmp, &m) != MMC_OK);
    CHECK(strstr(mmc_last_error(), "model.safetensors") != NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "rm");
}

/* BertTokenizer ids (tests/fixtures/hunyuan/tokenizer as transformers 5 saves it, and tokenizer_vocab: the
 * vocab.txt the tokenizer was built from with a Hub-style tokenizer_config.json; padded / truncated to
 * 16 as the pipeline
 * pads to 77): Chinese text with full-width punctuation, mixed case and punctuation, accents and
 * unknown words, the empty prompt, tabs / newlines / repeated spaces. Equal ids and masks. */
static void check_bert_tokenizer(const char *dir) {
    mmc_bert_tokenizer *t = NULL;
    CHECK_OK(mmc_bert_tokenizer_load(dir, &t));
    if (!t) return;
    CHECK(mmc_bert_tokenizer_model_max_length(t) == 77);
    mmc_st *exp = fixture_open("hunyuan/text_encoder/expected.safetensors");
    if (!exp) { mmc_bert_tokenizer_free(t); return; }
    for (int i = 0; i < 5; i++) {
        char name[64], *text = NULL;
        size_t n = 0;
        snprintf(name, sizeof name, "tests/fixtures/hunyuan/prompts/text_%d.txt", i);
        CHECK_OK(mmc_read_file(name, &text, &n));
        if (!text) continue;
        snprintf(name, sizeof name, "ids_%d", i);
        mmc_tensor *want = fixture_tensor(exp, name, MMC_I32);
        snprintf(name, sizeof name, "mask_%d", i);
        mmc_tensor *wmask = fixture_tensor(exp, name, MMC_I32);
        int32_t ids[16], mask[16];
        CHECK_OK(mmc_bert_tokenizer_encode_padded(t, text, 16, ids, mask));
        const bool same = !memcmp(ids, want->data, sizeof ids) && !memcmp(mask, wmask->data, sizeof mask);
        CHECKF(same, "%s text_%d: ids differ from BertTokenizer's", dir, i);
        if (!same) {
            for (int k = 0; k < 16; k++) fprintf(stderr, " %d/%d", ids[k], ((int32_t *)want->data)[k]);
            fprintf(stderr, "\n");
        }
        mmc_tensor_free(want);
        mmc_tensor_free(wmask);
        free(text);
    }
    int32_t ids[2], mask[2];
    CHECK_ERR(mmc_bert_tokenizer_encode_padded(t, "x", 1, ids, mask), MMC_ERR_INVALID);
    mmc_st_close(exp);
    mmc_bert_tokenizer_free(t);
    if (strstr(dir, "tokenizer_vocab")) {   /* vocab.txt layout: a folder with neither file is named */
        CHECK_ERR(mmc_bert_tokenizer_load("tests/fixtures/hunyuan/v11", &t), MMC_ERR_NOT_FOUND);
        CHECK(strstr(mmc_last_error(), "vocab.txt") != NULL);
        return;
    }
    /* malformed tokenizer.json files name the key */
    char tmp[] = "/tmp/mmc_hytok_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    const char *src = "tests/fixtures/hunyuan/tokenizer/tokenizer.json";
    struct { const char *sed, *needle; mmc_status code; } bad[] = {
        {"s/\"WordPiece\", \"unk_token\"/\"BPE\", \"unk_token\"/; s/\"type\": \"WordPiece\",$/\"type\": \"BPE\",/",
         "model.type", MMC_ERR_UNSUPPORTED},
        {"s/\"BertNormalizer\"/\"NFC\"/", "normalizer.type", MMC_ERR_UNSUPPORTED},
        {"s/\"BertPreTokenizer\"/\"Whitespace\"/", "pre_tokenizer.type", MMC_ERR_UNSUPPORTED},
        {"s/\"unk_token\": \"\\[UNK\\]\"/\"unk_token\": \"<unk>\"/", "unk_token", MMC_ERR_FORMAT},
        {"s/\"\\[CLS\\]\": 2/\"\\[CLS\\]\": -2/", "model.vocab", MMC_ERR_FORMAT},
        {"100,$d", "not valid JSON", MMC_ERR_FORMAT},   /* truncated */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[768];
        snprintf(cmd, sizeof cmd, "sed '%s' %s > %s/tokenizer.json", bad[i].sed, src, tmp);
        MMC_CHECK(system(cmd) == 0, "sed");
        CHECK_ERR(mmc_bert_tokenizer_load(tmp, &t), bad[i].code);
        CHECKF(strstr(mmc_last_error(), bad[i].needle) != NULL, "'%s' not in: %s", bad[i].needle, mmc_last_error());
        mmc_bert_tokenizer_free(t);
        t = NULL;
    }
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "rm");
}

/* HunyuanDiTPipeline (tests/fixtures/hunyuan/pipe) from injected latents and the scheduler's recorded
 * noise draws, use_resolution_binning=False at 64 x 48: (a) two prompts (Chinese and English) with
 * negative prompts "" and "red", guidance 5, 3 steps, as latents and as images; (b) one prompt without
 * guidance, 2 steps. Also the prompt encodings of both encoders with their masks. */
static void check_pipeline(void) {
    mmc_hunyuan_pipeline *p = NULL;
    CHECK_OK(mmc_hunyuan_pipeline_open("tests/fixtures/hunyuan/pipe", &p));
    if (!p) return;
    mmc_st *exp = fixture_open("hunyuan/pipe/expected.safetensors");
    if (!exp) { mmc_hunyuan_pipeline_free(p); return; }
    mmc_ctx *ctx = mmc_ctx_new();
    const char *prompts[2] = {"\u4e00\u4e2a\u53ef\u7231\u7684\u5c0f\u732b\u5750\u5728\u7ea2\u8272\u6c99\u53d1\u4e0a",
                              "a photo of the cute cat"};
    const char *negs[2] = {"", "red"};
    mmc_hunyuan_cond cond, neg;
    CHECK_OK(mmc_hunyuan_encode_prompt(ctx, p, prompts, 2, &cond));
    CHECK_OK(mmc_hunyuan_encode_prompt(ctx, p, negs, 2, &neg));
    struct { const char *name; mmc_tensor *got; mmc_dtype dt; } enc[] = {
        {"bert_embeds", cond.embeds, MMC_F32}, {"bert_neg", neg.embeds, MMC_F32}, {"bert_mask", cond.mask, MMC_I32},
        {"t5_embeds", cond.embeds_t5, MMC_F32}, {"t5_neg", neg.embeds_t5, MMC_F32}, {"t5_mask", cond.mask_t5, MMC_I32},
        {"t5_neg_mask", neg.mask_t5, MMC_I32}};
    for (size_t i = 0; i < sizeof enc / sizeof enc[0]; i++) {
        mmc_tensor *want = fixture_tensor(exp, enc[i].name, enc[i].dt);
        if (!enc[i].got) { CHECK(enc[i].got != NULL); mmc_tensor_free(want); continue; }
        CHECK(mmc_same_shape(enc[i].got, want));
        if (enc[i].dt == MMC_I32) CHECKF(!memcmp(enc[i].got->data, want->data, mmc_nbytes(want)), "%s", enc[i].name);
        else {
            CHECK_CLOSE(enc[i].got, want, ENC_TOL, 0, enc[i].name);
            printf("pipe: %s max|diff| %.2e\n", enc[i].name, max_abs_diff(enc[i].got, want));
        }
        mmc_tensor_free(want);
    }
    /* (a) guidance 5, 3 steps */
    mmc_tensor *lat = fixture_tensor(exp, "latents_a", MMC_F32), *noise = fixture_tensor(exp, "noise_a", MMC_F32);
    mmc_tensor *want_lat = fixture_tensor(exp, "out_a_latent", MMC_F32);
    mmc_tensor *want_img = fixture_tensor(exp, "out_a_image", MMC_F32);
    mmc_hunyuan_opts o = {.height = 64, .width = 48, .steps = 3, .guidance = 5.0, .step_noise = noise->data};
    CHECK_OK(mmc_hunyuan_sample(ctx, p, &cond, &neg, &o, lat));
    CHECK_CLOSE(lat, want_lat, PIPE_TOL, 0, "pipeline (a) latents");
    printf("pipe (a): latents max|diff| %.2e (max|x| %.2f)\n", max_abs_diff(lat, want_lat), max_abs(want_lat));
    mmc_tensor *img = NULL;
    CHECK_OK(mmc_hunyuan_decode(ctx, p, lat, &img));
    if (img) {
        CHECK(mmc_same_shape(img, want_img));
        CHECK_CLOSE(img, want_img, PIPE_TOL, 0, "pipeline (a) image");
        printf("pipe (a): image max|diff| %.2e\n", max_abs_diff(img, want_img));
    }
    /* (b) no guidance, 2 steps */
    mmc_tensor *lat_b = fixture_tensor(exp, "latents_b", MMC_F32), *noise_b = fixture_tensor(exp, "noise_b", MMC_F32);
    mmc_tensor *want_b = fixture_tensor(exp, "out_b_image", MMC_F32);
    mmc_hunyuan_cond cb;
    CHECK_OK(mmc_hunyuan_encode_prompt(ctx, p, prompts + 1, 1, &cb));
    o.steps = 2, o.guidance = 1.0, o.step_noise = noise_b->data;
    CHECK_OK(mmc_hunyuan_sample(ctx, p, &cb, NULL, &o, lat_b));
    CHECK_OK(mmc_hunyuan_decode(ctx, p, lat_b, &img));
    if (img) {
        CHECK_CLOSE(img, want_b, PIPE_TOL, 0, "pipeline (b) image");
        printf("pipe (b): image max|diff| %.2e\n", max_abs_diff(img, want_b));
    }
    /* (c) guidance 4 with guidance_rescale 0.7, 2 steps, negative prompts "" */
    {
        mmc_tensor *lat_c = fixture_tensor(exp, "latents_a", MMC_F32);
        mmc_tensor *noise_c = fixture_tensor(exp, "noise_c", MMC_F32);
        mmc_tensor *want_c = fixture_tensor(exp, "out_c_latent", MMC_F32);
        const char *empty[2] = {"", ""};
        mmc_hunyuan_cond nc;
        CHECK_OK(mmc_hunyuan_encode_prompt(ctx, p, empty, 2, &nc));
        mmc_hunyuan_opts oc = {.height = 64, .width = 48, .steps = 2, .guidance = 4.0, .guidance_rescale = 0.7,
                               .step_noise = noise_c->data};
        CHECK_OK(mmc_hunyuan_sample(ctx, p, &cond, &nc, &oc, lat_c));
        CHECK_CLOSE(lat_c, want_c, PIPE_TOL, 0, "pipeline (c) guidance_rescale latents");
        printf("pipe (c): guidance_rescale 0.7 latents max|diff| %.2e\n", max_abs_diff(lat_c, want_c));
        mmc_tensor_free(lat_c), mmc_tensor_free(noise_c), mmc_tensor_free(want_c);
    }
    /* errors: a size that does not match the latents, guidance without the negative encoding */
    o.height = 80;
    CHECK_ERR(mmc_hunyuan_sample(ctx, p, &cb, NULL, &o, lat_b), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "needs latents") != NULL);
    o.height = 64, o.guidance = 3.0;
    CHECK_ERR(mmc_hunyuan_sample(ctx, p, &cb, NULL, &o, lat_b), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "negative") != NULL);
    /* resolution binning as map_to_standard_shapes */
    int hh = 64, ww = 48;
    mmc_hunyuan_bin_resolution(&hh, &ww);
    CHECK(hh == 1024 && ww == 768);
    hh = 720, ww = 1280;
    mmc_hunyuan_bin_resolution(&hh, &ww);
    CHECK(hh == 768 && ww == 1280);
    hh = 1152, ww = 864;   /* 3:4 trained shape: kept */
    mmc_hunyuan_bin_resolution(&hh, &ww);
    CHECK(hh == 1152 && ww == 864);
    mmc_tensor *ts[] = {lat, noise, want_lat, want_img, lat_b, noise_b, want_b};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) mmc_tensor_free(ts[i]);
    mmc_ctx_free(ctx);
    mmc_st_close(exp);
    mmc_hunyuan_pipeline_free(p);
    char tmp[] = "/tmp/mmc_hypipe_XXXXXX", cmd[768];
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    /* (d) DDPMScheduler with trailing spacing (diffusers' save_config): previous_timestep is the next entry of
     * the schedule (999 -> 666 -> 333 -> -1), 3 steps without guidance */
    snprintf(cmd, sizeof cmd, "cp -r tests/fixtures/hunyuan/pipe/. %s/ && cp tests/fixtures/hunyuan/scheduler_trailing/"
             "scheduler_config.json %s/scheduler/", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "cp");
    CHECK_OK(mmc_hunyuan_pipeline_open(tmp, &p));
    if (p) {
        mmc_ctx *c2 = mmc_ctx_new();
        mmc_st *e2 = fixture_open("hunyuan/pipe/expected.safetensors");
        mmc_tensor *lat_d = fixture_tensor(e2, "latents_b", MMC_F32), *noise_d = fixture_tensor(e2, "noise_d", MMC_F32);
        mmc_tensor *want_d = fixture_tensor(e2, "out_d_latent", MMC_F32);
        mmc_hunyuan_cond cd;
        CHECK_OK(mmc_hunyuan_encode_prompt(c2, p, prompts + 1, 1, &cd));
        mmc_hunyuan_opts od = {.height = 64, .width = 48, .steps = 3, .guidance = 1.0, .step_noise = noise_d->data};
        CHECK_OK(mmc_hunyuan_sample(c2, p, &cd, NULL, &od, lat_d));
        CHECK_CLOSE(lat_d, want_d, PIPE_TOL, 0, "pipeline (d) trailing spacing latents");
        printf("pipe (d): trailing spacing latents max|diff| %.2e\n", max_abs_diff(lat_d, want_d));
        mmc_tensor_free(lat_d), mmc_tensor_free(noise_d), mmc_tensor_free(want_d);
        mmc_st_close(e2);
        mmc_ctx_free(c2);
        mmc_hunyuan_pipeline_free(p);
        p = NULL;
    }
    /* a scheduler the pipeline does not run */
    snprintf(cmd, sizeof cmd, "cp tests/fixtures/hunyuan/pipe/scheduler/scheduler_config.json %s/scheduler/ && "
             "sed -i 's/\"fixed_small\"/\"learned_range\"/' %s/scheduler/scheduler_config.json", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "cp");
    CHECK_ERR(mmc_hunyuan_pipeline_open(tmp, &p), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "variance_type") != NULL);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"learned_range\"/\"fixed_small\"/; s/\"trained_betas\": null/"
             "\"trained_betas\": [0.1, 0.2]/' %s/scheduler/scheduler_config.json", tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_hunyuan_pipeline_open(tmp, &p), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "trained_betas") != NULL);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"trained_betas\": \\[0.1, 0.2\\]/\"trained_betas\": null/; "
             "s/\"fixed_small\"/\"learned_range\"/' %s/scheduler/scheduler_config.json", tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    snprintf(cmd, sizeof cmd, "sed -i 's/\"learned_range\"/\"fixed_small\"/; s/\"v_prediction\"/\"x0\"/' "
             "%s/scheduler/scheduler_config.json", tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_hunyuan_pipeline_open(tmp, &p), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "prediction_type") != NULL);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"x0\"/\"v_prediction\"/' %s/scheduler/scheduler_config.json && "
             "sed -i 's/\"text_len\": 77/\"text_len\": 76/' %s/transformer/config.json", tmp, tmp);
    MMC_CHECK(system(cmd) == 0, "sed");
    CHECK_ERR(mmc_hunyuan_pipeline_open(tmp, &p), MMC_ERR_FORMAT);
    CHECK(strstr(mmc_last_error(), "text_embedding_padding") != NULL || strstr(mmc_last_error(), "text_len") != NULL);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "rm");
}

/* DDPM training against tools/ref/gen_hunyuan_train.py's loop (diffusers + PEFT): lora (v1.1, 20 steps,
 * v_prediction, min-SNR 5, offset noise; the adapter read from PEFT's save_pretrained) or full (v1.2, 6
 * steps, epsilon). Every step's loss and clipped grad norm and the final weights within TRAIN_TOL relative.
 * recompute: the same run with each block checkpointed gives the same losses (*losses: when given, the
 * losses of this run are stored there / compared with it). */
static void check_train(bool lora, bool recompute, double *losses) {
    const char *dir = lora ? "tests/fixtures/hunyuan_train/lora" : "tests/fixtures/hunyuan_train/full";
    mmc_hunyuan_dit *m = NULL;
    CHECK_OK(mmc_hunyuan_dit_load(lora ? "tests/fixtures/hunyuan/v11" : "tests/fixtures/hunyuan/v12", !lora, &m));
    char p[256];
    snprintf(p, sizeof p, "%s/expected.safetensors", dir + strlen("tests/fixtures/"));
    mmc_st *exp = fixture_open(p);
    mmc_nsched sch = {0};
    CHECK_OK(mmc_hunyuan_ddpm_load("tests/fixtures/hunyuan_train/scheduler", &sch));
    if (!m || !exp || !sch.alphas_cumprod) {
        mmc_hunyuan_dit_free(m), mmc_st_close(exp), mmc_nsched_free(&sch);
        return;
    }
    mmc_hunyuan_dit_set_recompute(m, recompute);
    mmc_module_list ml = {0};
    mmc_lora_set *s = NULL;
    mmc_tensor **params = NULL;
    const char *const *names = NULL;
    int n_params = 0;
    if (lora) {
        CHECK_OK(mmc_hunyuan_dit_linears(m, &ml));
        snprintf(p, sizeof p, "%s/initial", dir);
        CHECK_OK(mmc_lora_load(p, &ml, true, &s));
        if (!s) { mmc_module_list_free(&ml), mmc_hunyuan_dit_free(m), mmc_st_close(exp), mmc_nsched_free(&sch); return; }
        params = s->params, n_params = s->n_params;
    } else n_params = mmc_hunyuan_dit_param_list(m, &params, &names);
    mmc_adamw opt;
    mmc_adamw_opts o = {.lr = lora ? 1e-3 : 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 1e-2};
    CHECK_OK(mmc_adamw_init(&opt, &o, params, n_params));
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *mask = fixture_tensor(exp, "mask", MMC_I32), *mask5 = fixture_tensor(exp, "mask_t5", MMC_I32);
    mmc_ddpm_batch b = {.prompt_embeds = fixture_tensor(exp, "encoder", MMC_F32),
                        .text_embeds = fixture_tensor(exp, "encoder_t5", MMC_F32), .mask = mask->data,
                        .mask_t5 = mask5->data, .prediction_type = lora ? MMC_PRED_V : MMC_PRED_EPSILON,
                        .snr_gamma = lora ? 5.0 : 0.0};
    double worst_loss = 0, worst_norm = 0;
    const int steps = lora ? 20 : 6;
    for (int step = 0; step < steps; step++) {
        char k[64];
        mmc_tensor *t[6] = {0};
        static const char *keys[6] = {"x0", "noise", "timesteps", "loss", "grad_norm", "meta"};
        for (int i = 0; i < 6; i++) {
            snprintf(k, sizeof k, "%s_%d", keys[i], step);
            t[i] = fixture_tensor(exp, k, MMC_F32);
        }
        int64_t ts[2];
        for (int i = 0; i < 2; i++) ts[i] = (int64_t)((float *)t[2]->data)[i];
        b.latents = t[0], b.noise = t[1], b.timesteps = ts, b.time_ids = t[5]->data, b.n_time_ids = 6;
        mmc_tensor *loss = NULL;
        CHECK_OK(mmc_hunyuan_ddpm_loss(ctx, m, &sch, &b, &loss));
        if (!loss) break;
        static int tape_plain;   /* the tape of a step without recompute: checkpointed blocks leave one node each */
        if (step == 0 && losses && !recompute) tape_plain = mmc_tape_len(ctx);
        if (step == 0 && losses && recompute)
            CHECKF(mmc_tape_len(ctx) < tape_plain / 2, "recompute: %d tape nodes, %d without", mmc_tape_len(ctx),
                   tape_plain);
        const double lv = step_check(ctx, loss, params, n_params, &opt, o.lr, ((float *)t[3]->data)[0],
                                     ((float *)t[4]->data)[0], TRAIN_TOL, lora ? "lora" : "full", step, &worst_loss,
                                     &worst_norm);
        if (losses && recompute) {   /* checkpointed blocks recompute the same numbers */
            CHECKF(fabs(lv - losses[step]) <= RECOMPUTE_TOL * fabs(losses[step]), "recompute step %d: loss %.9g vs %.9g "
                   "without", step, lv, losses[step]);
        } else if (losses) losses[step] = lv;
        for (int i = 0; i < 6; i++) mmc_tensor_free(t[i]);
    }
    double worst_w = 0;
    snprintf(p, sizeof p, "%s/%s", dir + strlen("tests/fixtures/"),
             lora ? "final/adapter_model.safetensors" : "final.safetensors");
    mmc_st *fin = fixture_open(p);
    int n_cmp = 0;
    if (lora) {
        CHECKF(s->n == 60, "lora: %d adapted modules, want 60 (6 blocks x 2 attentions x 4 + 2 ff)", s->n);
        worst_w = lora_max_rel_diff(fin, "base_model.model.", s);   /* every tensor present, or it stops */
        if (fin) n_cmp = 2 * s->n;
    } else {
        for (int i = 0; fin && i < n_params; i++) {
            mmc_tensor *want = fixture_tensor(fin, names[i], MMC_F32);
            /* the pooler's key bias shifts every logit of its softmax alike: its true gradient is 0, both sides
             * move it by rounding noise that AdamW scales to ~lr per step; it stays within 2 lr steps of the
             * reference (absolute) */
            const bool kb = !strcmp(names[i], "time_extra_emb.pooler.k_proj.bias");
            const double r = !want ? 0 : kb ? max_abs_diff(params[i], want) / (2 * o.lr * steps) * TRAIN_TOL
                                            : max_abs_diff(params[i], want) / fmax(max_abs(want), 1e-6);
            if (want) worst_w = fmax(worst_w, r), n_cmp++;
            mmc_tensor_free(want);
        }
    }
    mmc_st_close(fin);
    CHECKF(n_cmp == (lora ? 2 * s->n : n_params), "%s: %d of the trained tensors in the reference's final weights",
           lora ? "lora" : "full", n_cmp);
    CHECKF(worst_w < TRAIN_TOL, "%s: final weights: max relative difference %.2e", lora ? "lora" : "full", worst_w);
    printf("train_%s%s: %d steps, %d tensors trained, loss rel diff <= %.2e, grad norm <= %.2e, final weights <= "
           "%.2e%s\n", lora ? "lora" : "full", recompute ? " (recompute)" : "", steps, n_params, worst_loss,
           worst_norm, worst_w, recompute ? ", losses within 1e-6 of the run without" : "");
    mmc_tensor_free(b.prompt_embeds), mmc_tensor_free(b.text_embeds), mmc_tensor_free(mask), mmc_tensor_free(mask5);
    mmc_adamw_free(&opt);
    mmc_ctx_free(ctx);
    mmc_lora_free(s);
    mmc_module_list_free(&ml);
    mmc_nsched_free(&sch);
    mmc_hunyuan_dit_free(m);
    mmc_st_close(exp);
}

/* An adapter saved for the 6-block model names modules the 4-block one lacks: an error naming one of them. */
static void check_lora_errors(void) {
    mmc_hunyuan_dit *m = NULL;
    CHECK_OK(mmc_hunyuan_dit_load("tests/fixtures/hunyuan/v12", false, &m));
    if (!m) return;
    mmc_module_list ml = {0};
    CHECK_OK(mmc_hunyuan_dit_linears(m, &ml));
    mmc_lora_set *s = NULL;
    CHECK(mmc_lora_load("tests/fixtures/hunyuan_train/lora/initial", &ml, false, &s) != MMC_OK && !s);
    CHECKF(strstr(mmc_last_error(), "blocks.5.") != NULL, "error names the missing module: %s", mmc_last_error());
    mmc_clear_error();
    mmc_module_list_free(&ml);
    mmc_hunyuan_dit_free(m);
}

/* `mmc merge` on the tiny HunyuanDiTPipeline folder (mmc_diffusers_merge_lora, src/diffusion/lora_merge.c) against
 * PEFT's merge_and_unload (tools/ref/gen_hunyuan_merge.py, tests/fixtures/hunyuan_merge: an rsLoRA adapter on 45
 * modules, lora_B random): every merged weight within 1e-6 of PEFT's (+ 1e-6 relative), every other tensor of the
 * transformer byte-equal to the base's, every other file of the folder copied byte for byte; the merged folder
 * loads (mmc_hunyuan_pipeline_open, the transformer); merging again replaces it; merging into the transformer
 * folder alone gives that folder with the same weights; errors (an adapter for another model, its shapes named;
 * a non-HunyuanDiT pipeline or model folder; an output inside the pipeline folder; not an adapter) leave the
 * previous output as it was and no temporary folder. Generating with the merged folder: test_hunyuan_cli. */
static bool same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    bool eq = mmc_read_file(a, &x, &nx) == MMC_OK && mmc_read_file(b, &y, &ny) == MMC_OK && nx == ny &&
              memcmp(x, y, nx) == 0;
    free(x), free(y);
    mmc_clear_error();
    return eq;
}

static void check_merge(void) {
    const char *P = "tests/fixtures/hunyuan/pipe", *AD = "tests/fixtures/hunyuan_merge/adapter";
    char tmp[] = "/tmp/mmc_hymerge_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    char out[256], path[512], path2[512];
    snprintf(out, sizeof out, "%s/merged", tmp);
    int n = 0;
    CHECK_OK(mmc_diffusers_merge_lora(P, AD, out, &n));
    CHECKF(n == 45, "merged %d weights, want 45", n);
    mmc_st *exp = fixture_open("hunyuan_merge/expected.safetensors"), *got = NULL, *base = NULL;
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", out);
    CHECK_OK(mmc_st_open(path, &got));
    CHECK_OK(mmc_st_open("tests/fixtures/hunyuan/pipe/transformer/diffusion_pytorch_model.safetensors", &base));
    double worst = 0;
    int n_merged = 0, n_same = 0;
    for (int i = 0; got && base && exp && i < mmc_st_count(base); i++) {
        const mmc_st_entry *b = mmc_st_at(base, i), *g = mmc_st_find(got, b->name);
        CHECKF(g != NULL, "merged transformer lacks %s", b->name);
        if (!g) continue;
        if (mmc_st_find(exp, b->name)) {   /* merged: against PEFT's merge_and_unload */
            mmc_tensor *w = fixture_tensor(exp, b->name, MMC_F32), *m = fixture_tensor(got, b->name, MMC_F32);
            const double d = max_abs_diff(m, w);
            CHECKF(d <= 1e-6 + 1e-6 * max_abs(w), "%s: max difference %.3g from PEFT's merge", b->name, d);
            worst = fmax(worst, d), n_merged++;
            mmc_tensor_free(w), mmc_tensor_free(m);
        } else {                            /* untouched: the base's bytes */
            size_t nb = mmc_dtype_size(b->dtype);
            for (int k = 0; k < b->ndim; k++) nb *= (size_t)b->shape[k];
            CHECKF(g->dtype == b->dtype && g->ndim == b->ndim && memcmp(g->data, b->data, nb) == 0, "%s changed", b->name);
            n_same++;
        }
    }
    CHECKF(n_merged == 45 && got && mmc_st_count(got) == n_merged + n_same, "%d merged, %d unchanged of %d", n_merged,
           n_same, got ? mmc_st_count(got) : 0);
    mmc_st_close(got), mmc_st_close(base), mmc_st_close(exp);
    static const char *const files[] = {"model_index.json", "transformer/config.json", "scheduler/scheduler_config.json",
                                        "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
                                        "text_encoder/model.safetensors", "text_encoder_2/model.safetensors",
                                        "tokenizer/tokenizer.json", "tokenizer_2/tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", P, files[i]);
        snprintf(path2, sizeof path2, "%s/%s", out, files[i]);
        CHECKF(same_file(path, path2), "%s not copied as it is", files[i]);
    }
    mmc_hunyuan_pipeline *pp = NULL;   /* the merged folder loads */
    CHECK_OK(mmc_hunyuan_pipeline_open(out, &pp));
    mmc_hunyuan_pipeline_free(pp);
    mmc_hunyuan_dit *m = NULL;
    snprintf(path, sizeof path, "%s/transformer", out);
    CHECK_OK(mmc_hunyuan_dit_load(path, false, &m));
    mmc_hunyuan_dit_free(m);
    CHECK_OK(mmc_diffusers_merge_lora(P, AD, out, NULL));   /* again: replaces it */
    /* the transformer folder itself: that folder merged, the same weights */
    char tr_out[300];
    snprintf(tr_out, sizeof tr_out, "%s/merged_tr", tmp);
    CHECK_OK(mmc_diffusers_merge_lora("tests/fixtures/hunyuan/pipe/transformer", AD, tr_out, NULL));
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", out);
    snprintf(path2, sizeof path2, "%s/diffusion_pytorch_model.safetensors", tr_out);
    CHECK(same_file(path, path2));
    snprintf(path2, sizeof path2, "%s/config.json", tr_out);
    CHECK(same_file("tests/fixtures/hunyuan/pipe/transformer/config.json", path2));
    CHECK_ERR(mmc_diffusers_merge_lora("tests/fixtures/hunyuan/pipe/vae", AD, tr_out, NULL), MMC_ERR_UNSUPPORTED);
    /* errors leave the previous output whole and no temporary folder */
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", out);
    CHECK(mmc_diffusers_merge_lora(P, "tests/fixtures/hunyuan_train/lora/final", out, NULL) != MMC_OK);
    CHECKF(strstr(mmc_last_error(), "mismatched shapes") != NULL, "the 6-block model's adapter: %s", mmc_last_error());
    CHECK_ERR(mmc_diffusers_merge_lora("tests/fixtures/wan/pipe", AD, out, NULL), MMC_ERR_UNSUPPORTED);
    CHECK(strstr(mmc_last_error(), "HunyuanDiTPipeline") != NULL);
    CHECK_ERR(mmc_diffusers_merge_lora(P, P, out, NULL), MMC_ERR_NOT_FOUND);
    snprintf(path2, sizeof path2, "%s/transformer/merged", P);
    CHECK_ERR(mmc_diffusers_merge_lora(P, AD, path2, NULL), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "inside the pipeline folder") != NULL);
    mmc_clear_error();
    CHECKF(access(path2, F_OK) != 0, "%s was written", path2);
    mmc_hunyuan_dit *m2 = NULL;
    snprintf(path, sizeof path, "%s/transformer", out);
    CHECK_OK(mmc_hunyuan_dit_load(path, false, &m2));
    mmc_hunyuan_dit_free(m2);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -c tmp", tmp);
    FILE *f = popen(cmd, "r");
    int ntmp = -1;
    if (f) { if (fscanf(f, "%d", &ntmp) != 1) ntmp = -1; pclose(f); }
    CHECKF(ntmp == 0, "%d temporary folders left in %s", ntmp, tmp);
    printf("merge: 45 weights within %.2e of PEFT's merge_and_unload, %d tensors and the other files unchanged\n",
           worst, n_same);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    MMC_CHECK(system(cmd) == 0, "rm");
}

int main(int argc, char **argv) {
    if (access("tests/fixtures/hunyuan/v11/expected.safetensors", R_OK) != 0) {
        fprintf(stderr, "test_hunyuan: fixtures absent (tools/ref/gen_hunyuan.py); skipping\n");
        return TEST_SKIP_CODE;
    }
    if (test_part(argc, argv, "transformer")) {
        check_model("v11");
        check_model("v12");
        check_model("v11_bf16");
    }
    if (test_part(argc, argv, "grad")) check_grad();
    if (test_part(argc, argv, "errors")) check_errors();
    if (test_part(argc, argv, "bert")) check_bert();
    if (test_part(argc, argv, "tokenizer")) {
        check_bert_tokenizer("tests/fixtures/hunyuan/tokenizer");
        check_bert_tokenizer("tests/fixtures/hunyuan/tokenizer_vocab");   /* vocab.txt + tokenizer_config.json */
    }
    if (test_part(argc, argv, "pipeline")) check_pipeline();
    if (test_part(argc, argv, "train")) {
        double losses[20];
        check_train(true, false, losses);
        check_train(true, true, losses);   /* model.recompute: full */
        check_train(false, false, NULL);
        check_lora_errors();
    }
    if (test_part(argc, argv, "merge")) check_merge();
    return test_done("test_hunyuan");
}
