/* qwen2.c — the Qwen2 decoder, mirroring transformers' Qwen2ForCausalLM
 * (models/qwen2/modeling_qwen2.py): token embedding, N pre-norm decoder layers
 * (RMSNorm -> GQA self-attention with q/k/v biases and rotary embeddings -> residual,
 * RMSNorm -> SwiGLU MLP -> residual), a final RMSNorm and an (optionally tied) LM head.
 * It is also the language model inside Qwen2-VL and Qwen2.5-VL, whose checkpoints name
 * it "model." (transformers < 4.52 and the Hub) or "model.language_model." (>= 4.52).
 * Llama (llama.c) runs through the same code: the config's flags say which projections
 * carry biases (Qwen2: q/k/v; Llama: attention_bias on q/k/v/o, mlp_bias on the MLP) and
 * which RoPE frequencies to use (mmc_qwen2_rope_table: default, linear, dynamic, llama3). */
#include "mmc_models.h"
#include "mmc_lora.h"
#include "mmc_quant.h"
#include "mmc_tp.h"
#include "mmc_cp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ config */
static const mmc_json *text_section(const mmc_json *cfg) {
    const mmc_json *t = mmc_json_get(cfg, "text_config");
    return t && mmc_json_has(t, "hidden_size") ? t : cfg;
}

/* rope_scaling (4.4x: "type" or "rope_type") or rope_parameters (5.x: "rope_type"), in the
 * text section or at the top level. "mrope" and "default" are the plain frequencies. */
static mmc_status rope_read(const mmc_json *root, const mmc_json *j, mmc_qwen2_config *c) {
    static const char *const secs[] = {"rope_parameters", "rope_scaling"};
    const mmc_json *rs = NULL;
    const char *sec = NULL;
    for (int k = 0; k < 2 && !rs; k++)
        for (int pass = 0; pass < 2 && !rs; pass++) {
            const mmc_json *r = mmc_json_get(pass ? root : j, secs[k]);
            if (r && mmc_json_has(r, "rope_type") + mmc_json_has(r, "type") > 0) rs = r, sec = secs[k];
        }
    c->rope_kind = MMC_ROPE_DEFAULT;
    c->rope_factor = 1.0;
    if (!rs) return MMC_OK;
    mmc_status st;
    const char *type = NULL;
    if ((st = mmc_json_str(rs, mmc_json_has(rs, "rope_type") ? "rope_type" : "type", "default", &type))) return st;
    if (!strcmp(type, "default") || !strcmp(type, "mrope")) return MMC_OK;
    if (!strcmp(type, "linear")) c->rope_kind = MMC_ROPE_LINEAR;
    else if (!strcmp(type, "dynamic")) c->rope_kind = MMC_ROPE_DYNAMIC;
    else if (!strcmp(type, "llama3")) c->rope_kind = MMC_ROPE_LLAMA3;
    else return mmc_error(MMC_ERR_UNSUPPORTED, "config.json: %s.rope_type '%s' is not supported (default, linear, "
                          "dynamic, llama3)", sec, type);
    if ((st = mmc_json_num(rs, "factor", 1.0, &c->rope_factor))) return st;
    if (!(c->rope_factor >= 1.0 && c->rope_factor <= 1e6))
        return mmc_error(MMC_ERR_FORMAT, "config.json: %s.factor %g must be from 1 to 1e6", sec, c->rope_factor);
    int64_t v;
    if ((st = mmc_json_int(rs, "original_max_position_embeddings", c->max_position_embeddings, &v))) return st;
    c->rope_original_max_pos = v;
    if (c->rope_kind == MMC_ROPE_DYNAMIC) c->rope_original_max_pos = c->max_position_embeddings;
    if (c->rope_kind == MMC_ROPE_LLAMA3) {
        if ((st = mmc_json_num(rs, "low_freq_factor", 1.0, &c->rope_low_freq_factor))) return st;
        if ((st = mmc_json_num(rs, "high_freq_factor", 4.0, &c->rope_high_freq_factor))) return st;
        if (!(c->rope_low_freq_factor > 0 && c->rope_high_freq_factor > c->rope_low_freq_factor) || v <= 0)
            return mmc_error(MMC_ERR_FORMAT, "config.json: %s: llama3 needs 0 < low_freq_factor < high_freq_factor "
                             "and original_max_position_embeddings > 0", sec);
    }
    return MMC_OK;
}

mmc_status mmc_qwen2_config_read(const mmc_json *root, mmc_qwen2_config *c) {
    return mmc_decoder_config_read(root, text_section(root), NULL, c);
}

mmc_status mmc_decoder_config_read(const mmc_json *root, const mmc_json *j, const mmc_qwen2_config *defs,
                                   mmc_qwen2_config *c) {
    memset(c, 0, sizeof *c);
    mmc_status st;
    int64_t v;
#define RD_INT(key, field, def) do { if ((st = mmc_json_int(j, key, defs ? defs->field : def, &v))) return st; \
    c->field = v; } while (0)
    RD_INT("vocab_size", vocab_size, -1);
    RD_INT("hidden_size", hidden_size, -1);
    RD_INT("intermediate_size", intermediate_size, -1);
    RD_INT("num_hidden_layers", num_layers, -1);
    RD_INT("num_attention_heads", num_heads, -1);
    RD_INT("max_position_embeddings", max_position_embeddings, 32768);
#undef RD_INT
    const char *need[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads"};
    int64_t got[] = {c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads};
    /* bounded so that the products of sizes (weight shapes, rope tables) fit in int64 */
    for (int i = 0; i < 5; i++)
        if (got[i] <= 0 || got[i] > MMC_CONFIG_MAX_DIM)
            return mmc_error(MMC_ERR_FORMAT, "config.json: '%s' is missing or not from 1 to %lld", need[i],
                             (long long)MMC_CONFIG_MAX_DIM);
    if ((st = mmc_json_int(j, "num_key_value_heads", c->num_heads, &v))) return st;
    c->num_kv_heads = v;
    if ((st = mmc_json_int(j, "head_dim", c->hidden_size / c->num_heads, &v))) return st;
    c->head_dim = v;
    if (c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads)
        return mmc_error(MMC_ERR_FORMAT, "config.json: num_attention_heads %lld is not a multiple of "
                         "num_key_value_heads %lld", (long long)c->num_heads, (long long)c->num_kv_heads);
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > MMC_CONFIG_MAX_DIM)
        return mmc_error(MMC_ERR_FORMAT, "config.json: head_dim %lld must be even, positive and at most %lld",
                         (long long)c->head_dim, (long long)MMC_CONFIG_MAX_DIM);
    if ((st = mmc_json_num(j, "rms_norm_eps", defs ? defs->rms_norm_eps : 1e-6, &c->rms_norm_eps))) return st;
    double theta = 10000.0;
    if (mmc_json_has(j, "rope_parameters.rope_theta")) st = mmc_json_num(j, "rope_parameters.rope_theta", theta, &theta);
    else if (mmc_json_has(j, "rope_theta")) st = mmc_json_num(j, "rope_theta", theta, &theta);
    else if (mmc_json_has(root, "rope_theta")) st = mmc_json_num(root, "rope_theta", theta, &theta);
    if (st) return st;
    c->rope_theta = theta;
    bool tie = false;
    if (mmc_json_has(j, "tie_word_embeddings")) st = mmc_json_bool(j, "tie_word_embeddings", false, &tie);
    else st = mmc_json_bool(root, "tie_word_embeddings", false, &tie);
    if (st) return st;
    c->tie_word_embeddings = tie;
    /* pad_token_id: transformers builds embed_tokens as nn.Embedding(V, C, padding_idx=pad_token_id),
     * so training never moves that row; null, absent or outside the vocabulary: none */
    if (!mmc_json_has(j, "pad_token_id") || mmc_json_int(j, "pad_token_id", -1, &v) || v < 0 || v >= c->vocab_size)
        v = -1;
    c->has_pad_token = v >= 0;
    c->pad_token_id = v;
    /* M-RoPE: rope_scaling.mrope_section (Hub) or rope_parameters.mrope_section (5.x) */
    const char *keys[] = {"rope_scaling.mrope_section", "rope_parameters.mrope_section"};
    for (int k = 0; k < 2; k++) {
        for (int pass = 0; pass < 2; pass++) {
            const mmc_json *src = pass ? root : j;
            if (!mmc_json_has(src, keys[k])) continue;
            int64_t sec[3];
            int n = 3;
            if ((st = mmc_json_int_array(src, keys[k], sec, &n))) return st;
            bool in_range = n == 3;   /* each within [0, head_dim/2]: the sum cannot overflow */
            for (int i = 0; i < n && in_range; i++) in_range = sec[i] >= 0 && sec[i] <= c->head_dim / 2;
            if (!in_range || sec[0] + sec[1] + sec[2] != c->head_dim / 2)
                return mmc_error(MMC_ERR_FORMAT, "config.json: %s must be 3 numbers summing to head_dim/2 = %lld",
                                 keys[k], (long long)(c->head_dim / 2));
            c->mrope = true;
            for (int i = 0; i < 3; i++) c->mrope_section[i] = (int)sec[i];
            goto mrope_done;
        }
    }
