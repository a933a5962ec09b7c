/* bench_clip.c — CLIP retrieval embeddings (include/mmc_embed.h; f32) against transformers'
 * CLIPModel under torch.inference_mode (bench/peer_clip.py prints the same case names), on a
 * CLIP ViT-B/32-shaped random checkpoint (vision 12 layers, hidden 768, 224 px in 32 px patches;
 * text 12 layers, hidden 512, vocabulary 49408; projection 512), higher is better:
 *   clip_b32_image_embed_16: images/s — 16 preprocessed images [16, 3, 224, 224] through the
 *       vision tower, post_layernorm, visual_projection and the L2 normalisation
 *       (get_image_features + normalisation on the peer's side);
 *   clip_b32_text_embed_16: texts/s — 16 captions of 6-14 words, tokenised and embedded as one padded,
 *       masked batch (the peer:
 *       its fast tokenizer with padding=True, then get_text_features + normalisation).
 * The checkpoint is written to a temp folder with CLIPModel's tensor names; its tokenizer is the
 * 600-token fixture tokenizer (tests/fixtures/clip_model/model; token ids stay below 600, the
 * embedding table has 49408 rows as ViT-B/32's). */
#include "bench_util.h"
#include "mmc_embed.h"
#include "mmc_io.h"

#include <unistd.h>

enum { CV = 768, FV = 3072, LV = 12, S = 224, P = 32, CT = 512, FT = 2048, LT = 12, V = 49408, D = 512, N = 16 };

static mmc_stw *g_w;
static mmc_tensor *g_ts[1024];
static int g_n;

static void add(const char *name, int ndim, const int64_t *shape, float std, float mean) {
    mmc_tensor *t = bench_rand_param(3000 + (uint64_t)g_n, ndim, shape, std);
    if (mean != 0) for (int64_t k = 0; k < mmc_numel(t); k++) ((float *)t->data)[k] += mean;
    MMC_CHECK(mmc_stw_add(g_w, name, t) == MMC_OK, "%s", mmc_last_error());
    g_ts[g_n++] = t;
}

static void add_ln(const char *p, const char *ln, int64_t C) {
    char nm[200];
    snprintf(nm, sizeof nm, "%s%s.weight", p, ln), add(nm, 1, MMC_SHAPE(C), 0.02f, 1);
    snprintf(nm, sizeof nm, "%s%s.bias", p, ln), add(nm, 1, MMC_SHAPE(C), 0.02f, 0);
}

