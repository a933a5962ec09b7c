/* bench_text_encoders.c — text encoding for diffusion pipelines (mmc_clip_text_forward,
 * mmc_t5_encoder_forward, f32 weights, no mask as the pipelines call them) against
 * transformers' CLIPTextModel / T5EncoderModel under torch.inference_mode (bench/peer_text_encoders.py
 * prints the same case names), in ms per batch-1 prompt (lower is better):
 *   clip_l: CLIP ViT-L/14's text tower (SD 1.x / Flux text_encoder): 768 wide, 12 heads,
 *           12 layers, quick_gelu, 77 tokens (vocab cut to 1000: the lookup does not care);
 *   t5_large4: T5 v1.1-large-shaped blocks (1024, 16 heads of 64, gated-gelu 2816), 4 of them,
 *           256 tokens (Flux's T5-XXL is 4096 wide with 24 blocks: too big for a 2-core bench).
 * The random checkpoints are written to a temp folder as save_pretrained lays them out. */
#include "bench_util.h"
#include "mmc_encoders.h"

#include <unistd.h>

/* config.json + model.safetensors with N(0, 0.02) tensors of the given names / shapes */
typedef struct { const char *name; int ndim; int64_t shape[2]; } wspec;

static void write_folder(const char *dir, const char *config, const wspec *ws, int n) {
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    MMC_CHECK(f, "%s", p);
    fputs(config, f);
    fclose(f);
    mmc_stw *w = mmc_stw_new();
    mmc_tensor **ts = calloc((size_t)n, sizeof *ts);
    for (int i = 0; i < n; i++) {
        ts[i] = bench_rand_param(100 + (uint64_t)i, ws[i].ndim, ws[i].shape, 0.02f);
        if (ws[i].ndim == 1) for (int64_t k = 0; k < ws[i].shape[0]; k++) ((float *)ts[i]->data)[k] += 1.0f;
        MMC_CHECK(mmc_stw_add(w, ws[i].name, ts[i]) == MMC_OK, "%s", mmc_last_error());
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    MMC_CHECK(mmc_stw_write(w, p) == MMC_OK, "%s", mmc_last_error());
    mmc_stw_free(w);
    for (int i = 0; i < n; i++) mmc_tensor_free(ts[i]);
    free(ts);
}

typedef struct { mmc_ctx *ctx; mmc_clip_text *clip; mmc_t5_encoder *t5; mmc_tensor *ids; } ecase;

static void run(void *arg) {
    ecase *c = arg;
    mmc_ctx_reset(c->ctx);
    if (c->clip) {
        mmc_clip_text_out o;
        MMC_CHECK(mmc_clip_text_forward(c->ctx, c->clip, c->ids, NULL, &o) == MMC_OK, "%s", mmc_last_error());
    } else {
        mmc_tensor *last;
        MMC_CHECK(mmc_t5_encoder_forward(c->ctx, c->t5, c->ids, NULL, &last, NULL) == MMC_OK, "%s", mmc_last_error());
    }
}

static mmc_tensor *make_ids(int64_t T, int64_t vocab) {
    mmc_tensor *ids = mmc_tensor_new(MMC_I64, 2, MMC_SHAPE(1, T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)ids->data)[t] = (t * 7919 + 3) % vocab;
    return ids;
}

static void bench_clip(const char *tmp) {
    enum { C = 768, F = 3072, L = 12, V = 1000, P = 77 };
    wspec ws[4 + 16 * L];
    static char names[16 * L][96];
    int n = 0;
    ws[n++] = (wspec){"text_model.embeddings.token_embedding.weight", 2, {V, C}};
    ws[n++] = (wspec){"text_model.embeddings.position_embedding.weight", 2, {P, C}};
    ws[n++] = (wspec){"text_model.final_layer_norm.weight", 1, {C}};
    ws[n++] = (wspec){"text_model.final_layer_norm.bias", 1, {C}};
    static const struct { const char *n; int nd; int64_t a, b; } per[16] = {
        {"layer_norm1.weight", 1, C, 0}, {"layer_norm1.bias", 1, C, 0}, {"layer_norm2.weight", 1, C, 0},
        {"layer_norm2.bias", 1, C, 0}, {"self_attn.q_proj.weight", 2, C, C}, {"self_attn.q_proj.bias", 1, C, 0},
        {"self_attn.k_proj.weight", 2, C, C}, {"self_attn.k_proj.bias", 1, C, 0}, {"self_attn.v_proj.weight", 2, C, C},
        {"self_attn.v_proj.bias", 1, C, 0}, {"self_attn.out_proj.weight", 2, C, C}, {"self_attn.out_proj.bias", 1, C, 0},
        {"mlp.fc1.weight", 2, F, C}, {"mlp.fc1.bias", 1, F, 0}, {"mlp.fc2.weight", 2, C, F}, {"mlp.fc2.bias", 1, C, 0}};
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 16; k++) {
            char *nm = names[l * 16 + k];
            snprintf(nm, 96, "text_model.encoder.layers.%d.%s", l, per[k].n);
            ws[n++] = (wspec){nm, per[k].nd, {per[k].a, per[k].b}};
        }
    write_folder(tmp, "{\"architectures\": [\"CLIPTextModel\"], \"hidden_size\": 768, \"intermediate_size\": 3072, "
                      "\"num_hidden_layers\": 12, \"num_attention_heads\": 12, \"vocab_size\": 1000, "
                      "\"max_position_embeddings\": 77, \"hidden_act\": \"quick_gelu\", \"eos_token_id\": 2}",
                 ws, n);
    ecase c = {.ctx = mmc_ctx_new(), .ids = make_ids(P, V)};
    MMC_CHECK(mmc_clip_text_load(tmp, &c.clip) == MMC_OK, "%s", mmc_last_error());
    bench_report("text_encode_clip_l_77tok_ms", 1e3 * bench_time(run, &c, 2.0, 3), "ms", 0);
    mmc_clip_text_free(c.clip);
    mmc_tensor_free(c.ids);
    mmc_ctx_free(c.ctx);
}