mrope_done:;
    const char *dt = NULL;
    if ((st = mmc_json_str(j, "torch_dtype", NULL, &dt))) return st;
    if (!dt && (st = mmc_json_str(j, "dtype", NULL, &dt))) return st;
    if (!dt && (st = mmc_json_str(root, "torch_dtype", NULL, &dt))) return st;
    c->dtype = MMC_F32;
    if (dt && mmc_dtype_parse(dt, &c->dtype) != MMC_OK) c->dtype = MMC_F32;
    c->qkv_bias = true;   /* Qwen2Attention: q/k/v with bias, o_proj without */
    return rope_read(root, j, c);
}

/* ------------------------------------------------------------------ parameters */
typedef struct {
    char name[96];          /* HF name without the model prefix */
    mmc_tensor **slot;
    int ndim;
    int64_t shape[2];
    bool optional;
    int split;              /* tensor parallelism: dimension split over the group, or -1 (replicated) */
} wspec;

static int build_specs(mmc_qwen2 *m, wspec *s) {
    const mmc_qwen2_config *c = &m->cfg;
    int64_t C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    int64_t QD = c->num_heads * c->head_dim, KD = c->num_kv_heads * c->head_dim;
    int n = 0;
#define SPEC(nm, ptr, nd, d0, d1) do { snprintf(s[n].name, sizeof s[n].name, "%s", nm); s[n].slot = (ptr); \
    s[n].ndim = nd; s[n].shape[0] = d0; s[n].shape[1] = d1; s[n].optional = false; s[n].split = -1; n++; } while (0)
    /* Megatron's split: q/k/v/gate/up column-parallel (output rows), o/down row-parallel (input
     * columns), the embedding vocab-parallel (rows); norms and o/down biases replicated */
#define SPLIT(d) (s[n - 1].split = (d))
    if (c->internlm2) {   /* InternLM2's names and packed wqkv (internlm2.c) */
        /* tensor parallelism: wqkv's rows are grouped per KV head, [Hkv x (G + 2) x D]: split on its
         * rows, each rank holds Hkv / tp whole groups (their G query heads, key and value) */
        SPEC("tok_embeddings.weight", &m->embed, 2, V, C); SPLIT(0);
        for (int64_t i = 0; i < c->num_layers; i++) {
            mmc_qwen2_layer *L = &m->layers[i];
            char b[96];
#define LSPEC(suffix, ptr, nd, d0, d1) do { snprintf(b, sizeof b, "layers.%lld.%s", (long long)i, suffix); \
    SPEC(b, ptr, nd, d0, d1); } while (0)
            LSPEC("attention_norm.weight", &L->input_norm, 1, C, 0);
            LSPEC("attention.wqkv.weight", &L->qkv.w, 2, QD + 2 * KD, C); SPLIT(0);
            if (c->qkv_bias) { LSPEC("attention.wqkv.bias", &L->qkv.b, 1, QD + 2 * KD, 0); SPLIT(0); }
            LSPEC("attention.wo.weight", &L->o.w, 2, C, QD); SPLIT(1);
            if (c->o_bias) LSPEC("attention.wo.bias", &L->o.b, 1, C, 0);
            LSPEC("ffn_norm.weight", &L->post_norm, 1, C, 0);
            LSPEC("feed_forward.w1.weight", &L->gate.w, 2, F, C); SPLIT(0);
            LSPEC("feed_forward.w3.weight", &L->up.w, 2, F, C); SPLIT(0);
            LSPEC("feed_forward.w2.weight", &L->down.w, 2, C, F); SPLIT(1);
#undef LSPEC
        }
        SPEC("norm.weight", &m->norm, 1, C, 0);
        return n;
    }
    SPEC("embed_tokens.weight", &m->embed, 2, V, C); SPLIT(0);
    for (int64_t i = 0; i < c->num_layers; i++) {
        mmc_qwen2_layer *L = &m->layers[i];
        char b[96];
#define LSPEC(suffix, ptr, nd, d0, d1) do { snprintf(b, sizeof b, "layers.%lld.%s", (long long)i, suffix); \
    SPEC(b, ptr, nd, d0, d1); } while (0)
        LSPEC("input_layernorm.weight", &L->input_norm, 1, C, 0);
        LSPEC("self_attn.q_proj.weight", &L->q.w, 2, QD, C); SPLIT(0);
        if (c->qkv_bias) { LSPEC("self_attn.q_proj.bias", &L->q.b, 1, QD, 0); SPLIT(0); }
        LSPEC("self_attn.k_proj.weight", &L->k.w, 2, KD, C); SPLIT(0);
        if (c->qkv_bias) { LSPEC("self_attn.k_proj.bias", &L->k.b, 1, KD, 0); SPLIT(0); }
        LSPEC("self_attn.v_proj.weight", &L->v.w, 2, KD, C); SPLIT(0);
        if (c->qkv_bias) { LSPEC("self_attn.v_proj.bias", &L->v.b, 1, KD, 0); SPLIT(0); }
        LSPEC("self_attn.o_proj.weight", &L->o.w, 2, C, QD); SPLIT(1);
        if (c->o_bias) LSPEC("self_attn.o_proj.bias", &L->o.b, 1, C, 0);
        LSPEC("post_attention_layernorm.weight", &L->post_norm, 1, C, 0);
        if (c->moe && mmc_moe_layer_sparse(c->moe, i)) continue;   /* its block: mmc_moe_bind / mmc_moe_init */
        LSPEC("mlp.gate_proj.weight", &L->gate.w, 2, F, C); SPLIT(0);
        if (c->mlp_bias) { LSPEC("mlp.gate_proj.bias", &L->gate.b, 1, F, 0); SPLIT(0); }
        LSPEC("mlp.up_proj.weight", &L->up.w, 2, F, C); SPLIT(0);
        if (c->mlp_bias) { LSPEC("mlp.up_proj.bias", &L->up.b, 1, F, 0); SPLIT(0); }
        LSPEC("mlp.down_proj.weight", &L->down.w, 2, C, F); SPLIT(1);
        if (c->mlp_bias) LSPEC("mlp.down_proj.bias", &L->down.b, 1, C, 0);
#undef LSPEC
    }
    SPEC("norm.weight", &m->norm, 1, C, 0);
#undef SPLIT
#undef SPEC
    return n;
}

