/* internlm2.c — the InternLM2 decoder (InternLM2ForCausalLM, the InternLM team's remote code
 * modeling_internlm2.py, model_type "internlm2"): InternVL2 / 2.5-8B's language model.
 *
 * Its computation is Llama's (pre-norm RMSNorm, GQA attention with rotate-half RoPE, SwiGLU MLP,
 * final RMSNorm, untied head; biases on the attention's projections only with `bias`), under
 * other names and one packed projection:
 *
 *   tok_embeddings            -> embed_tokens           output          -> lm_head
 *   layers.N.attention_norm   -> input_layernorm        ffn_norm        -> post_attention_layernorm
 *   attention.wo              -> self_attn.o_proj
 *   feed_forward.w1 / w3 / w2 -> mlp.gate_proj / up_proj / down_proj   (down(silu(w1 x) * w3 x))
 *   attention.wqkv [(H + 2 Hkv) D, C]: rows grouped per key/value head h (G = H / Hkv query heads
 *       each): [q_{hG} .. q_{hG+G-1}, k_h, v_h], D rows apiece, so row (h (G + 2) + j) D + d is
 *       query head h G + j for j < G, key head h for j = G, value head h for j = G + 1
 *       (the reference's rearrange 'b q (h gs d) -> b q h gs d', gs = G + 2, then q heads (h gs))
 *
 * So the checkpoint is read onto mmc's Llama decoder (qwen2.c, one struct mmc_qwen2) through a
 * view set under Llama's names: the renamed tensors view the mapping, q / k / v are the wqkv rows
 * gathered into one buffer the caller keeps with the model. The config is InternLM2Config's:
 * the usual sizes, `bias` (wqkv and wo), rope_theta, rope_scaling {type: linear | dynamic, factor}.
 * The reference's dynamic NTK keeps the enlarged base once a forward went past
 * max_position_embeddings (it overwrites inv_freq); mmc computes it per forward, as transformers'
 * Llama does: the same within max_position_embeddings (32768 for InternLM2.5-7B).
 *
 * Training loads the other way (mmc_internlm2_load_packed, cfg.internlm2): the decoder keeps one packed
 * wqkv linear per layer (mmc_qwen2_layer.qkv) whose output mmc_internlm2_split_qkv cuts into the grouped
 * q / k / v, and the parameters and LoRA modules carry the remote code's names. So a full checkpoint is
 * the packed layout again, and LoRA on "wqkv" is PEFT's: one lora_A [r, C] and one lora_B
 * [(H + 2 Hkv) D, r] over the packed rows, which `mmc merge` folds into wqkv as merge_and_unload does.
 * Inference with such an adapter (mmc generate / forward --adapter, text or inside internvl_chat) loads
 * this packed layout too (not trainable: zero-copy bindings), so the adapter's B rows meet wqkv's. */
#include "mmc_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mmc_status mmc_internlm2_config_read_section(const mmc_json *root, const mmc_json *j, mmc_qwen2_config *c) {
    /* InternLM2Config's defaults (internlm2-7b's sizes) */
    const mmc_qwen2_config defs = {.vocab_size = 103168, .hidden_size = 4096, .intermediate_size = 11008,
                                   .num_layers = 32, .num_heads = 32, .max_position_embeddings = 2048,
                                   .rms_norm_eps = 1e-6};
    mmc_status st = mmc_decoder_config_read(root, j, &defs, c);
    if (st) return st;
    if (c->head_dim * c->num_heads != c->hidden_size)
        return mmc_error(MMC_ERR_FORMAT, "config.json: InternLM2's head_dim is hidden_size / num_attention_heads, "
                         "but hidden_size %lld is not a multiple of num_attention_heads %lld (or head_dim is set)",
                         (long long)c->hidden_size, (long long)c->num_heads);
    bool bias = true;   /* InternLM2Config's default; the released checkpoints say false */
    if ((st = mmc_json_bool(j, "bias", true, &bias))) return st;
    c->qkv_bias = c->o_bias = bias;
    c->mlp_bias = false;
    const char *act = NULL;
    if ((st = mmc_json_str(j, "hidden_act", "silu", &act))) return st;
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "config.json: hidden_act '%s' is not supported for InternLM2 (silu)", act);
    int64_t tp = 1;
    if ((st = mmc_json_int(j, "pretraining_tp", 1, &tp))) return st;
    (void)tp;   /* the reference splits wqkv's matmul over tp slices: the same product */
    return MMC_OK;
}

static mmc_status add(mmc_st *v, const char *dst_pre, const char *dst, const mmc_st_entry *e) {
    char name[256];
    snprintf(name, sizeof name, "%s%s", dst_pre, dst);
    return mmc_st_add_view(v, name, e->dtype, e->ndim, e->shape, e->data);
}

