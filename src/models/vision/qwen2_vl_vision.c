/* qwen2_vl_vision.c — the vision towers of Qwen2-VL and Qwen2.5-VL, mirroring transformers'
 * Qwen2VisionTransformerPretrainedModel (models/qwen2_vl/modeling_qwen2_vl.py) and
 * Qwen2_5_VisionTransformerPretrainedModel (models/qwen2_5_vl/modeling_qwen2_5_vl.py).
 *
 * Both: a Conv3d patch embedding with kernel == stride over the processor's pre-flattened
 * patches, 2-D axial rotary embeddings (rows on half the bands, columns on the other half),
 * pre-norm blocks of fused-qkv attention restricted to one frame of one image (cu_seqlens)
 * and an MLP, then a patch merger that concatenates spatial_merge^2 neighbouring tokens and
 * projects them to the language model's hidden size.
 * Qwen2-VL: LayerNorm, fc1 -> QuickGELU -> fc2, LayerNorm ln_q.
 * Qwen2.5-VL: RMSNorm, SwiGLU MLP with biases, ln_q an RMSNorm, and window attention: the
 * merged tokens are permuted window by window (get_vision_window_index), most blocks attend
 * inside a window and the fullatt_block_indexes blocks attend over the whole frame; the
 * merger's output is permuted back. */
#include "mmc_vl.h"
#include "mmc_tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ config */
static mmc_status rd_int(const mmc_json *j, const char *k, int64_t def, int64_t *out) {
    return mmc_json_int(j, k, def, out);
}

mmc_status mmc_vision_config_read(const mmc_json *root, mmc_vl_arch arch, mmc_vision_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = arch;
    const mmc_json *j = mmc_json_get(root, "vision_config");
    if (!j) return mmc_error(MMC_ERR_FORMAT, "config.json: 'vision_config' is missing");
    mmc_status st;
    bool q2 = arch == MMC_VL_QWEN2;
    if ((st = rd_int(j, "depth", 32, &c->depth))) return st;
    if ((st = rd_int(j, "num_heads", 16, &c->num_heads))) return st;
    if ((st = rd_int(j, "patch_size", 14, &c->patch_size))) return st;
    if ((st = rd_int(j, "temporal_patch_size", 2, &c->temporal_patch_size))) return st;
    if ((st = rd_int(j, "spatial_merge_size", 2, &c->spatial_merge_size))) return st;
    /* in_channels (5.x) or in_chans (the Hub's configs) */
    const char *cin_key = mmc_json_has(j, "in_channels") ? "in_channels" : "in_chans";
    if ((st = rd_int(j, cin_key, 3, &c->in_channels))) return st;
    if (q2) {
        if ((st = rd_int(j, "embed_dim", 1280, &c->embed_dim))) return st;
        if ((st = rd_int(j, "hidden_size", 3584, &c->out_hidden_size))) return st;
        double ratio = 4;
        if ((st = mmc_json_num(j, "mlp_ratio", 4, &ratio))) return st;
        if (!(ratio > 0 && ratio <= 1024) || c->embed_dim <= 0 || c->embed_dim > MMC_CONFIG_MAX_DIM)
            return mmc_error(MMC_ERR_FORMAT, "config.json: vision_config.mlp_ratio %g must be in (0, 1024] and "
                             "embed_dim %lld from 1 to %lld", ratio, (long long)c->embed_dim,
                             (long long)MMC_CONFIG_MAX_DIM);
        c->intermediate_size = (int64_t)((double)c->embed_dim * ratio);
    } else {
        if ((st = rd_int(j, "hidden_size", 3584, &c->embed_dim))) return st;
        if ((st = rd_int(j, "out_hidden_size", 3584, &c->out_hidden_size))) return st;
        if ((st = rd_int(j, "intermediate_size", 3420, &c->intermediate_size))) return st;
        if ((st = rd_int(j, "window_size", 112, &c->window_size))) return st;
        if ((st = mmc_json_num(j, "tokens_per_second", 4, &c->tokens_per_second))) return st;
        int64_t fa[MMC_VISION_MAX_FULLATT];
        int n = MMC_VISION_MAX_FULLATT;
        if (mmc_json_has(j, "fullatt_block_indexes")) {
            if ((st = mmc_json_int_array(j, "fullatt_block_indexes", fa, &n))) return st;
        } else {
            n = 4;
            fa[0] = 7, fa[1] = 15, fa[2] = 23, fa[3] = 31;
        }
        c->n_fullatt = n;
        for (int i = 0; i < n; i++) c->fullatt[i] = (int)fa[i];
    }
    double theta = 10000.0;
    if (mmc_json_has(j, "rope_parameters.rope_theta")) st = mmc_json_num(j, "rope_parameters.rope_theta", theta, &theta);
    else st = mmc_json_num(j, "rope_theta", theta, &theta);
    if (st) return st;
    c->rope_theta = theta;
    const char *act = NULL;
    if ((st = mmc_json_str(j, "hidden_act", q2 ? "quick_gelu" : "silu", &act))) return st;
    if (!strcmp(act, "quick_gelu")) c->act = MMC_ACT_QUICK_GELU;
    else if (!strcmp(act, "gelu")) c->act = MMC_ACT_GELU;
    else if (!strcmp(act, "gelu_pytorch_tanh") || !strcmp(act, "gelu_new")) c->act = MMC_ACT_GELU_TANH;
    else if (!strcmp(act, "silu") || !strcmp(act, "swish")) c->act = MMC_ACT_SILU;
    else return mmc_error(MMC_ERR_UNSUPPORTED, "config.json: vision_config.hidden_act '%s' is not supported "
                          "(quick_gelu, gelu, gelu_pytorch_tanh, silu)", act);
    const char *names[] = {"depth", "embed_dim/hidden_size", "num_heads", "intermediate_size/mlp_ratio",
                           "out_hidden_size/hidden_size", "in_channels", "patch_size", "temporal_patch_size",
                           "spatial_merge_size"};
    int64_t vals[] = {c->depth, c->embed_dim, c->num_heads, c->intermediate_size, c->out_hidden_size,
                      c->in_channels, c->patch_size, c->temporal_patch_size, c->spatial_merge_size};
    /* bounded so that products of sizes (C * merge^2, patch volumes, windows) fit in int64;
     * the last four are per-patch sizes: in_channels, patch, temporal patch, spatial merge */
    for (int i = 0; i < 9; i++) {
        int64_t hi = i < 5 ? MMC_CONFIG_MAX_DIM : 1024;
        if (vals[i] <= 0 || vals[i] > hi)
            return mmc_error(MMC_ERR_FORMAT, "config.json: vision_config.%s = %lld must be from 1 to %lld",
                             names[i], (long long)vals[i], (long long)hi);
    }
    if (!q2 && (c->window_size <= 0 || c->window_size > MMC_CONFIG_MAX_DIM))
        return mmc_error(MMC_ERR_FORMAT, "config.json: vision_config.window_size = %lld must be from 1 to %lld",
                         (long long)c->window_size, (long long)MMC_CONFIG_MAX_DIM);
    if (c->embed_dim % c->num_heads || (c->embed_dim / c->num_heads) % 4)
        return mmc_error(MMC_ERR_FORMAT, "config.json: vision embed dim %lld / num_heads %lld must give a head "
                         "dim that is a multiple of 4", (long long)c->embed_dim, (long long)c->num_heads);
    if (!q2 && c->window_size < c->spatial_merge_size * c->patch_size)
        return mmc_error(MMC_ERR_FORMAT, "config.json: vision_config.window_size %lld is smaller than "
                         "spatial_merge_size * patch_size = %lld", (long long)c->window_size,
                         (long long)(c->spatial_merge_size * c->patch_size));
    return MMC_OK;
}

