/* bench_serve_model.c — writes the model bench_serve.sh serves: a Qwen2ForCausalLM directory
 * with Qwen2-0.5B's layer shapes (hidden 896, intermediate 4864, 14 query heads over 2 KV
 * heads of 64) at reduced depth, random init (mmc_qwen2_new: normal(0, 0.02), norms 1), and the
 * vocabulary of the tokenizer copied next to it (the tiny Qwen2 fixture's, so that decode
 * time is the layers', not a 150k-row lm_head's). usage: bench_serve_model DIR [LAYERS] [VOCAB] */
#include "mmc_models.h"
#include "mmc_trainer.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: bench_serve_model DIR [LAYERS] [VOCAB]\n"); return 2; }
    int layers = argc > 2 ? atoi(argv[2]) : 4;
    int vocab = argc > 3 ? atoi(argv[3]) : 1392;
    mmc_qwen2_config c = {.vocab_size = vocab, .hidden_size = 896, .intermediate_size = 4864, .num_layers = layers,
                          .num_heads = 14, .num_kv_heads = 2, .head_dim = 64, .max_position_embeddings = 4096,
                          .rms_norm_eps = 1e-6, .rope_theta = 1e6, .qkv_bias = true, .tie_word_embeddings = true};
    mmc_qwen2 *m = NULL;
    char path[4096];
    if (mmc_qwen2_new(&c, 1, &m)) goto fail;
    snprintf(path, sizeof path, "%s/model.safetensors", argv[1]);
    if (mmc_qwen2_save_weights(m, path, MMC_F32)) goto fail;
    snprintf(path, sizeof path, "%s/config.json", argv[1]);
    FILE *f = fopen(path, "w");
    if (!f) { fprintf(stderr, "cannot write %s\n", path); return 1; }
    fprintf(f, "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 896,\n"
               " \"intermediate_size\": 4864, \"num_hidden_layers\": %d, \"num_attention_heads\": 14,\n"
               " \"num_key_value_heads\": 2, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-06,\n"
               " \"rope_theta\": 1000000.0, \"tie_word_embeddings\": true, \"vocab_size\": %d,\n"
               " \"torch_dtype\": \"float32\", \"hidden_act\": \"silu\"}\n", layers, vocab);
    fclose(f);
    mmc_qwen2_free(m);
    return 0;
fail:
    fprintf(stderr, "bench_serve_model: %s\n", mmc_last_error());
    return 1;
}