mmc_status mmc_internlm2_llama_view(const mmc_st *src, const char *pre, const mmc_qwen2_config *c, const char *dst_pre,
                                    mmc_st **view, void **repack) {
    *view = NULL;
    *repack = NULL;
    const int64_t C = c->hidden_size, H = c->num_heads, Hkv = c->num_kv_heads, D = c->head_dim, G = H / Hkv;
    const int64_t rows = (H + 2 * Hkv) * D;
    char name[256], errs[2048] = "";
    int bad = 0;
    size_t total = 0;   /* the repacked wqkv weights (and biases) in their stored dtype */
    for (int64_t i = 0; i < c->num_layers; i++)
        for (int b = 0; b < (c->qkv_bias ? 2 : 1); b++) {
            snprintf(name, sizeof name, "%smodel.layers.%lld.attention.wqkv.%s", pre, (long long)i, b ? "bias" : "weight");
            const mmc_st_entry *e = mmc_st_find(src, name);
            const bool ok = e && e->ndim == (b ? 1 : 2) && e->shape[0] == rows && (b || e->shape[1] == C);
            if (!ok) {
                size_t u = strlen(errs);
                if (u < sizeof errs - 1)
                    snprintf(errs + u, sizeof errs - u, "\n  %s: %s", name,
                             e ? "not of the shape num_attention_heads and 2 num_key_value_heads heads of head_dim "
                                 "give" : "missing");
                bad++;
                continue;
            }
            total += e->nbytes;
        }
    if (bad)
        return mmc_error(MMC_ERR_FORMAT, "InternLM2 weights: %d problem%s with the packed attention.wqkv (expected "
                         "[%lld, %lld]: (%lld + 2 x %lld) heads x head_dim %lld):%s", bad, bad > 1 ? "s" : "",
                         (long long)rows, (long long)C, (long long)H, (long long)Hkv, (long long)D, errs);
    char *buf = malloc(total ? total : 1);
    mmc_st *v = NULL;
    mmc_status st = buf ? mmc_st_new_view(&v) : mmc_error(MMC_ERR_OOM, "out of memory");
    size_t off = 0;
    static const char *const same[][2] = {{"attention_norm.weight", "input_layernorm.weight"},
                                          {"ffn_norm.weight", "post_attention_layernorm.weight"},
                                          {"attention.wo.weight", "self_attn.o_proj.weight"},
                                          {"attention.wo.bias", "self_attn.o_proj.bias"},
                                          {"feed_forward.w1.weight", "mlp.gate_proj.weight"},
                                          {"feed_forward.w3.weight", "mlp.up_proj.weight"},
                                          {"feed_forward.w2.weight", "mlp.down_proj.weight"}};
    char dst[256];
    for (int64_t i = 0; i < c->num_layers && !st; i++) {
        for (size_t k = 0; k < sizeof same / sizeof *same && !st; k++) {
            snprintf(name, sizeof name, "%smodel.layers.%lld.%s", pre, (long long)i, same[k][0]);
            const mmc_st_entry *e = mmc_st_find(src, name);
            if (!e) continue;   /* the model loader names what is missing, under Llama's name */
            snprintf(dst, sizeof dst, "model.layers.%lld.%s", (long long)i, same[k][1]);
            st = add(v, dst_pre, dst, e);
        }
        for (int b = 0; b < (c->qkv_bias ? 2 : 1) && !st; b++) {
            snprintf(name, sizeof name, "%smodel.layers.%lld.attention.wqkv.%s", pre, (long long)i, b ? "bias" : "weight");
            const mmc_st_entry *e = mmc_st_find(src, name);
            const size_t row = e->nbytes / (size_t)rows;   /* one output row: C values, or one bias value */
            /* q [H D, ...], k [Hkv D, ...], v [Hkv D, ...] one after the other in buf */
            char *q = buf + off, *kk = q + (size_t)(H * D) * row, *vv = kk + (size_t)(Hkv * D) * row;
            const char *s = e->data;
            for (int64_t h = 0; h < Hkv; h++) {
                const char *grp = s + (size_t)(h * (G + 2) * D) * row;
                memcpy(q + (size_t)(h * G * D) * row, grp, (size_t)(G * D) * row);
                memcpy(kk + (size_t)(h * D) * row, grp + (size_t)(G * D) * row, (size_t)D * row);
                memcpy(vv + (size_t)(h * D) * row, grp + (size_t)((G + 1) * D) * row, (size_t)D * row);
            }
            off += e->nbytes;
            const char *kind = b ? "bias" : "weight";
            const int64_t qs[2] = {H * D, C}, ks[2] = {Hkv * D, C};
            char *parts[3] = {q, kk, vv};
            const int64_t *shp[3] = {qs, ks, ks};
            static const char *const nm[3] = {"q_proj", "k_proj", "v_proj"};
            for (int p = 0; p < 3 && !st; p++) {
                snprintf(dst, sizeof dst, "%smodel.layers.%lld.self_attn.%s.%s", dst_pre, (long long)i, nm[p], kind);
                st = mmc_st_add_view(v, dst, e->dtype, b ? 1 : 2, shp[p], parts[p]);
            }
        }
    }
    static const char *const top[][2] = {{"model.tok_embeddings.weight", "model.embed_tokens.weight"},
                                         {"model.norm.weight", "model.norm.weight"},
                                         {"output.weight", "lm_head.weight"}};
    for (size_t k = 0; k < sizeof top / sizeof *top && !st; k++) {
        snprintf(name, sizeof name, "%s%s", pre, top[k][0]);
        const mmc_st_entry *e = mmc_st_find(src, name);
        if (e) st = add(v, dst_pre, top[k][1], e);
    }
    if (st) {
        mmc_st_close(v);
        free(buf);
        return st;
    }
    *view = v;
    *repack = buf;
    return MMC_OK;
}