/* ------------------------------------------------------------------ weights */
typedef struct {
    char name[96];
    mmc_tensor **slot;
    int ndim;
    int64_t shape[5];
    int split;              /* tensor parallelism: split code (mmc_tp.h), -1 replicated */
} vspec;

static int build_specs(mmc_vision *v, vspec *s) {
    const mmc_vision_config *c = &v->cfg;
    int64_t C = c->embed_dim, F = c->intermediate_size, m2 = c->spatial_merge_size * c->spatial_merge_size;
    bool q2 = c->arch == MMC_VL_QWEN2;
    int n = 0;
#define SPEC(nm, ptr, nd, ...) do { snprintf(s[n].name, sizeof s[n].name, "%s", nm); s[n].slot = (ptr); \
    s[n].ndim = nd; const int64_t sh_[] = {__VA_ARGS__}; memcpy(s[n].shape, sh_, sizeof sh_); s[n].split = -1; \
    n++; } while (0)
#define SPLIT(d) (s[n - 1].split = (d))
    SPEC("patch_embed.proj.weight", &v->patch_w, 5, C, c->in_channels, c->temporal_patch_size, c->patch_size,
         c->patch_size);
    for (int64_t i = 0; i < c->depth; i++) {
        mmc_vision_block *b = &v->blocks[i];
        char nm[96];
#define BSPEC(suffix, ptr, nd, ...) do { snprintf(nm, sizeof nm, "blocks.%lld.%s", (long long)i, suffix); \
    SPEC(nm, ptr, nd, __VA_ARGS__); } while (0)
        BSPEC("norm1.weight", &b->norm1_w, 1, C);
        if (q2) BSPEC("norm1.bias", &b->norm1_b, 1, C);
        BSPEC("norm2.weight", &b->norm2_w, 1, C);
        if (q2) BSPEC("norm2.bias", &b->norm2_b, 1, C);
        /* tensor parallelism: qkv per third on rows (whole heads), proj / fc2 / down row-parallel,
         * fc1 / gate / up column-parallel */
        BSPEC("attn.qkv.weight", &b->qkv.w, 2, 3 * C, C); SPLIT(MMC_TP_FUSED3);
        BSPEC("attn.qkv.bias", &b->qkv.b, 1, 3 * C); SPLIT(MMC_TP_FUSED3);
        BSPEC("attn.proj.weight", &b->proj.w, 2, C, C); SPLIT(1);
        BSPEC("attn.proj.bias", &b->proj.b, 1, C);
        if (q2) {
            BSPEC("mlp.fc1.weight", &b->fc1.w, 2, F, C); SPLIT(0);
            BSPEC("mlp.fc1.bias", &b->fc1.b, 1, F); SPLIT(0);
            BSPEC("mlp.fc2.weight", &b->fc2.w, 2, C, F); SPLIT(1);
            BSPEC("mlp.fc2.bias", &b->fc2.b, 1, C);
        } else {
            BSPEC("mlp.gate_proj.weight", &b->gate.w, 2, F, C); SPLIT(0);
            BSPEC("mlp.gate_proj.bias", &b->gate.b, 1, F); SPLIT(0);
            BSPEC("mlp.up_proj.weight", &b->up.w, 2, F, C); SPLIT(0);
            BSPEC("mlp.up_proj.bias", &b->up.b, 1, F); SPLIT(0);
            BSPEC("mlp.down_proj.weight", &b->down.w, 2, C, F); SPLIT(1);
            BSPEC("mlp.down_proj.bias", &b->down.b, 1, C);
        }