static mmc_qwen2 *alloc_model(const mmc_qwen2_config *cfg, wspec **specs, int *n_specs) {
    mmc_qwen2 *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->layers = calloc((size_t)cfg->num_layers, sizeof *m->layers);
    int cap = 2 + 16 * (int)cfg->num_layers + 2 + (cfg->moe ? mmc_moe_param_count(cfg->moe) : 0);
    *specs = calloc((size_t)cap, sizeof **specs);
    m->params = calloc((size_t)cap, sizeof *m->params);
    m->param_names = calloc((size_t)cap, sizeof *m->param_names);
    if (!m->layers || !*specs || !m->params || !m->param_names) {
        free(*specs);
        mmc_qwen2_free(m);
        return NULL;
    }
    *n_specs = build_specs(m, *specs);
    int64_t C = cfg->hidden_size, F = cfg->intermediate_size;
    int64_t QD = cfg->num_heads * cfg->head_dim, KD = cfg->num_kv_heads * cfg->head_dim;
    for (int64_t i = 0; i < cfg->num_layers; i++) {
        mmc_qwen2_layer *L = &m->layers[i];
        L->q.out_features = QD; L->k.out_features = KD; L->v.out_features = KD;
        L->q.in_features = L->k.in_features = L->v.in_features = C;
        L->qkv.out_features = QD + 2 * KD; L->qkv.in_features = C;   /* (InternLM2's packed wqkv) */
        L->o.out_features = C; L->o.in_features = QD;
        L->gate.out_features = L->up.out_features = F; L->gate.in_features = L->up.in_features = C;
        L->down.out_features = C; L->down.in_features = F;
    }
    return m;
}

void mmc_qwen2_register_param(mmc_qwen2 *m, mmc_tensor *t, const char *name) {
    for (int i = 0; i < m->n_params; i++) if (m->params[i] == t) return;
    snprintf(m->param_names[m->n_params], sizeof m->param_names[0], "%s", name);
    snprintf(t->name, sizeof t->name, "%.*s", (int)sizeof t->name - 1, name);
    m->params[m->n_params++] = t;
}

mmc_status mmc_qwen2_new(const mmc_qwen2_config *cfg, uint64_t seed, mmc_qwen2 **out) {
    *out = NULL;
    wspec *s;
    int n;
    mmc_qwen2 *m = alloc_model(cfg, &s, &n);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory allocating a Qwen2 model");
    mmc_rng rng;
    mmc_rng_init(&rng, seed);
    for (int i = 0; i < n; i++) {
        mmc_tensor *t = mmc_tensor_new(MMC_F32, s[i].ndim, s[i].shape);
        if (!t) { free(s); mmc_qwen2_free(m); return MMC_ERR_OOM; }
        t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        bool is_norm = strstr(s[i].name, "norm") != NULL, is_bias = strstr(s[i].name, ".bias") != NULL;
        if (is_norm) for (int64_t k = 0; k < mmc_numel(t); k++) ((float *)t->data)[k] = 1.0f;
        else if (!is_bias) mmc_rng_normal(&rng, t->data, mmc_numel(t), 0.0f, 0.02f);
        *s[i].slot = t;
        mmc_qwen2_register_param(m, t, s[i].name);
    }
    if (cfg->tie_word_embeddings) m->lm_head = m->embed;
    else {
        m->lm_head = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(cfg->vocab_size, cfg->hidden_size));
        if (!m->lm_head) { free(s); mmc_qwen2_free(m); return MMC_ERR_OOM; }
        m->lm_head->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        mmc_rng_normal(&rng, m->lm_head->data, mmc_numel(m->lm_head), 0.0f, 0.02f);
        mmc_qwen2_register_param(m, m->lm_head, cfg->internlm2 ? "output.weight" : "lm_head.weight");
    }
    if (cfg->moe) mmc_moe_init(m, &rng);
    free(s);
    m->cfg.dtype = MMC_F32;
    *out = m;
    return MMC_OK;
}

mmc_status mmc_qwen2_load_from(mmc_st *st, const mmc_qwen2_config *cfg, const char *prefix,
                               const char *lm_head_name, bool trainable, mmc_qwen2 **out) {
    *out = NULL;
    wspec *s;
    int n;
    mmc_qwen2 *m = alloc_model(cfg, &s, &n);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory allocating a Qwen2 model");
    size_t errcap = 8192;
    char *errs = calloc(1, errcap);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char full[256];
        snprintf(full, sizeof full, "%s%s", prefix, s[i].name);
        if (mmc_model_bind(st, full, s[i].ndim, s[i].shape, trainable, s[i].slot, errs, errcap) != MMC_OK) bad++;
        else mmc_qwen2_register_param(m, *s[i].slot, s[i].name);
    }
    if (cfg->moe) bad += mmc_moe_bind(m, st, prefix, trainable, errs, errcap);
    if (cfg->tie_word_embeddings && !mmc_st_find(st, lm_head_name)) {
        m->lm_head = m->embed;
    } else if (mmc_model_bind(st, lm_head_name, 2, MMC_SHAPE(cfg->vocab_size, cfg->hidden_size), trainable,
                    &m->lm_head, errs, errcap) != MMC_OK) {
        bad++;
    } else {
        mmc_qwen2_register_param(m, m->lm_head, cfg->internlm2 ? "output.weight" : "lm_head.weight");
    }
    free(s);
    if (bad) {
        mmc_error(MMC_ERR_FORMAT, "Qwen2 weights: %d problem%s (prefix '%s'):%s", bad, bad > 1 ? "s" : "",
                  prefix, errs);
        free(errs);
        mmc_qwen2_free(m);
        return MMC_ERR_FORMAT;
    }
    free(errs);
    *out = m;
    return MMC_OK;
}

mmc_status mmc_qwen2_load(const char *dir, const mmc_json *config, bool trainable, mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg;
    mmc_status st = mmc_qwen2_config_read(config, &cfg);
    if (st) return mmc_error_prefix(st, "%s/config.json", dir);
    return mmc_decoder_load_cfg(dir, &cfg, trainable, out);
}

mmc_status mmc_decoder_load_cfg(const char *dir, const mmc_qwen2_config *cfgp, bool trainable, mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg = *cfgp;
    mmc_status st;
    mmc_st *w = NULL;
    if ((st = mmc_st_open(dir, &w))) return st;
    static const char *prefixes[] = {"model.", "model.language_model.", "language_model.model."};
    static const char *heads[] = {"lm_head.weight", "lm_head.weight", "language_model.lm_head.weight"};
    int pick = -1;
    for (int i = 0; i < 3 && pick < 0; i++) {
        char probe[128];
        snprintf(probe, sizeof probe, "%sembed_tokens.weight", prefixes[i]);
        if (mmc_st_find(w, probe)) pick = i;
    }
    if (pick < 0) {
        mmc_st_close(w);
        return mmc_error(MMC_ERR_NOT_FOUND, "%s: no embed_tokens.weight under any known prefix "
                         "(model., model.language_model., language_model.model.)", dir);
    }
    st = mmc_qwen2_load_from(w, &cfg, prefixes[pick], heads[pick], trainable, out);
    if (st) { mmc_st_close(w); return mmc_error_prefix(st, "%s", dir); }
    if (trainable) mmc_st_close(w);
    else (*out)->st = w;
    return MMC_OK;
}

/* ------------------------------------------------------------------ tensor parallelism */
mmc_status mmc_qwen2_tp_check(const mmc_qwen2_config *c, int tp, const char *what) {
    if (tp <= 1) return MMC_OK;
    const char *why = NULL, *key = NULL;
    int64_t v = 0;
    if (c->num_kv_heads % tp) key = "num_key_value_heads", v = c->num_kv_heads, why = "each rank must hold whole KV heads";
    else if (c->num_heads % tp) key = "num_attention_heads", v = c->num_heads, why = "each rank must hold whole query heads";
    else if (c->intermediate_size % tp) key = "intermediate_size", v = c->intermediate_size,
        why = "gate/up rows and down columns are split evenly";
    else if (c->vocab_size % tp) key = "vocab_size", v = c->vocab_size,
        why = "the embedding and lm_head rows (vocab-parallel) are split evenly; pad the vocabulary to a multiple of "
              "tensor_parallel (Megatron's make-vocab-size-divisible-by) in the checkpoint";
    if (!key) return MMC_OK;
    char ok[160] = "";
    size_t len = 0;
    int64_t g = c->num_kv_heads;   /* suggest the sizes that divide every split quantity */
    for (int d = 1; d <= 64 && d <= g; d++)
        if (!(c->num_kv_heads % d) && !(c->num_heads % d) && !(c->intermediate_size % d) && !(c->vocab_size % d))
            len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? (d * 2 > g ? " or " : ", ") : "", d);
    return mmc_error(MMC_ERR_INVALID, "tensor_parallel %d does not divide %s %lld of %s: %s; use tensor_parallel %s",
                     tp, key, (long long)v, what ? what : "the language model", why, ok);
}