mmc_status mmc_internlm2_load(const char *dir, const mmc_json *config, mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg;
    const mmc_json *t = mmc_json_get(config, "text_config");
    mmc_status st = mmc_internlm2_config_read_section(config, t && mmc_json_has(t, "hidden_size") ? t : config, &cfg);
    if (st) return mmc_error_prefix(st, "%s/config.json", dir);
    mmc_st *w = NULL, *view = NULL;
    void *repack = NULL;
    if ((st = mmc_st_open(dir, &w))) return st;
    if (!(st = mmc_internlm2_llama_view(w, "", &cfg, "", &view, &repack)))
        st = mmc_qwen2_load_from(view, &cfg, "model.", "lm_head.weight", false, out);
    mmc_st_close(view);
    if (st) {
        free(repack);
        mmc_st_close(w);
        return mmc_error_prefix(st, "%s: InternLM2 (its tensors named as Llama's: tok_embeddings -> embed_tokens, "
                                "attention.wqkv -> q/k/v_proj, attention.wo -> o_proj, feed_forward.w1/w3/w2 -> "
                                "mlp.gate/up/down_proj, attention_norm / ffn_norm -> input_layernorm / "
                                "post_attention_layernorm, output -> lm_head)", dir);
    }
    (*out)->st = w;   /* the renamed tensors view its mapping */
    (*out)->repack = repack;
    return MMC_OK;
}

/* ------------------------------------------------------------------ the packed layout (training) */
void mmc_internlm2_split_qkv(mmc_ctx *ctx, mmc_tensor *y, int64_t Hq, int64_t Hkv, int64_t D, mmc_tensor **q,
                             mmc_tensor **k, mmc_tensor **v) {
    const int64_t B = y->shape[0], T = y->shape[1], G = Hq / Hkv;
    y = mmc_reshape(ctx, y, 5, MMC_SHAPE(B, T, Hkv, G + 2, D));                      /* [B, T, Hkv, G + 2, D] */
    *q = mmc_reshape(ctx, mmc_contiguous(ctx, mmc_narrow(ctx, y, 3, 0, G)), 4, MMC_SHAPE(B, T, Hq, D));
    *k = mmc_reshape(ctx, mmc_contiguous(ctx, mmc_narrow(ctx, y, 3, G, 1)), 4, MMC_SHAPE(B, T, Hkv, D));
    *v = mmc_reshape(ctx, mmc_contiguous(ctx, mmc_narrow(ctx, y, 3, G + 1, 1)), 4, MMC_SHAPE(B, T, Hkv, D));
}

mmc_status mmc_internlm2_load_packed(const char *dir, const mmc_json *config, const char *prefix, bool trainable,
                                     mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg;
    const mmc_json *t = mmc_json_get(config, "llm_config");   /* InternVL's internvl_chat layout */
    if (!t) t = mmc_json_get(config, "text_config");
    mmc_status st = mmc_internlm2_config_read_section(config, t && mmc_json_has(t, "hidden_size") ? t : config, &cfg);
    if (st) return mmc_error_prefix(st, "%s/config.json", dir);
    cfg.internlm2 = true;
    mmc_st *w = NULL;
    if ((st = mmc_st_open(dir, &w))) return st;
    char pre[128], head[160];
    snprintf(pre, sizeof pre, "%smodel.", prefix);
    snprintf(head, sizeof head, "%soutput.weight", prefix);
    if ((st = mmc_qwen2_load_from(w, &cfg, pre, head, trainable, out))) {
        mmc_st_close(w);
        return mmc_error_prefix(st, "%s: InternLM2 (tok_embeddings, attention.wqkv / wo, feed_forward.w1/w2/w3, "
                                "attention_norm, ffn_norm, norm, output under '%s')", dir, prefix);
    }
    (*out)->st = w;   /* (zero-copy bindings view its mapping when not trainable) */
    return MMC_OK;
}