#undef BSPEC
    }
    SPEC("merger.ln_q.weight", &v->ln_q_w, 1, C);
    if (q2) SPEC("merger.ln_q.bias", &v->ln_q_b, 1, C);
    SPEC("merger.mlp.0.weight", &v->mlp0.w, 2, C * m2, C * m2);
    SPEC("merger.mlp.0.bias", &v->mlp0.b, 1, C * m2);
    SPEC("merger.mlp.2.weight", &v->mlp2.w, 2, c->out_hidden_size, C * m2);
    SPEC("merger.mlp.2.bias", &v->mlp2.b, 1, c->out_hidden_size);
#undef SPLIT
#undef SPEC
    return n;
}


static mmc_vision *vision_alloc(const mmc_vision_config *cfg, vspec **specs, int *n);

/* the tower's linears (those it has: Qwen2-VL fc1 / fc2, Qwen2.5-VL gate / up / down) */
static int vision_linears(mmc_vision *v, mmc_linear_w **out) {
    int n = 0;
    for (int64_t i = 0; v->blocks && i < v->cfg.depth; i++) {
        mmc_vision_block *b = &v->blocks[i];
        mmc_linear_w *ls[7] = {&b->qkv, &b->proj, &b->fc1, &b->fc2, &b->gate, &b->up, &b->down};
        for (int j = 0; j < 7; j++) out[n++] = ls[j];
    }
    out[n++] = &v->mlp0;
    out[n++] = &v->mlp2;
    return n;
}

mmc_status mmc_vision_prepack(mmc_vision *v, int *n_linears, int64_t *bytes_before, int64_t *bytes_after) {
    if (!mmc_prepack_enabled() || v->tp) return MMC_OK;
    mmc_linear_w **ls = malloc(sizeof *ls * (size_t)(7 * v->cfg.depth + 2));
    if (!ls) return mmc_error(MMC_ERR_OOM, "out of memory");
    const int n = vision_linears(v, ls);
    mmc_status st = mmc_prepack_linears(ls, n, v->params, v->param_names, &v->n_params, n_linears, bytes_before,
                                        bytes_after);
    free(ls);
    return st;
}

void mmc_vision_free(mmc_vision *v) {
    if (!v) return;
    for (int64_t i = 0; v->blocks && i < v->cfg.depth; i++) {
        mmc_vision_block *b = &v->blocks[i];
        mmc_linear_w *ls[7] = {&b->qkv, &b->proj, &b->fc1, &b->fc2, &b->gate, &b->up, &b->down};
        for (int j = 0; j < 7; j++) mmc_linear_packed_free(ls[j]);
    }
    mmc_linear_packed_free(&v->mlp0);
    mmc_linear_packed_free(&v->mlp2);
    for (int i = 0; i < v->n_params; i++) mmc_tensor_free(v->params[i]);
    free(v->param_split);
    free(v->params);
    free(v->param_names);
    free(v->blocks);
    free(v);
}

bool mmc_vision_tp_ok(const mmc_vision_config *cfg, int tp, char *why, size_t cap) {
    if (why && cap) why[0] = 0;
    if (tp <= 1) return true;
    if (cfg->num_heads % tp) {
        if (why) snprintf(why, cap, "num_heads %lld is not divisible by tensor_parallel %d", (long long)cfg->num_heads, tp);
        return false;
    }
    if (cfg->intermediate_size % tp) {
        if (why) snprintf(why, cap, "intermediate_size %lld is not divisible by tensor_parallel %d",
                          (long long)cfg->intermediate_size, tp);
        return false;
    }
    return true;
}