/* A model holding this rank's slices: from the checkpoint st (only the slices are read), or
 * from a full model (its tensors sliced; used for random init, so that a tp run starts from
 * the same weights as a single-process one). */
static mmc_status tp_build(const mmc_qwen2_config *cfg, mmc_comm *tp, const mmc_st *st, const char *prefix,
                           const char *lm_head_name, mmc_qwen2 *full, bool trainable, mmc_qwen2 **out) {
    *out = NULL;
    const int P = mmc_comm_size(tp), r = mmc_comm_rank(tp);
    mmc_status stt = mmc_qwen2_tp_check(cfg, P, NULL);
    if (stt) return stt;
    wspec *s, *fs = NULL;
    int n;
    mmc_qwen2 *m = alloc_model(cfg, &s, &n);
    if (!m) return mmc_error(MMC_ERR_OOM, "out of memory allocating a Qwen2 model");
    int cap = 2 + 16 * (int)cfg->num_layers + 2 + (cfg->moe ? mmc_moe_param_count(cfg->moe) : 0);
    m->param_split = calloc((size_t)cap, 1);
    if (full) {
        fs = calloc((size_t)cap, sizeof *fs);
        if (fs) build_specs(full, fs);
    }
    size_t errcap = 8192;
    char *errs = calloc(1, errcap);
    if (!m->param_split || !errs || (full && !fs)) {
        free(s); free(fs); free(errs); mmc_qwen2_free(m);
        return mmc_error(MMC_ERR_OOM, "out of memory allocating a Qwen2 model");
    }
    m->tp = tp;
    int bad = 0;
    for (int i = 0; i <= n; i++) {
        /* i == n: lm_head, unless tied */
        const char *nm = i < n ? s[i].name : cfg->internlm2 ? "output.weight" : "lm_head.weight";
        int split = i < n ? s[i].split : 0;
        mmc_tensor **slot = i < n ? s[i].slot : &m->lm_head;
        int64_t shape[2] = {cfg->vocab_size, cfg->hidden_size};
        if (i < n) shape[0] = s[i].shape[0], shape[1] = s[i].shape[1];
        int nd = i < n ? s[i].ndim : 2;
        if (i == n && (full ? full->lm_head == full->embed
                            : cfg->tie_word_embeddings && !mmc_st_find(st, lm_head_name))) {
            m->lm_head = m->embed;
            break;
        }
        if (full) {
            const mmc_tensor *src = i < n ? *fs[i].slot : full->lm_head;
            int64_t local[2];
            mmc_tp_local_shape(nd, shape, split, P, local);
            mmc_tensor *t = mmc_tensor_new(MMC_F32, nd, local);
            if (!t) { bad++; continue; }
            MMC_CHECK(src->dtype == MMC_F32 && mmc_is_contiguous(src), "tp_build: full model must be f32");
            mmc_tp_take_slice(src->data, nd, shape, split, r, P, t->data);
            if (trainable) t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
            *slot = t;
        } else {
            char fulln[256];
            if (i < n) snprintf(fulln, sizeof fulln, "%s%s", prefix, nm);
            else snprintf(fulln, sizeof fulln, "%s", lm_head_name);
            if (mmc_tp_bind(st, fulln, nd, shape, split, tp, trainable, slot, errs, errcap) != MMC_OK) { bad++; continue; }
        }
        m->param_split[m->n_params] = (signed char)split;
        mmc_qwen2_register_param(m, *slot, nm);
    }
    if (cfg->moe) bad += mmc_moe_bind_tp(m, st, prefix, full, trainable, errs, errcap);   /* Qwen2-MoE's blocks */
    free(s);
    free(fs);
    if (bad) {
        mmc_error(MMC_ERR_FORMAT, "Qwen2 weights (tensor-parallel rank %d of %d): %d problem%s (prefix '%s'):%s", r, P,
                  bad, bad > 1 ? "s" : "", prefix ? prefix : "", errs);
        free(errs);
        mmc_qwen2_free(m);
        return MMC_ERR_FORMAT;
    }
    free(errs);
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        mmc_qwen2_layer *L = &m->layers[l];
        L->tp = tp;
        L->q.out_features /= P; L->k.out_features /= P; L->v.out_features /= P;
        L->qkv.out_features /= P;   /* (InternLM2's packed wqkv: whole KV groups) */
        L->o.in_features /= P;
        L->gate.out_features /= P; L->up.out_features /= P; L->down.in_features /= P;
    }
    m->cfg.dtype = MMC_F32;
    *out = m;
    return MMC_OK;
}

mmc_status mmc_qwen2_load_tp(const char *dir, const mmc_qwen2_config *cfg, mmc_comm *tp, bool trainable,
                             mmc_qwen2 **out) {
    *out = NULL;
    mmc_st *w = NULL;
    mmc_status st;
    if ((st = mmc_st_open(dir, &w))) return st;
    static const char *prefixes[] = {"model.", "model.language_model.", "language_model.model."};
    static const char *heads[] = {"lm_head.weight", "lm_head.weight", "language_model.lm_head.weight"};
    int pick = -1;
    for (int i = 0; i < 3 && pick < 0; i++) {
        char probe[128];
        snprintf(probe, sizeof probe, "%sembed_tokens.weight", prefixes[i]);
        if (mmc_st_find(w, probe)) pick = i;
    }
    if (pick < 0) st = mmc_error(MMC_ERR_NOT_FOUND, "%s: no embed_tokens.weight under any known prefix", dir);
    else st = tp_build(cfg, tp, w, prefixes[pick], heads[pick], NULL, trainable, out);
    mmc_st_close(w);   /* every slice was copied out */
    return st ? mmc_error_prefix(st, "%s", dir) : MMC_OK;
}

mmc_status mmc_qwen2_load_from_tp(mmc_st *st, const mmc_qwen2_config *cfg, const char *prefix, const char *lm_head_name,
                                  mmc_comm *tp, bool trainable, mmc_qwen2 **out) {
    return tp_build(cfg, tp, st, prefix, lm_head_name, NULL, trainable, out);
}

mmc_status mmc_qwen2_shard_tp(mmc_qwen2 *full, mmc_comm *tp, mmc_qwen2 **out) {
    return tp_build(&full->cfg, tp, NULL, NULL, NULL, full, true, out);
}

mmc_status mmc_qwen2_shard_tp_cfg(const mmc_qwen2_config *cfg, mmc_qwen2 *full, mmc_comm *tp, mmc_qwen2 **out) {
    return tp_build(cfg, tp, NULL, NULL, NULL, full, true, out);
}

mmc_status mmc_qwen2_gather_weights(mmc_qwen2 *m, mmc_tensor **full) {
    for (int i = 0; i < m->n_params; i++) full[i] = NULL;
    const int P = m->tp ? mmc_comm_size(m->tp) : 1;
    mmc_status st = MMC_OK;
    for (int i = 0; i < m->n_params && !st; i++) {
        const mmc_tensor *p = m->params[i];
        int sp = m->param_split ? m->param_split[i] : -1;
        int64_t shape[MMC_MAX_DIMS];
        memcpy(shape, p->shape, sizeof shape);
        if (sp == MMC_TP_FUSED3) shape[0] *= P;
        else if (sp >= 0) shape[sp] *= P;
        if (!(full[i] = mmc_tensor_new(MMC_F32, p->ndim, shape))) { st = MMC_ERR_OOM; break; }
        snprintf(full[i]->name, sizeof full[i]->name, "%s", p->name);
        st = mmc_tp_gather(m->tp, p, sp, full[i]);
    }
    if (st) for (int i = 0; i < m->n_params; i++) { mmc_tensor_free(full[i]); full[i] = NULL; }
    return st;
}

