/* llama.c — the Llama decoder, mirroring transformers' LlamaForCausalLM
 * (models/llama/modeling_llama.py): token embedding [V, C], N pre-norm LlamaDecoderLayers
 * (RMSNorm -> GQA self-attention, rotary q/k of head_dim D, o_proj -> residual; RMSNorm ->
 * down(silu(gate(x)) * up(x)) -> residual), a final RMSNorm and the LM head [V, C] (tied to
 * the embedding when tie_word_embeddings and the checkpoint has no lm_head.weight).
 *
 * This is Qwen2's decoder with other flags, so the layers, KV cache, forward, logits and the
 * generation interface are qwen2.c's (one struct, mmc_qwen2): Llama has no q/k/v biases
 * unless attention_bias (which also adds one to o_proj), MLP biases only with mlp_bias, and
 * RoPE frequencies from rope_scaling / rope_parameters (default, linear, dynamic, llama3;
 * mmc_qwen2_rope_table). What is Llama's alone is read here: its config keys. It is the
 * language model of LLaVA (llava.c), named "model.language_model." (transformers >= 4.52)
 * or "language_model.model." (the Hub's 4.4x checkpoints) there. */
#include "mmc_models.h"

#include <string.h>

mmc_status mmc_llama_config_read(const mmc_json *root, mmc_qwen2_config *c) {
    const mmc_json *t = mmc_json_get(root, "text_config");
    return mmc_llama_config_read_section(root, t && mmc_json_has(t, "hidden_size") ? t : root, c);
}

mmc_status mmc_llama_config_read_section(const mmc_json *root, const mmc_json *j, mmc_qwen2_config *c) {
    /* LlamaConfig's defaults (Llama-2-7B's sizes) */
    const mmc_qwen2_config defs = {.vocab_size = 32000, .hidden_size = 4096, .intermediate_size = 11008,
                                   .num_layers = 32, .num_heads = 32, .max_position_embeddings = 2048,
                                   .rms_norm_eps = 1e-6};
    mmc_status st = mmc_decoder_config_read(root, j, &defs, c);
    if (st) return st;
    bool ab = false, mb = false;
    if ((st = mmc_json_bool(j, "attention_bias", false, &ab))) return st;
    if ((st = mmc_json_bool(j, "mlp_bias", false, &mb))) return st;
    c->qkv_bias = c->o_bias = ab;
    c->mlp_bias = mb;
    const char *act = NULL;
    if ((st = mmc_json_str(j, "hidden_act", "silu", &act))) return st;
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "config.json: hidden_act '%s' is not supported for Llama (silu)", act);
    return MMC_OK;
}

mmc_status mmc_llama_load(const char *dir, const mmc_json *config, bool trainable, mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg;
    mmc_status st = mmc_llama_config_read(config, &cfg);
    if (st) return mmc_error_prefix(st, "%s/config.json", dir);
    return mmc_decoder_load_cfg(dir, &cfg, trainable, out);
}