mmc_status mmc_vision_shard_tp(mmc_vision *full, mmc_comm *tp, mmc_vision **out) {
    *out = NULL;
    const int P = mmc_comm_size(tp), r = mmc_comm_rank(tp);
    char why[160];
    if (!mmc_vision_tp_ok(&full->cfg, P, why, sizeof why))
        return mmc_error(MMC_ERR_INVALID, "vision tower: tensor_parallel %d cannot split it: %s", P, why);
    vspec *s = NULL, *fs = NULL;
    int n = 0, nf = 0;
    mmc_vision *v = vision_alloc(&full->cfg, &s, &n);
    if (v) fs = calloc((size_t)(8 + 20 * (int)full->cfg.depth), sizeof *fs);
    if (v && fs) nf = build_specs(full, fs);
    if (v) v->param_split = calloc((size_t)(8 + 20 * (int)full->cfg.depth), 1);
    if (!v || !fs || !v->param_split || nf != n) {
        free(s); free(fs); mmc_vision_free(v);
        return mmc_error(MMC_ERR_OOM, "out of memory allocating a vision tower");
    }
    for (int i = 0; i < n; i++) {
        const mmc_tensor *src = *fs[i].slot;
        MMC_CHECK(src && src->dtype == MMC_F32 && mmc_is_contiguous(src), "mmc_vision_shard_tp: the tower must be f32");
        int64_t local[5];
        mmc_tp_local_shape(s[i].ndim, s[i].shape, s[i].split, P, local);
        mmc_tensor *t = mmc_tensor_new(MMC_F32, s[i].ndim, local);
        if (!t) { free(s); free(fs); mmc_vision_free(v); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        mmc_tp_take_slice(src->data, s[i].ndim, s[i].shape, s[i].split, r, P, t->data);
        t->flags = (t->flags & ~(uint32_t)(MMC_PARAM | MMC_REQUIRES_GRAD)) | (src->flags & (MMC_PARAM | MMC_REQUIRES_GRAD));
        snprintf(t->name, sizeof t->name, "%s", src->name);
        *s[i].slot = t;
        v->param_split[v->n_params] = (signed char)s[i].split;
        snprintf(v->param_names[v->n_params], sizeof v->param_names[0], "%s", s[i].name);
        v->params[v->n_params++] = t;
    }
    free(s);
    free(fs);
    v->tp = tp;
    v->recompute = full->recompute;
    for (int64_t i = 0; i < v->cfg.depth; i++) {
        mmc_vision_block *b = &v->blocks[i];
        b->tp = tp;
        b->qkv.out_features /= P; b->proj.in_features /= P;
        b->fc1.out_features /= P; b->fc2.in_features /= P;
        b->gate.out_features /= P; b->up.out_features /= P; b->down.in_features /= P;
    }
    *out = v;
    return MMC_OK;
}

mmc_status mmc_vision_load_from(mmc_st *st, const mmc_vision_config *cfg, const char *prefix, bool trainable,
                                mmc_vision **out) {
    *out = NULL;
    vspec *s = NULL;
    int n = 0, bad = 0;
    size_t errcap = 16384;
    char *errs = calloc(1, errcap);
    mmc_vision *v = vision_alloc(cfg, &s, &n);
    if (!v || !errs) {
        free(s);
        free(errs);
        mmc_vision_free(v);
        return mmc_error(MMC_ERR_OOM, "out of memory allocating a vision tower");
    }
    for (int i = 0; i < n; i++) {
        char full[256];
        snprintf(full, sizeof full, "%s%s", prefix, s[i].name);
        if (mmc_model_bind(st, full, s[i].ndim, s[i].shape, trainable, s[i].slot, errs, errcap) != MMC_OK) {
            bad++;
            continue;
        }
        snprintf(v->param_names[v->n_params], sizeof v->param_names[0], "%s", s[i].name);
        v->params[v->n_params++] = *s[i].slot;
    }
    free(s);
    if (bad) {
        mmc_error(MMC_ERR_FORMAT, "vision tower weights: %d problem%s (prefix '%s'):%s", bad, bad > 1 ? "s" : "",
                  prefix, errs);
        free(errs);
        mmc_vision_free(v);
        return MMC_ERR_FORMAT;
    }
    free(errs);
    *out = v;
    return MMC_OK;
}

static mmc_vision *vision_alloc(const mmc_vision_config *cfg, vspec **specs, int *n) {
    mmc_vision *v = calloc(1, sizeof *v);
    int cap = 8 + 20 * (int)cfg->depth;
    *specs = calloc((size_t)cap, sizeof **specs);
    if (v) {
        v->cfg = *cfg;
        v->blocks = calloc((size_t)cfg->depth, sizeof *v->blocks);
        v->params = calloc((size_t)cap, sizeof *v->params);
        v->param_names = calloc((size_t)cap, sizeof *v->param_names);
    }
    if (!v || !*specs || !v->blocks || !v->params || !v->param_names) {
        free(*specs);
        *specs = NULL;
        mmc_vision_free(v);
        return NULL;
    }
    *n = build_specs(v, *specs);
    /* feature sizes of the linear modules (LoRA and NF4 need them) */
    const int64_t C = cfg->embed_dim, F = cfg->intermediate_size;
    const int64_t M = C * cfg->spatial_merge_size * cfg->spatial_merge_size;
#define FEAT(l, o, i) do { (l).out_features = (o); (l).in_features = (i); } while (0)
    for (int64_t i = 0; i < cfg->depth; i++) {
        mmc_vision_block *b = &v->blocks[i];
        FEAT(b->qkv, 3 * C, C); FEAT(b->proj, C, C);
        FEAT(b->fc1, F, C); FEAT(b->fc2, C, F);
        FEAT(b->gate, F, C); FEAT(b->up, F, C); FEAT(b->down, C, F);
    }
    FEAT(v->mlp0, M, M);
    FEAT(v->mlp2, cfg->out_hidden_size, M);
#undef FEAT
    return v;
}

mmc_status mmc_vision_new(const mmc_vision_config *cfg, uint64_t seed, mmc_vision **out) {
    *out = NULL;
    vspec *s;
    int n;
    mmc_vision *v = vision_alloc(cfg, &s, &n);
    if (!v) return mmc_error(MMC_ERR_OOM, "out of memory allocating a vision tower");
    mmc_rng rng;
    mmc_rng_init(&rng, seed);
    for (int i = 0; i < n; i++) {
        mmc_tensor *t = mmc_tensor_new(MMC_F32, s[i].ndim, s[i].shape);
        if (!t) { free(s); mmc_vision_free(v); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
        bool is_norm = strstr(s[i].name, "norm") || strstr(s[i].name, "ln_q");
        if (is_norm && strstr(s[i].name, ".weight")) for (int64_t k = 0; k < mmc_numel(t); k++) ((float *)t->data)[k] = 1.0f;
        else if (!is_norm) mmc_rng_normal(&rng, t->data, mmc_numel(t), 0.0f, 0.02f);
        *s[i].slot = t;
        snprintf(v->param_names[v->n_params], sizeof v->param_names[0], "%s", s[i].name);
        v->params[v->n_params++] = t;
    }
    free(s);
    *out = v;
    return MMC_OK;
}

/* ------------------------------------------------------------------ window index */
mmc_status mmc_vision_window_index(const mmc_vision_config *c, const int64_t *grid, int n, int64_t **window_index,
                                   int32_t **cu_seqlens, int *n_windows) {
    *window_index = NULL;
    *cu_seqlens = NULL;
    *n_windows = 0;
    const int64_t m = c->spatial_merge_size, unit = m * m;
    const int64_t vw = c->window_size / m / c->patch_size;   /* window side in merged tokens */
    if (vw <= 0)
        return mmc_error(MMC_ERR_INVALID, "vision window_size %lld gives an empty window", (long long)c->window_size);
    int64_t total = 0, max_windows = 0;
    for (int i = 0; i < n; i++) {
        int64_t t = grid[3 * i], lh = grid[3 * i + 1] / m, lw = grid[3 * i + 2] / m;
        total += t * lh * lw;
        max_windows += t * (lh / vw + 1) * (lw / vw + 1);
    }
    int64_t *idx = malloc((size_t)(total > 0 ? total : 1) * sizeof *idx);
    int32_t *cu = malloc((size_t)(max_windows + 1) * sizeof *cu);
    if (!idx || !cu) {
        free(idx);
        free(cu);
        return mmc_error(MMC_ERR_OOM, "out of memory for the vision window index");
    }
    int64_t k = 0, base = 0;
    int nw = 0;
    cu[0] = 0;
    for (int i = 0; i < n; i++) {
        int64_t t = grid[3 * i], lh = grid[3 * i + 1] / m, lw = grid[3 * i + 2] / m;
        /* transformers pads to a whole number of windows, adding a full (empty) window when
         * the size already divides: empty windows are dropped by unique_consecutive */
        int64_t nwh = (lh + vw - lh % vw) / vw, nww = (lw + vw - lw % vw) / vw;
        for (int64_t f = 0; f < t; f++)
            for (int64_t wh = 0; wh < nwh; wh++)
                for (int64_t ww = 0; ww < nww; ww++) {
                    int64_t cnt = 0;
                    for (int64_t ih = 0; ih < vw; ih++)
                        for (int64_t iw = 0; iw < vw; iw++) {
                            int64_t r = wh * vw + ih, col = ww * vw + iw;
                            if (r < lh && col < lw) {
                                idx[k++] = base + f * lh * lw + r * lw + col;
                                cnt++;
                            }
                        }
                    if (cnt) {
                        cu[nw + 1] = cu[nw] + (int32_t)(cnt * unit);
                        nw++;
                    }
                }
        base += t * lh * lw;
    }
    *window_index = idx;
    *cu_seqlens = cu;
    *n_windows = nw;
    return MMC_OK;
}

/* ------------------------------------------------------------------ forward */
static mmc_tensor *act(mmc_ctx *ctx, mmc_act a, mmc_tensor *x) {
    switch (a) {
    case MMC_ACT_QUICK_GELU: return mmc_quick_gelu(ctx, x);
    case MMC_ACT_GELU: return mmc_gelu(ctx, x);
    case MMC_ACT_GELU_TANH: return mmc_gelu_tanh(ctx, x);
    default: return mmc_silu(ctx, x);
    }
}

static mmc_tensor *vnorm(mmc_ctx *ctx, const mmc_vision_config *c, mmc_tensor *x, mmc_tensor *w, mmc_tensor *b) {
    return c->arch == MMC_VL_QWEN2 ? mmc_layernorm(ctx, x, w, b, 1e-6f) : mmc_rmsnorm(ctx, x, w, 1e-6f);
}

/* The block's MLP on normed rows h [1, n, C] -> [1, n, C]: Qwen2-VL's fc2(act(fc1 h)) (QuickGELU),
 * Qwen2.5-VL's down(act(gate h) * up h) (SwiGLU). */
static mmc_tensor *vmlp(mmc_ctx *ctx, const mmc_vision_config *c, mmc_vision_block *b, mmc_tensor *h) {
    h = mmc_tp_copy(ctx, b->tp, h);   /* tensor parallelism: column-parallel in, row-parallel out */
    if (c->arch == MMC_VL_QWEN2) {
        mmc_tensor *a = act(ctx, c->act, mmc_nn_linear(ctx, h, &b->fc1));
        return b->tp ? mmc_tp_row_linear(ctx, b->tp, a, &b->fc2) : mmc_nn_linear(ctx, a, &b->fc2);
    }
    mmc_tensor *g = mmc_nn_linear(ctx, h, &b->gate), *u = mmc_nn_linear(ctx, h, &b->up);
    g = c->act == MMC_ACT_SILU ? mmc_swiglu(ctx, g, u) : mmc_mul(ctx, act(ctx, c->act, g), u);
    return b->tp ? mmc_tp_row_linear(ctx, b->tp, g, &b->down) : mmc_nn_linear(ctx, g, &b->down);
}

/* x [1, N, Cv] -> [1, N, Cv] (Qwen2VLVisionBlock / Qwen2_5_VLVisionBlock) */
static mmc_tensor *block_forward(mmc_ctx *ctx, const mmc_vision_config *c, mmc_vision_block *b, mmc_tensor *x,
                                 mmc_tensor *cos, mmc_tensor *sin, const mmc_attn_opts *ao) {
    /* heads held here: all, or num_heads / tp with tensor parallelism */
    const int64_t N = x->shape[1], D = c->embed_dim / c->num_heads, H = b->qkv.out_features / 3 / D, C = H * D;
    mmc_params_begin(ctx, b);   /* ZeRO-3: the block's parameters are gathered here, freed at the end */
    mmc_tensor *h = vnorm(ctx, c, x, b->norm1_w, b->norm1_b);                  /* [1, N, Cv] */
    h = mmc_tp_copy(ctx, b->tp, h);
    mmc_tensor *f = mmc_nn_linear(ctx, h, &b->qkv);                             /* [1, N, 3C] */
    f = mmc_reshape(ctx, f, 5, MMC_SHAPE(1, N, 3, H, D));
    mmc_tensor *qkv[3];
    for (int i = 0; i < 3; i++)                                                  /* [1, N, H, D] */
        qkv[i] = mmc_reshape(ctx, mmc_narrow(ctx, f, 2, i, 1), 4, MMC_SHAPE(1, N, H, D));
    mmc_tensor *q = mmc_rope(ctx, qkv[0], cos, sin), *k = mmc_rope(ctx, qkv[1], cos, sin);
    mmc_tensor *a = mmc_attention(ctx, q, k, qkv[2], ao);                        /* [1, N, H, D] */
    a = mmc_reshape(ctx, a, 3, MMC_SHAPE(1, N, C));
    x = mmc_add(ctx, x, b->tp ? mmc_tp_row_linear(ctx, b->tp, a, &b->proj) : mmc_nn_linear(ctx, a, &b->proj));
    h = vnorm(ctx, c, x, b->norm2_w, b->norm2_b);
    mmc_tensor *y = vmlp(ctx, c, b, h);
    x = mmc_add(ctx, x, y);
    mmc_params_end(ctx, b);
    return x;
}

/* ------------------------------------------------------------------ inference forward
 * Without autograd, block_forward's ops run so that only x, q, k, v and the attention
 * output are ever full-length: x [1, N, C] is updated in place, and the row-wise work
 * (norms, qkv with rotary, proj, the MLP, the merger) runs over chunks of rows. Each row
 * comes out of the same kernels in the same order, so results do not change; for the
 * 1024x768 image (N = 3996) the tower's peak drops from ~550 MiB to ~120 MiB. */

/* a chunk's widest intermediates: two of [rows, width] f32 */
static int64_t chunk_rows(int64_t rows, int64_t width) {
    return mmc_infer_chunk_rows(rows, 2 * width * (int64_t)sizeof(float));
}

/* block_forward without autograd, x [1, N, C] contiguous, updated in place */
static void block_forward_infer(mmc_ctx *ctx, const mmc_vision_config *c, mmc_vision_block *b, mmc_tensor *x,
                                mmc_tensor *cos, mmc_tensor *sin, const mmc_attn_opts *ao) {
    mmc_arena *ar = mmc_ctx_arena(ctx);
    /* C: the attention width held here (the embedding width Cv / tp with tensor parallelism) */
    const int64_t N = x->shape[1], D = c->embed_dim / c->num_heads, H = b->qkv.out_features / 3 / D, C = H * D,
                  Cv = c->embed_dim;
    float *xd = x->data;
    mmc_arena_mark m0 = mmc_arena_get_mark(ar);
    mmc_tensor *qkv[3];                                                          /* [1, N, H, D] */
    for (int i = 0; i < 3; i++) qkv[i] = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(1, N, H, D));
    int64_t R = chunk_rows(N, 3 * C);
    for (int64_t r0 = 0; r0 < N; r0 += R) {
        const int64_t n = N - r0 < R ? N - r0 : R;
        mmc_arena_mark mk = mmc_arena_get_mark(ar);
        mmc_tensor *h = vnorm(ctx, c, mmc_narrow(ctx, x, 1, r0, n), b->norm1_w, b->norm1_b);  /* [1, n, C] */
        mmc_tensor *f = mmc_reshape(ctx, mmc_nn_linear(ctx, h, &b->qkv), 5, MMC_SHAPE(1, n, 3, H, D));
        mmc_tensor *cr = mmc_narrow(ctx, cos, 0, r0, n), *sr = mmc_narrow(ctx, sin, 0, r0, n);
        for (int i = 0; i < 3; i++) {
            mmc_tensor *p = mmc_reshape(ctx, mmc_narrow(ctx, f, 2, i, 1), 4, MMC_SHAPE(1, n, H, D));
            p = mmc_contiguous(ctx, i < 2 ? mmc_rope(ctx, p, cr, sr) : p);
            memcpy((float *)qkv[i]->data + r0 * C, p->data, (size_t)(n * C) * sizeof(float));
        }
        mmc_arena_release(ar, mk);
    }
    mmc_tensor *a = mmc_reshape(ctx, mmc_attention(ctx, qkv[0], qkv[1], qkv[2], ao), 3, MMC_SHAPE(1, N, C));
    R = chunk_rows(N, C);
    for (int64_t r0 = 0; r0 < N; r0 += R) {
        const int64_t n = N - r0 < R ? N - r0 : R;
        mmc_arena_mark mk = mmc_arena_get_mark(ar);
        mmc_tensor *an = mmc_contiguous(ctx, mmc_narrow(ctx, a, 1, r0, n));
        mmc_tensor *y = b->tp ? mmc_tp_row_linear(ctx, b->tp, an, &b->proj) : mmc_nn_linear(ctx, an, &b->proj);
        mmc_infer_residual_add(ctx, xd + r0 * Cv, y);
        mmc_arena_release(ar, mk);
    }
    mmc_arena_release(ar, m0);
    R = chunk_rows(N, c->intermediate_size);
    for (int64_t r0 = 0; r0 < N; r0 += R) {
        const int64_t n = N - r0 < R ? N - r0 : R;
        mmc_arena_mark mk = mmc_arena_get_mark(ar);
        mmc_tensor *h = vnorm(ctx, c, mmc_narrow(ctx, x, 1, r0, n), b->norm2_w, b->norm2_b);
        mmc_tensor *y = vmlp(ctx, c, b, h);
        mmc_infer_residual_add(ctx, xd + r0 * Cv, y);
        mmc_arena_release(ar, mk);
    }
}

/* The patch merger (norm, concatenate each m x m group, MLP): x [N, C] -> [N / m^2, Co] */
static mmc_tensor *merger_forward(mmc_ctx *ctx, mmc_vision *v, mmc_tensor *x) {
    const mmc_vision_config *c = &v->cfg;
    const int64_t N = x->shape[0], C = c->embed_dim, unit = c->spatial_merge_size * c->spatial_merge_size;
    mmc_tensor *h = c->arch == MMC_VL_QWEN2 ? mmc_layernorm(ctx, x, v->ln_q_w, v->ln_q_b, 1e-6f)
                                            : mmc_rmsnorm(ctx, x, v->ln_q_w, 1e-6f);
    h = mmc_reshape(ctx, h, 2, MMC_SHAPE(N / unit, unit * C));
    h = mmc_gelu(ctx, mmc_nn_linear(ctx, h, &v->mlp0));
    return mmc_nn_linear(ctx, h, &v->mlp2);                                      /* [N/m^2, Co] */
}

/* merger_forward without autograd, over chunks of merged rows */
static mmc_tensor *merger_forward_infer(mmc_ctx *ctx, mmc_vision *v, mmc_tensor *x) {
    mmc_arena *ar = mmc_ctx_arena(ctx);
    const mmc_vision_config *c = &v->cfg;
    const int64_t N = x->shape[0], unit = c->spatial_merge_size * c->spatial_merge_size, M = N / unit;
    const int64_t Co = c->out_hidden_size;
    mmc_tensor *out = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, Co));
    const int64_t R = chunk_rows(M, unit * c->embed_dim);
    for (int64_t r0 = 0; r0 < M; r0 += R) {
        const int64_t n = M - r0 < R ? M - r0 : R;
        mmc_arena_mark mk = mmc_arena_get_mark(ar);
        mmc_tensor *y = mmc_contiguous(ctx, merger_forward(ctx, v, mmc_narrow(ctx, x, 0, r0 * unit, n * unit)));
        memcpy((float *)out->data + r0 * Co, y->data, (size_t)(n * Co) * sizeof(float));
        mmc_arena_release(ar, mk);
    }
    return out;
}

