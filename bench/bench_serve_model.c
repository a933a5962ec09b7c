/* bench_serve_model.c — writes the model bench_serve.sh serves: a Qwen2ForCausalLM directory at
 * reduced depth, random init (mmc_qwen2_new: normal(0, 0.02), norms 1), with the vocabulary of the
 * tokenizer copied next to it (the tiny Qwen2 fixture's, so that decode time is the layers', not a
 * 150k-row lm_head's). SHAPE: qwen2-0.5b (Qwen2-0.5B's layers: hidden 896, intermediate 4864, 14
 * query heads over 2 KV heads of 64; the default) or qwen2-vl-2b (the language model of
 * Qwen2-VL-2B-Instruct: hidden 1536, intermediate 8960, 12 query heads over 2 KV heads of 128,
 * tied embeddings), both with q/k/v biases and RoPE base 1e6. DTYPE: f32 (default) or bf16 weights in the
 * safetensors (the same random values, rounded to nearest even), which mmc serves as they are.
 * usage: bench_serve_model DIR [LAYERS] [VOCAB] [SHAPE] [DTYPE]
 * Without arguments (bench/run.sh runs every build/bench_* so) it says what it is and exits 0. */
#include "mmc_models.h"
#include "mmc_trainer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "bench_serve_model: a helper of bench/bench_serve.sh (usage: bench_serve_model DIR [LAYERS] "
                        "[VOCAB] [qwen2-0.5b|qwen2-vl-2b] [f32|bf16]); nothing to measure alone\n");
        return 0;
    }
    int layers = argc > 2 ? atoi(argv[2]) : 4;
    int vocab = argc > 3 ? atoi(argv[3]) : 1392;
    const char *shape = argc > 4 ? argv[4] : "qwen2-0.5b";
    const char *dtype = argc > 5 ? argv[5] : "f32";
    if (strcmp(dtype, "f32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "bench_serve_model: unknown dtype %s (f32 or bf16)\n", dtype);
        return 2;
    }
    int hidden, inter, heads, kv_heads, head_dim;
    if (!strcmp(shape, "qwen2-0.5b")) {
        hidden = 896, inter = 4864, heads = 14, kv_heads = 2, head_dim = 64;
    } else if (!strcmp(shape, "qwen2-vl-2b")) {
        hidden = 1536, inter = 8960, heads = 12, kv_heads = 2, head_dim = 128;
    } else {
        fprintf(stderr, "bench_serve_model: unknown shape %s (qwen2-0.5b or qwen2-vl-2b)\n", shape);
        return 2;
    }
    if (layers < 1 || vocab < 2) { fprintf(stderr, "bench_serve_model: LAYERS >= 1, VOCAB >= 2\n"); return 2; }
    mmc_qwen2_config c = {.vocab_size = vocab, .hidden_size = hidden, .intermediate_size = inter, .num_layers = layers,
                          .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = head_dim,
                          .max_position_embeddings = 4096, .rms_norm_eps = 1e-6, .rope_theta = 1e6, .qkv_bias = true,
                          .tie_word_embeddings = true};
    mmc_qwen2 *m = NULL;
    char path[4096];
    if (mmc_qwen2_new(&c, 1, &m)) goto fail;
    snprintf(path, sizeof path, "%s/model.safetensors", argv[1]);
    if (mmc_qwen2_save_weights(m, path, strcmp(dtype, "bf16") ? MMC_F32 : MMC_BF16)) goto fail;
    snprintf(path, sizeof path, "%s/config.json", argv[1]);
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "cannot write %s\n", path); return 1; }
    fprintf(f, "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": %d,\n"
               " \"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,\n"
               " \"num_key_value_heads\": %d, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06,\n"
               " \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true, \"vocab_size\": %d,\n"
               " \"torch_dtype\": \"%s\", \"hidden_act\": \"silu\"}\n",
            hidden, inter, layers, heads, kv_heads, vocab, strcmp(dtype, "bf16") ? "float32" : "bfloat16");
    fclose(f);
    mmc_qwen2_free(m);
    return 0;
fail:
    fprintf(stderr, "bench_serve_model: %s\n", mmc_last_error());
    return 1;
}