void mmc_qwen2_free(mmc_qwen2 *m) {
    if (!m) return;
    mmc_lora_free(m->adapter);   /* detaches from the layers, so before they go */
    for (int64_t i = 0; m->layers && i < m->cfg.num_layers; i++) {
        mmc_qwen2_layer *L = &m->layers[i];
        mmc_linear_w *ls[8] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down, &L->qkv};
        for (int j = 0; j < 8; j++) mmc_linear_quant_free(ls[j]), mmc_linear_packed_free(ls[j]);
    }
    for (int i = 0; i < m->n_params; i++) mmc_tensor_free(m->params[i]);
    mmc_moe_free(m->moe);
    free(m->param_split);
    free(m->params);
    free(m->param_names);
    free(m->layers);
    mmc_st_close(m->st);
    free(m->repack);
    free(m);
}

mmc_status mmc_qwen2_linears(mmc_qwen2 *m, const char *prefix, mmc_module_list *out) {
    static const char *const nm[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                      "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    static const char *const nm_internlm2[7] = {"attention.wqkv", NULL, NULL, "attention.wo", "feed_forward.w1",
                                                "feed_forward.w3", "feed_forward.w2"};
    const char *const *names = m->cfg.internlm2 ? nm_internlm2 : nm;
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        mmc_qwen2_layer *L = &m->layers[i];
        mmc_linear_w *ls[7] = {m->cfg.internlm2 ? &L->qkv : &L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (int j = 0; j < 7; j++) {
            if (!names[j] || (!ls[j]->w && !ls[j]->q && !ls[j]->q8 && !ls[j]->pk)) continue;   /* a Qwen2-MoE sparse layer's dense MLP */
            char name[MMC_MODULE_NAME];
            snprintf(name, sizeof name, "%slayers.%lld.%s", prefix, (long long)i, names[j]);
            mmc_status st = mmc_module_list_add(out, ls[j], name);
            if (st) return st;
        }
        if (L->moe) {
            char lp[MMC_MODULE_NAME];
            snprintf(lp, sizeof lp, "%slayers.%lld.", prefix, (long long)i);
            mmc_status st = mmc_moe_linears(L->moe, lp, out);
            if (st) return st;
        }
    }
    return MMC_OK;
}

mmc_status mmc_qwen2_attach_adapter(mmc_qwen2 *m, const char *adapter_dir) {
    if (m->adapter) return mmc_error(MMC_ERR_INVALID, "%s: the model already has an adapter", adapter_dir);
    mmc_module_list ml = {0};
    mmc_status st = mmc_qwen2_linears(m, "model.", &ml);
    if (!st) st = mmc_lora_load(adapter_dir, &ml, false, &m->adapter);
    mmc_module_list_free(&ml);
    return st;
}

mmc_status mmc_qwen2_quantize_nf4(mmc_qwen2 *m, bool double_quant) {
    mmc_module_list ml = {0};
    mmc_status st = mmc_qwen2_linears(m, "", &ml);
    /* tp: the parameter list shrinks; each survivor keeps its split (matched by tensor) */
    const int n0 = m->n_params;
    mmc_tensor **was = m->param_split ? malloc(sizeof *was * (size_t)(n0 + 1)) : NULL;
    signed char *split = m->param_split ? malloc((size_t)n0 + 1) : NULL;
    if (m->param_split && (!was || !split)) st = mmc_error(MMC_ERR_OOM, "out of memory");
    if (!st && was) {
        memcpy(was, m->params, sizeof *was * (size_t)n0);
        memcpy(split, m->param_split, (size_t)n0);
    }
    if (!st) st = mmc_nf4_quantize_linears(ml.mods, ml.n, double_quant, m->params, m->param_names, &m->n_params);
    for (int i = 0; !st && was && i < m->n_params; i++)
        for (int k = 0; k < n0; k++)
            if (was[k] == m->params[i]) { m->param_split[i] = split[k]; break; }
    free(was);
    free(split);
    mmc_module_list_free(&ml);
    return st;
}

mmc_status mmc_qwen2_quantize(mmc_qwen2 *m, int mode, int *n_linears, int64_t *bytes_before, int64_t *bytes_after) {
    mmc_module_list ml = {0};
    mmc_status st = mmc_qwen2_linears(m, "", &ml);
    if (n_linears) *n_linears = ml.n;
    if (!st) st = mmc_quantize_linears(ml.mods, ml.n, (mmc_quant_mode)mode, m->params, m->param_names, &m->n_params,
                                       bytes_before, bytes_after);
    mmc_module_list_free(&ml);
    return st;
}

mmc_status mmc_qwen2_prepack(mmc_qwen2 *m, int *n_linears, int64_t *bytes_before, int64_t *bytes_after) {
    if (!mmc_prepack_enabled() || m->tp) return MMC_OK;   /* tensor parallel: shards stay as they are */
    /* the dense projections (MoE experts keep their grouped GEMM over the unpacked weights) */
    mmc_linear_w **ls = malloc(sizeof *ls * (size_t)(8 * m->cfg.num_layers + 1));
    if (!ls) return mmc_error(MMC_ERR_OOM, "out of memory");
    int n = 0;
    for (int64_t i = 0; i < m->cfg.num_layers; i++) {
        mmc_qwen2_layer *L = &m->layers[i];
        mmc_linear_w *l8[8] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down, &L->qkv};
        for (int j = 0; j < 8; j++) ls[n++] = l8[j];
    }
    mmc_status st = mmc_prepack_linears(ls, n, m->params, m->param_names, &m->n_params, n_linears, bytes_before,
                                        bytes_after);
    free(ls);
    return st;
}

int64_t mmc_qwen2_param_count(const mmc_qwen2 *m) {
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += mmc_numel(m->params[i]);
    return n;
}

/* ------------------------------------------------------------------ KV cache */
mmc_status mmc_kv_cache_init(mmc_kv_cache *kv, int n_layers, int64_t batch, int64_t kv_heads,
                             int64_t head_dim, int64_t reserve) {
    memset(kv, 0, sizeof *kv);
    kv->n_layers = n_layers;
    kv->batch = batch;
    kv->kv_heads = kv_heads;
    kv->head_dim = head_dim;
    kv->k = calloc((size_t)n_layers, sizeof *kv->k);
    kv->v = calloc((size_t)n_layers, sizeof *kv->v);
    if (!kv->k || !kv->v) return mmc_error(MMC_ERR_OOM, "out of memory allocating the KV cache");
    return mmc_kv_cache_reserve(kv, reserve);
}

mmc_status mmc_kv_cache_reserve(mmc_kv_cache *kv, int64_t n) {
    if (n <= kv->cap) return MMC_OK;
    int64_t cap = (n + MMC_KV_BLOCK - 1) / MMC_KV_BLOCK * MMC_KV_BLOCK;
    for (int l = 0; l < kv->n_layers; l++) {
        for (int w = 0; w < 2; w++) {
            mmc_tensor **slot = w ? &kv->v[l] : &kv->k[l];
            mmc_tensor *t = mmc_tensor_new(MMC_F32, 4, MMC_SHAPE(kv->batch, cap, kv->kv_heads, kv->head_dim));
            if (!t) return mmc_error(MMC_ERR_OOM, "out of memory growing the KV cache to %lld positions",
                                     (long long)cap);
            if (*slot) {
                size_t row = (size_t)(kv->kv_heads * kv->head_dim) * sizeof(float);
                for (int64_t b = 0; b < kv->batch; b++)
                    memcpy((float *)t->data + b * cap * kv->kv_heads * kv->head_dim,
                           (float *)(*slot)->data + b * kv->cap * kv->kv_heads * kv->head_dim,
                           row * (size_t)kv->len);
                mmc_tensor_free(*slot);
            }
            *slot = t;
        }
    }
    kv->cap = cap;
    return MMC_OK;
}