/* Rows of x [R, ...] grouped in units of `unit` consecutive rows, permuted by idx over units. */
static mmc_tensor *permute_units(mmc_ctx *ctx, mmc_tensor *x, int64_t unit, mmc_tensor *idx) {
    int64_t R = x->shape[0], W = mmc_numel(x) / R;
    mmc_tensor *u = mmc_reshape(ctx, x, 2, MMC_SHAPE(R / unit, unit * W));
    return mmc_reshape(ctx, mmc_gather_rows(ctx, u, idx), 2, MMC_SHAPE(R, W));
}

/* activation checkpointing of one block (mmc_checkpoint): what the re-run needs */
typedef struct {
    const mmc_vision_config *c;
    mmc_vision_block *b;
    mmc_tensor *cos, *sin;
    mmc_attn_opts ao;   /* a copy: the caller's is gone when backward recomputes */
} vblock_args;

static mmc_tensor *vblock_fn(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in) {
    vblock_args *a = user;
    (void)n_in;
    return block_forward(ctx, a->c, a->b, in[0], a->cos, a->sin, &a->ao);
}

static bool lin_trainable(const mmc_linear_w *l) {
    for (int j = 0; j < l->n_parts; j++)   /* Omni's q / k / v adapters on the fused qkv */
        if (lin_trainable(&l->parts[j])) return true;
    return (l->w && mmc_requires_grad(l->w)) || (l->b && mmc_requires_grad(l->b)) ||
           (l->lora && (mmc_requires_grad(l->lora->A) || mmc_requires_grad(l->lora->B)));
}