static void add_layers(const char *tower, int L, int64_t C, int64_t F) {
    static const char *proj[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    char p[160], nm[200];
    for (int i = 0; i < L; i++) {
        snprintf(p, sizeof p, "%s.encoder.layers.%d.", tower, i);
        for (int k = 0; k < 4; k++) {
            snprintf(nm, sizeof nm, "%sself_attn.%s.weight", p, proj[k]), add(nm, 2, MMC_SHAPE(C, C), 0.02f, 0);
            snprintf(nm, sizeof nm, "%sself_attn.%s.bias", p, proj[k]), add(nm, 1, MMC_SHAPE(C), 0.02f, 0);
        }
        add_ln(p, "layer_norm1", C);
        add_ln(p, "layer_norm2", C);
        snprintf(nm, sizeof nm, "%smlp.fc1.weight", p), add(nm, 2, MMC_SHAPE(F, C), 0.02f, 0);
        snprintf(nm, sizeof nm, "%smlp.fc1.bias", p), add(nm, 1, MMC_SHAPE(F), 0.02f, 0);
        snprintf(nm, sizeof nm, "%smlp.fc2.weight", p), add(nm, 2, MMC_SHAPE(C, F), 0.02f, 0);
        snprintf(nm, sizeof nm, "%smlp.fc2.bias", p), add(nm, 1, MMC_SHAPE(C), 0.02f, 0);
    }
}

static void copy_file(const char *from, const char *dir, const char *name) {
    char *data = NULL, to[512];
    size_t n = 0;
    MMC_CHECK(mmc_read_file(from, &data, &n) == MMC_OK, "%s", mmc_last_error());
    snprintf(to, sizeof to, "%s/%s", dir, name);
    MMC_CHECK(mmc_write_file_atomic(to, data, n) == MMC_OK, "%s", mmc_last_error());
    free(data);
}

static void write_model(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    MMC_CHECK(f, "%s", p);
    fprintf(f, "{\"model_type\": \"clip\", \"architectures\": [\"CLIPModel\"], \"projection_dim\": %d,\n"
               " \"text_config\": {\"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d, "
               "\"num_hidden_layers\": %d, \"num_attention_heads\": 8, \"max_position_embeddings\": 77, "
               "\"eos_token_id\": 1, \"hidden_act\": \"quick_gelu\"},\n"
               " \"vision_config\": {\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
               "\"num_attention_heads\": 12, \"image_size\": %d, \"patch_size\": %d, \"hidden_act\": \"quick_gelu\"}}\n",
            D, V, CT, FT, LT, CV, FV, LV, S, P);
    fclose(f);
    snprintf(p, sizeof p, "%s/preprocessor_config.json", dir);
    f = fopen(p, "w");
    MMC_CHECK(f, "%s", p);
    fprintf(f, "{\"image_processor_type\": \"CLIPImageProcessor\", \"size\": {\"shortest_edge\": %d}, "
               "\"crop_size\": {\"height\": %d, \"width\": %d}}\n", S, S, S);
    fclose(f);
    copy_file("tests/fixtures/clip_model/model/tokenizer.json", dir, "tokenizer.json");
    copy_file("tests/fixtures/clip_model/model/tokenizer_config.json", dir, "tokenizer_config.json");
    g_w = mmc_stw_new();
    add("text_model.embeddings.token_embedding.weight", 2, MMC_SHAPE(V, CT), 0.02f, 0);
    add("text_model.embeddings.position_embedding.weight", 2, MMC_SHAPE(77, CT), 0.02f, 0);
    add_layers("text_model", LT, CT, FT);
    add_ln("text_model.", "final_layer_norm", CT);
    add("vision_model.embeddings.class_embedding", 1, MMC_SHAPE(CV), 0.02f, 0);
    add("vision_model.embeddings.patch_embedding.weight", 4, MMC_SHAPE(CV, 3, P, P), 0.02f, 0);
    add("vision_model.embeddings.position_embedding.weight", 2, MMC_SHAPE(1 + (S / P) * (S / P), CV), 0.02f, 0);
    add_ln("vision_model.", "pre_layrnorm", CV);
    add_layers("vision_model", LV, CV, FV);
    add_ln("vision_model.", "post_layernorm", CV);
    add("visual_projection.weight", 2, MMC_SHAPE(D, CV), 0.02f, 0);
    add("text_projection.weight", 2, MMC_SHAPE(D, CT), 0.02f, 0);
    add("logit_scale", 0, NULL, 0, 2.6592f);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    MMC_CHECK(mmc_stw_write(g_w, p) == MMC_OK, "%s", mmc_last_error());
    mmc_stw_free(g_w);
    for (int i = 0; i < g_n; i++) mmc_tensor_free(g_ts[i]);
}

/* 16 captions of 6-14 words over the fixture tokenizer's corpus words (as peer_clip.py) */
static const char *const CAPTIONS[N] = {
    "a red circle on the left of a blue square", "two green triangles", "a photo of a cat sitting on a mat",
    "three small yellow stars above a large purple circle", "an orange square", "a dog runs in the park",
    "the blue circle is to the right of the red square", "one big grey triangle in the middle of the picture",
    "a cup of coffee on a wooden table", "children play football on the beach at sunset",
    "a white boat on a calm lake", "four red squares in a row", "a green circle below a yellow triangle",
    "a man rides a bicycle down the street", "a bowl of fruit", "small blue stars on a black background"};

typedef struct { mmc_dual_encoder *m; mmc_tensor *px; float *out; } ccase;

static void run_images(void *arg) {
    ccase *c = arg;
    MMC_CHECK(mmc_dual_encoder_embed_pixels(c->m, c->px, c->out) == MMC_OK, "%s", mmc_last_error());
}

static void run_texts(void *arg) {
    ccase *c = arg;
    MMC_CHECK(mmc_dual_encoder_embed_texts(c->m, CAPTIONS, N, c->out) == MMC_OK, "%s", mmc_last_error());
}

int main(void) {
    char tmp[] = "/tmp/mmc_bench_clip_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    write_model(tmp);
    ccase c = {0};
    MMC_CHECK(mmc_dual_encoder_load(tmp, &c.m) == MMC_OK, "%s", mmc_last_error());
    c.px = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(N, 3, S, S));
    float *px = c.px->data;
    for (int64_t i = 0; i < mmc_numel(c.px); i++) px[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    c.out = malloc((size_t)N * D * sizeof(float));
    bench_report("clip_b32_image_embed_16", N / bench_time(run_images, &c, 3.0, 3), "img/s", 1);
    bench_report("clip_b32_text_embed_16", N / bench_time(run_texts, &c, 3.0, 3), "texts/s", 1);
    free(c.out);
    mmc_tensor_free(c.px);
    mmc_dual_encoder_free(c.m);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "bench_clip: could not remove %s\n", tmp);
    return 0;
}