void mmc_kv_cache_free(mmc_kv_cache *kv) {
    for (int l = 0; l < kv->n_layers; l++) {
        if (kv->k) mmc_tensor_free(kv->k[l]);
        if (kv->v) mmc_tensor_free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof *kv);
}

/* Append k/v [B, T, Hkv, D] at positions [len, len + T) and return views over [0, len + T). */
static void kv_append(mmc_ctx *ctx, mmc_kv_cache *kv, int layer, mmc_tensor *k, mmc_tensor *v,
                      mmc_tensor **k_all, mmc_tensor **v_all) {
    int64_t B = k->shape[0], T = k->shape[1], row = kv->kv_heads * kv->head_dim;
    MMC_CHECK(kv->len + T <= kv->cap, "KV cache: %lld + %lld positions exceed the reserved %lld",
              (long long)kv->len, (long long)T, (long long)kv->cap);
    mmc_tensor *src[2] = {mmc_contiguous(ctx, k), mmc_contiguous(ctx, v)};
    mmc_tensor *dst[2] = {kv->k[layer], kv->v[layer]};
    for (int w = 0; w < 2; w++)
        for (int64_t b = 0; b < B; b++)
            memcpy((float *)dst[w]->data + (b * kv->cap + kv->len) * row,
                   (float *)src[w]->data + b * T * row, (size_t)(T * row) * sizeof(float));
    *k_all = mmc_narrow(ctx, kv->k[layer], 1, 0, kv->len + T);
    *v_all = mmc_narrow(ctx, kv->v[layer], 1, 0, kv->len + T);
}

/* ------------------------------------------------------------------ forward */
mmc_tensor *mmc_qwen2_embed(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *ids) {
    if (m->tp) return mmc_tp_embedding(ctx, m->tp, m->embed, ids, mmc_comm_rank(m->tp) * m->embed->shape[0],
                                       m->cfg.has_pad_token ? m->cfg.pad_token_id : -1);
    return mmc_embedding_padded(ctx, m->embed, ids, m->cfg.has_pad_token ? m->cfg.pad_token_id : -1);
}

/* The attention core of a layer: rope on q [B, T, Hq, D] and k [B, T, Hkv, D], the KV cache,
 * then attention (plain, Ulysses or ring) -> [B, T, Hq*D], before the o projection. */
static mmc_tensor *attention_core(mmc_ctx *ctx, mmc_qwen2_layer *L, mmc_tensor *q, mmc_tensor *k, mmc_tensor *v,
                                  mmc_tensor *cos, mmc_tensor *sin, const mmc_attn_opts *attn, mmc_kv_cache *kv,
                                  int layer_idx) {
    const int64_t B = q->shape[0], T = q->shape[1], Hq = q->shape[2], D = q->shape[3];
    q = mmc_rope(ctx, q, cos, sin);
    k = mmc_rope(ctx, k, cos, sin);
    if (kv) kv_append(ctx, kv, layer_idx, k, v, &k, &v);                         /* [B, S, Hkv, D] */
    mmc_tensor *a;
    if (L->cp && L->cp_mode == MMC_CP_RING) {   /* ring attention (mmc_cp.h): K/V blocks round the group */
        a = mmc_cp_ring_attention(ctx, L->cp, q, k, v, attn);                      /* [B, T, Hq, D] */
    } else if (L->cp) {   /* Ulysses (mmc_cp.h): T is this rank's shard; attend over the whole sequence on H/C heads */
        q = mmc_cp_seq_to_head(ctx, L->cp, q);                                   /* [B, T*C, Hq/C, D] */
        k = mmc_cp_seq_to_head(ctx, L->cp, mmc_cp_expand_kv(ctx, L->cp, k));     /* (collectives in a fixed order) */
        v = mmc_cp_seq_to_head(ctx, L->cp, mmc_cp_expand_kv(ctx, L->cp, v));     /* [B, T*C, max(Hkv/C, 1), D] */
        a = mmc_cp_head_to_seq(ctx, L->cp, mmc_attention(ctx, q, k, v, attn));   /* [B, T, Hq, D] */
    } else {
        a = mmc_attention(ctx, q, k, v, attn);                                   /* [B, T, Hq, D] */
    }
    return mmc_reshape(ctx, a, 3, MMC_SHAPE(B, T, Hq * D));                      /* [B, T, Hq*D] */
}

/* selective recompute (model.recompute: attention): the core above under mmc_checkpoint, so
 * only q, k, v (the projections' outputs) and the core's output are kept; backward re-runs
 * rope and attention (and a ring's or Ulysses' exchanges, in the same order) */
typedef struct {
    mmc_qwen2_layer *L;
    mmc_tensor *cos, *sin;
    mmc_attn_opts attn;   /* a copy: the caller's may be gone when backward recomputes */
    int layer;
} core_args;

static mmc_tensor *core_fn(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in) {
    core_args *a = user;
    (void)n_in;
    return attention_core(ctx, a->L, in[0], in[1], in[2], a->cos, a->sin, &a->attn, NULL, a->layer);
}

/* The layer's self-attention half on the residual stream x [B, T, C]: o(attention(rope(q),
 * rope(k), v)) of rmsnorm(x), through the KV cache when given; -> [B, T, C], not yet added. */
static mmc_tensor *self_attention(mmc_ctx *ctx, const mmc_qwen2_config *c, mmc_qwen2_layer *L, mmc_tensor *x,
                                  mmc_tensor *cos, mmc_tensor *sin, const mmc_attn_opts *attn,
                                  mmc_kv_cache *kv, int layer_idx) {
    const int64_t D = c->head_dim;
    /* heads held here: all of them, or with tensor parallelism Hq/tp and Hkv/tp (whole GQA groups) */
    const int64_t Hq = L->q.out_features / D, Hkv = L->k.out_features / D;
    mmc_tensor *h = mmc_rmsnorm(ctx, x, L->input_norm, (float)c->rms_norm_eps);  /* [B, T, C] ([B, T/tp, C] with sp) */
    h = L->sp ? mmc_tp_sp_gather(ctx, L->tp, h) : mmc_tp_copy(ctx, L->tp, h);    /* f: no-op without tp */
    const int64_t B = h->shape[0], T = h->shape[1];
    mmc_tensor *q, *k, *v;
    if (c->internlm2) {   /* InternLM2's packed wqkv, split per kv-head group (internlm2.c) */
        mmc_internlm2_split_qkv(ctx, mmc_nn_linear(ctx, h, &L->qkv), Hq, Hkv, D, &q, &k, &v);
    } else {
        q = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->q), 4, MMC_SHAPE(B, T, Hq, D));     /* [B, T, Hq, D] */
        k = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->k), 4, MMC_SHAPE(B, T, Hkv, D));    /* [B, T, Hkv, D] */
        v = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &L->v), 4, MMC_SHAPE(B, T, Hkv, D));    /* [B, T, Hkv, D] */
    }
    mmc_tensor *a;                                                               /* [B, T, Hq*D] */
    if (L->recompute_attn && !kv && mmc_grad_enabled(ctx)) {
        core_args *ca = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *ca);
        *ca = (core_args){L, cos, sin, *attn, layer_idx};
        mmc_tensor *in[3] = {q, k, v};
        a = mmc_checkpoint(ctx, core_fn, ca, in, 3);
    } else {
        a = attention_core(ctx, L, q, k, v, cos, sin, attn, kv, layer_idx);
    }
    if (L->cp) return mmc_nn_linear(ctx, a, &L->o);                              /* [B, T, C] */
    if (L->sp) return mmc_tp_row_linear_sp(ctx, L->tp, a, &L->o);               /* [B, T/tp, C] */
    return L->tp ? mmc_tp_row_linear_chunked(ctx, L->tp, a, &L->o, L->tp_chunks) : mmc_nn_linear(ctx, a, &L->o);
}