/* Does backward have anything to do in block b (else checkpointing it only costs a re-run)? */
static bool block_trainable(const mmc_vision_block *b) {
    const mmc_tensor *t[4] = {b->norm1_w, b->norm1_b, b->norm2_w, b->norm2_b};
    for (int i = 0; i < 4; i++) if (t[i] && mmc_requires_grad(t[i])) return true;
    const mmc_linear_w *l[7] = {&b->qkv, &b->proj, &b->fc1, &b->fc2, &b->gate, &b->up, &b->down};
    for (int i = 0; i < 7; i++) if (lin_trainable(l[i])) return true;
    return false;
}

mmc_status mmc_vision_forward(mmc_ctx *ctx, mmc_vision *v, mmc_tensor *pixels, const int64_t *grid, int n,
                              mmc_tensor **out, mmc_tensor **hidden) {
    *out = NULL;
    if (hidden) *hidden = NULL;
    const mmc_vision_config *c = &v->cfg;
    const int64_t m = c->spatial_merge_size, unit = m * m;
    const int64_t K = c->in_channels * c->temporal_patch_size * c->patch_size * c->patch_size;
    if (n <= 0) return mmc_error(MMC_ERR_INVALID, "vision tower: no images");
    int64_t N = 0;
    for (int i = 0; i < n; i++) {
        int64_t t = grid[3 * i], h = grid[3 * i + 1], w = grid[3 * i + 2];
        if (t <= 0 || h <= 0 || w <= 0 || h % m || w % m)
            return mmc_error(MMC_ERR_INVALID, "vision tower: grid_thw[%d] = (%lld, %lld, %lld): t, h, w must be "
                             "positive and h, w multiples of spatial_merge_size %lld", i, (long long)t,
                             (long long)h, (long long)w, (long long)m);
        N += t * h * w;
    }
    char sb[64];
    if (!pixels || pixels->ndim != 2 || pixels->shape[0] != N || pixels->shape[1] != K)
        return mmc_error(MMC_ERR_SHAPE, "vision tower: pixel values %s do not match the grids: expected [%lld, %lld] "
                         "(sum of t*h*w over %d grid%s, Cin*kt*p*p)", pixels ? mmc_shape_str(pixels, sb, sizeof sb) : "(none)",
                         (long long)N, (long long)K, n, n > 1 ? "s" : "");
    if (pixels->dtype != MMC_F32) pixels = mmc_cast(ctx, pixels, MMC_F32);
    pixels = mmc_contiguous(ctx, pixels);
    const int64_t C = c->embed_dim, D = C / c->num_heads;
    mmc_tensor *x = mmc_patch_embed(ctx, pixels, v->patch_w, NULL);              /* [N, C] */
    mmc_tensor *cos, *sin;
    mmc_rope_table_vision2d(ctx, grid, n, (int)m, (int)D, c->rope_theta, &cos, &sin); /* [N, D] */
    /* full attention: one block per frame of each image (h*w repeated t times) */
    int n_frames = 0;
    for (int i = 0; i < n; i++) n_frames += (int)grid[3 * i];
    int32_t *cu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(n_frames + 1));
    cu[0] = 0;
    for (int i = 0, f = 0; i < n; i++)
        for (int64_t t = 0; t < grid[3 * i]; t++, f++) cu[f + 1] = cu[f] + (int32_t)(grid[3 * i + 1] * grid[3 * i + 2]);
    mmc_attn_opts full = {.causal = false, .cu_seqlens = cu, .n_seqs = n_frames}, win = full;
    mmc_tensor *widx = NULL, *ridx = NULL;
    if (c->arch == MMC_VL_QWEN2_5) {
        int64_t *wi;
        int32_t *wcu;
        int nw;
        mmc_status st = mmc_vision_window_index(c, grid, n, &wi, &wcu, &nw);
        if (st) return st;
        int64_t M = N / unit;
        widx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(M));
        ridx = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(M));
        for (int64_t i = 0; i < M; i++) {
            ((int64_t *)widx->data)[i] = wi[i];
            ((int64_t *)ridx->data)[wi[i]] = i;      /* argsort of a permutation */
        }
        int32_t *acu = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int32_t) * (size_t)(nw + 1));
        memcpy(acu, wcu, sizeof(int32_t) * (size_t)(nw + 1));
        free(wi);
        free(wcu);
        win.cu_seqlens = acu;
        win.n_seqs = nw;
        x = permute_units(ctx, x, unit, widx);
        cos = permute_units(ctx, cos, unit, widx);
        sin = permute_units(ctx, sin, unit, widx);
    }
    x = mmc_reshape(ctx, mmc_contiguous(ctx, x), 3, MMC_SHAPE(1, N, C));   /* ours: updated in place below */
    for (int64_t l = 0; l < c->depth; l++) {
        bool is_full = c->arch == MMC_VL_QWEN2;
        for (int i = 0; i < c->n_fullatt && !is_full; i++) is_full = c->fullatt[i] == l;
        if (mmc_grad_enabled(ctx)) {
            if (v->recompute && (mmc_requires_grad(x) || block_trainable(&v->blocks[l]))) {
                vblock_args *a = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *a);
                *a = (vblock_args){c, &v->blocks[l], cos, sin, is_full ? full : win};
                x = mmc_checkpoint(ctx, vblock_fn, a, &x, 1);
            } else {
                x = block_forward(ctx, c, &v->blocks[l], x, cos, sin, is_full ? &full : &win);
            }
            continue;
        }
        block_forward_infer(ctx, c, &v->blocks[l], x, cos, sin, is_full ? &full : &win);
    }
    x = mmc_reshape(ctx, x, 2, MMC_SHAPE(N, C));
    if (hidden) *hidden = x;
    mmc_tensor *h = mmc_grad_enabled(ctx) ? merger_forward(ctx, v, x) : merger_forward_infer(ctx, v, x);
    if (ridx) h = mmc_gather_rows(ctx, h, ridx);
    *out = h;
    return MMC_OK;
}