static void bench_t5(const char *tmp) {
    enum { C = 1024, I = 1024, F = 2816, L = 4, V = 1000, T = 256 };
    wspec ws[3 + 8 * L];
    static char names[8 * L][96];
    int n = 0;
    ws[n++] = (wspec){"shared.weight", 2, {V, C}};
    ws[n++] = (wspec){"encoder.final_layer_norm.weight", 1, {C}};
    ws[n++] = (wspec){"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 2, {32, 16}};
    static const struct { const char *n; int nd; int64_t a, b; } per[8] = {
        {"layer.0.layer_norm.weight", 1, C, 0}, {"layer.0.SelfAttention.q.weight", 2, I, C},
        {"layer.0.SelfAttention.k.weight", 2, I, C}, {"layer.0.SelfAttention.v.weight", 2, I, C},
        {"layer.0.SelfAttention.o.weight", 2, C, I}, {"layer.1.layer_norm.weight", 1, C, 0},
        {"layer.1.DenseReluDense.wi_0.weight", 2, F, C}, {"layer.1.DenseReluDense.wi_1.weight", 2, F, C}};
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 8; k++) {
            char *nm = names[l * 8 + k];
            snprintf(nm, 96, "encoder.block.%d.%s", l, per[k].n);
            ws[n++] = (wspec){nm, per[k].nd, {per[k].a, per[k].b}};
        }
    wspec wo[L];
    static char wo_names[L][96];
    for (int l = 0; l < L; l++) {
        snprintf(wo_names[l], 96, "encoder.block.%d.layer.1.DenseReluDense.wo.weight", l);
        wo[l] = (wspec){wo_names[l], 2, {C, F}};
    }
    wspec all[3 + 9 * L];
    memcpy(all, ws, (size_t)n * sizeof *ws);
    memcpy(all + n, wo, sizeof wo);
    write_folder(tmp, "{\"architectures\": [\"T5EncoderModel\"], \"d_model\": 1024, \"d_kv\": 64, \"d_ff\": 2816, "
                      "\"num_layers\": 4, \"num_heads\": 16, \"vocab_size\": 1000, \"feed_forward_proj\": \"gated-gelu\"}",
                 all, n + L);
    ecase c = {.ctx = mmc_ctx_new(), .ids = make_ids(T, V)};
    MMC_CHECK(mmc_t5_encoder_load(tmp, &c.t5) == MMC_OK, "%s", mmc_last_error());
    bench_report("text_encode_t5_large4_256tok_ms", 1e3 * bench_time(run, &c, 2.0, 3), "ms", 0);
    mmc_t5_encoder_free(c.t5);
    mmc_tensor_free(c.ids);
    mmc_ctx_free(c.ctx);
}

int main(void) {
    char tmp[] = "/tmp/mmc_bench_textenc_XXXXXX";
    MMC_CHECK(mkdtemp(tmp), "mkdtemp");
    bench_clip(tmp);
    bench_t5(tmp);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd) != 0) fprintf(stderr, "bench_text_encoders: could not remove %s\n", tmp);
    return 0;
}