/* The MLP half on normed rows h [..., C]: down(silu(gate(h)) * up(h)) -> [..., C]. */
static mmc_tensor *mlp(mmc_ctx *ctx, mmc_qwen2_layer *L, mmc_tensor *h) {
    if (L->moe) return mmc_moe_block_forward(ctx, L->moe, h);   /* Qwen2-MoE sparse block */
    if (L->tp) {   /* column-parallel gate/up (f before), row-parallel down (g after) */
        h = L->sp ? mmc_tp_sp_gather(ctx, L->tp, h) : mmc_tp_copy(ctx, L->tp, h);
        mmc_tensor *a = mmc_swiglu(ctx, mmc_nn_linear(ctx, h, &L->gate), mmc_nn_linear(ctx, h, &L->up));
        return L->sp ? mmc_tp_row_linear_sp(ctx, L->tp, a, &L->down)
                     : mmc_tp_row_linear_chunked(ctx, L->tp, a, &L->down, L->tp_chunks);
    }
    return mmc_nn_linear(ctx, mmc_swiglu(ctx, mmc_nn_linear(ctx, h, &L->gate), mmc_nn_linear(ctx, h, &L->up)),
                         &L->down);
}

mmc_tensor *mmc_qwen2_layer_forward(mmc_ctx *ctx, const mmc_qwen2_config *c, mmc_qwen2_layer *L,
                                    mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin,
                                    const mmc_attn_opts *attn, mmc_kv_cache *kv, int layer_idx) {
    mmc_params_begin(ctx, L);   /* ZeRO-3: the layer's parameters are gathered here */
    x = mmc_add(ctx, x, self_attention(ctx, c, L, x, cos, sin, attn, kv, layer_idx));
    x = mmc_add(ctx, x, mlp(ctx, L, mmc_rmsnorm(ctx, x, L->post_norm, (float)c->rms_norm_eps)));
    mmc_params_end(ctx, L);     /* ... and may be freed from here */
    return x;
}

/* ------------------------------------------------------------------ inference forward
 * Without autograd nothing has to outlive its use, so the inference form of a layer keeps
 * peak memory near one hidden-state tensor: the residual stream x is updated in place, the
 * attention half runs under an arena mark released at its end, and the MLP (whose
 * [rows, intermediate] tensors dominate) runs over chunks of rows. Every op is the same as
 * in mmc_qwen2_layer_forward and each output row comes out of the same kernels in the same
 * order, so results do not change. */

int64_t mmc_infer_chunk_rows(int64_t rows, int64_t row_bytes) {
    int64_t want = (int64_t)(24 << 20) / (row_bytes > 0 ? row_bytes : 1);
    if (want < 512) want = 512;
    const char *cap = getenv("MMC_INFER_CHUNK_ROWS");
    if (cap && atoll(cap) > 0) want = atoll(cap);
    int64_t n = (rows + want - 1) / want;
    return n > 1 ? (rows + n - 1) / n : rows;
}

void mmc_infer_residual_add(mmc_ctx *ctx, float *restrict x, mmc_tensor *y) {
    const float *restrict yd = mmc_contiguous(ctx, y)->data;
    const int64_t n = mmc_numel(y);
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] += yd[i];
}

void mmc_qwen2_layer_forward_infer(mmc_ctx *ctx, const mmc_qwen2_config *c, mmc_qwen2_layer *L,
                                   mmc_tensor *x, mmc_tensor *cos, mmc_tensor *sin,
                                   const mmc_attn_opts *attn, mmc_kv_cache *kv, int layer_idx) {
    MMC_CHECK(!mmc_grad_enabled(ctx), "mmc_qwen2_layer_forward_infer runs without autograd");
    MMC_CHECK(x->dtype == MMC_F32 && x->ndim == 3 && mmc_is_contiguous(x) && x->shape[2] == c->hidden_size,
              "mmc_qwen2_layer_forward_infer: x must be contiguous f32 [B, T, C]");
    mmc_arena *ar = mmc_ctx_arena(ctx);
    const int64_t B = x->shape[0], T = x->shape[1], C = c->hidden_size, BT = B * T;
    const float eps = (float)c->rms_norm_eps;
    float *xd = x->data;
    /* self-attention block, its temporaries released at its end */
    mmc_arena_mark mk = mmc_arena_get_mark(ar);
    mmc_infer_residual_add(ctx, xd, self_attention(ctx, c, L, x, cos, sin, attn, kv, layer_idx));
    mmc_arena_release(ar, mk);
    /* MLP block over chunks of rows: x += down(silu(gate(n)) * up(n)), n = rmsnorm(x) */
    mmc_tensor *x2 = mmc_reshape(ctx, x, 2, MMC_SHAPE(BT, C));                  /* [B*T, C] */
    /* a chunk holds gate, up and their product: 3 x [rows, F] */
    const int64_t R = mmc_infer_chunk_rows(BT, 3 * c->intermediate_size * (int64_t)sizeof(float));
    mk = mmc_arena_get_mark(ar);
    for (int64_t r0 = 0; r0 < BT; r0 += R) {
        const int64_t n = BT - r0 < R ? BT - r0 : R;
        mmc_tensor *hr = mmc_rmsnorm(ctx, mmc_narrow(ctx, x2, 0, r0, n), L->post_norm, eps);  /* [n, C] */
        mmc_infer_residual_add(ctx, xd + r0 * C, mlp(ctx, L, hr));
        mmc_arena_release(ar, mk);
    }
}

typedef struct {
    mmc_qwen2 *m;
    int layer;
    mmc_tensor *cos, *sin;
    mmc_attn_opts attn;   /* a copy: the caller's may be gone when backward recomputes */
} block_args;

static mmc_tensor *block_fn(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in) {
    block_args *a = user;
    (void)n_in;
    return mmc_qwen2_layer_forward(ctx, &a->m->cfg, &a->m->layers[a->layer], in[0], a->cos, a->sin,
                                   &a->attn, NULL, a->layer);
}

mmc_status mmc_qwen2_forward_embeds(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *embeds, mmc_kv_cache *kv,
                                    mmc_tensor **hidden) {
    const int64_t T = embeds->shape[1], start = kv ? kv->len : 0;
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
    for (int64_t t = 0; t < T; t++) ((int64_t *)pos->data)[t] = start + t;
    mmc_tensor *cos, *sin;
    mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);                    /* [T, D] */
    mmc_status st;
    if (kv && (st = mmc_kv_cache_reserve(kv, kv->len + T))) return st;
    mmc_attn_opts ao = {.causal = true};
    *hidden = mmc_qwen2_forward(ctx, m, embeds, cos, sin, &ao, kv);
    return MMC_OK;
}

mmc_tensor *mmc_qwen2_forward(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *x, mmc_tensor *cos,
                              mmc_tensor *sin, const mmc_attn_opts *attn, mmc_kv_cache *kv) {
    /* sequence parallelism (training forwards with tp): the residual stream is this rank's
     * slice of the sequence from here to the final norm */
    const bool sp = m->tp && m->sp && mmc_grad_enabled(ctx);
    m->sp_active = sp;
    for (int l = 0; l < m->cfg.num_layers; l++) m->layers[l].sp = sp;
    if (!mmc_grad_enabled(ctx)) {
        /* inference: one owned copy of the residual stream, updated layer by layer in place */
        mmc_tensor *xo = mmc_new(ctx, MMC_F32, 3, x->shape);
        mmc_tensor *xc = mmc_contiguous(ctx, x);
        memcpy(xo->data, xc->data, mmc_nbytes(xo));
        for (int l = 0; l < m->cfg.num_layers; l++)
            mmc_qwen2_layer_forward_infer(ctx, &m->cfg, &m->layers[l], xo, cos, sin, attn, kv, l);
        if (kv) kv->len += xo->shape[1];
        return mmc_rmsnorm(ctx, xo, m->norm, (float)m->cfg.rms_norm_eps);
    }
    bool ckpt = m->recompute && !kv && mmc_grad_enabled(ctx);
    if (sp) x = mmc_tp_sp_split(ctx, m->tp, x);                                  /* [B, T/tp, C] */
    block_args *args = ckpt ? mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *args * (size_t)m->cfg.num_layers) : NULL;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        /* selective recompute and offload: the first recompute_layers / offload_layers layers */
        const bool sel = m->recompute_layers <= 0 || l < m->recompute_layers;
        const bool off = !kv && l < m->offload_layers;
        m->layers[l].recompute_attn = m->recompute_attn && sel;
        if (off) MMC_CHECK(mmc_ctx_offload_begin(ctx, m->offload_dir) == MMC_OK, "%s", mmc_last_error());
        if (ckpt && sel) {
            args[l] = (block_args){m, l, cos, sin, *attn};
            x = mmc_checkpoint(ctx, block_fn, &args[l], &x, 1);
        } else {
            x = mmc_qwen2_layer_forward(ctx, &m->cfg, &m->layers[l], x, cos, sin, attn, kv, l);
        }
        if (off) mmc_ctx_offload_end(ctx);
    }
    if (kv) kv->len += x->shape[1];
    mmc_tensor *h = mmc_rmsnorm(ctx, x, m->norm, (float)m->cfg.rms_norm_eps);
    return sp ? mmc_tp_sp_gather(ctx, m->tp, h) : h;   /* sp: gathered for the column-parallel lm_head */
}

mmc_tensor *mmc_qwen2_logits(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *hidden) {
    if (m->tp) return mmc_tp_gather_last(ctx, m->tp, mmc_qwen2_logits_local(ctx, m, hidden));
    return mmc_linear(ctx, hidden, m->lm_head, NULL);
}

mmc_tensor *mmc_qwen2_logits_local(mmc_ctx *ctx, mmc_qwen2 *m, mmc_tensor *hidden) {
    if (!m->tp) return mmc_linear(ctx, hidden, m->lm_head, NULL);
    /* column-parallel; after a sequence-parallel forward the all-gather has played f's part */
    return mmc_linear(ctx, m->sp_active ? hidden : mmc_tp_copy(ctx, m->tp, hidden), m->lm_head, NULL);
}

/* ------------------------------------------------------------------ rope variants */
/* transformers' _compute_*_rope_parameters, in float32 as there: the default inverse
 * frequencies, then linear: inv / factor; dynamic (NTK): a larger base once the sequence
 * outgrows max_position_embeddings (transformers keeps the grown table in the module until a
 * short sequence resets it; within one generation positions only grow, so deciding from
 * max(pos) + 1 alone gives the same tables); llama3: low frequencies (long wavelengths) divided by
 * factor, high ones kept, the band between interpolated smoothly. Python scalars meet f32
 * tensors as f32 (x / t is reciprocal(t) * x there). */
void mmc_qwen2_rope_table(mmc_ctx *ctx, const mmc_qwen2_config *c, const mmc_tensor *pos, mmc_tensor **cos,
                          mmc_tensor **sin) {
    const int D = (int)c->head_dim;
    if (c->rope_kind == MMC_ROPE_DEFAULT) {
        mmc_rope_table_1d(ctx, pos, D, c->rope_theta, cos, sin);
        return;
    }
    float inv[D / 2];
    if (c->rope_kind == MMC_ROPE_DYNAMIC) {
        int64_t seq = 0, n = mmc_numel(pos);
        for (int64_t i = 0; i < n; i++) {
            int64_t p = pos->dtype == MMC_I32 ? ((const int32_t *)pos->data)[i] : ((const int64_t *)pos->data)[i];
            if (p + 1 > seq) seq = p + 1;
        }
        /* seq_len is a tensor there (max(position_ids) + 1), so the new base is float32 */
        float base = (float)c->rope_theta;
        if (seq > c->rope_original_max_pos)
            base = (float)c->rope_theta * powf((float)c->rope_factor * (float)seq / (float)c->rope_original_max_pos -
                                               (float)(c->rope_factor - 1.0), (float)((double)D / (double)(D - 2)));
        mmc_rope_inv_freq(inv, D, base);
    } else {
        mmc_rope_inv_freq(inv, D, c->rope_theta);
    }
    if (c->rope_kind == MMC_ROPE_LINEAR) {
        for (int j = 0; j < D / 2; j++) inv[j] = inv[j] / (float)c->rope_factor;
    } else if (c->rope_kind == MMC_ROPE_LLAMA3) {
        const float factor = (float)c->rope_factor, lo = (float)c->rope_low_freq_factor,
                    hi = (float)c->rope_high_freq_factor;
        const double old_len = (double)c->rope_original_max_pos;
        const float lo_wavelen = (float)(old_len / c->rope_low_freq_factor),
                    hi_wavelen = (float)(old_len / c->rope_high_freq_factor);
        for (int j = 0; j < D / 2; j++) {
            float wavelen = (1.0f / inv[j]) * (float)(2.0 * M_PI);
            float f = wavelen > lo_wavelen ? inv[j] / factor : inv[j];
            float smooth = ((1.0f / wavelen) * (float)old_len - lo) / (hi - lo);
            float smoothed = (1.0f - smooth) * f / factor + smooth * f;
            bool medium = !(wavelen < hi_wavelen) && !(wavelen > lo_wavelen);
            inv[j] = medium ? smoothed : f;
        }
    }
    mmc_rope_table_1d_freqs(ctx, pos, D, inv, cos, sin);
}

/* ------------------------------------------------------------------ decoder interface */
/* ids [n] at the cache's end -> the last position's logits [V] */
static mmc_status qwen2_feed(mmc_ctx *ctx, mmc_qwen2 *m, const int32_t *feed, int64_t n, mmc_kv_cache *kv,
                             float **logits) {
    mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, n));
    memcpy(ids->data, feed, (size_t)n * sizeof(int32_t));
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(n));
    for (int64_t t = 0; t < n; t++) ((int64_t *)pos->data)[t] = kv->len + t;
    mmc_tensor *cos, *sin;
    mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);
    mmc_attn_opts attn = {.causal = true};
    mmc_tensor *h = mmc_qwen2_forward(ctx, m, mmc_qwen2_embed(ctx, m, ids), cos, sin, &attn, kv);
    mmc_tensor *last = mmc_contiguous(ctx, mmc_narrow(ctx, h, 1, n - 1, 1));   /* [1, 1, C] */
    *logits = mmc_qwen2_logits(ctx, m, last)->data;                           /* [1, 1, V] */
    return MMC_OK;
}

static mmc_status qwen2_prefill(mmc_ctx *ctx, void *self, const int32_t *ids, int64_t n, mmc_kv_cache *kv,
                                float **logits) {
    return qwen2_feed(ctx, self, ids, n, kv, logits);
}

static mmc_status qwen2_decode(mmc_ctx *ctx, void *self, int32_t token, mmc_kv_cache *kv, float **logits) {
    return qwen2_feed(ctx, self, &token, 1, kv, logits);
}

mmc_decoder mmc_qwen2_decoder(mmc_qwen2 *m) {
    /* dynamic NTK scaling exists to run past max_position_embeddings */
    return (mmc_decoder){.self = m, .vocab_size = m->cfg.vocab_size,
                         .max_positions = m->cfg.rope_kind == MMC_ROPE_DYNAMIC ? MMC_CONFIG_MAX_DIM
                                                                               : m->cfg.max_position_embeddings, .kv_heads = m->layers[0].k.out_features / m->cfg.head_dim,
                         .head_dim = m->cfg.head_dim, .n_layers = (int)m->cfg.num_layers,
                         .prefill = qwen2_prefill, .decode = qwen2_decode};
}
