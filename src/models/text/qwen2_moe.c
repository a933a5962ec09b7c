/* qwen2_moe.c — Qwen2-MoE, mirroring transformers' Qwen2MoeForCausalLM
 * (models/qwen2_moe/modeling_qwen2_moe.py, 5.x): the Qwen2 decoder of qwen2.c (attention,
 * norms, rope, KV cache, LM head, generation — all shared) whose MLP on the sparse layers
 * ((i + 1) % decoder_sparse_step == 0 and i not in mlp_only_layers) is Qwen2MoeSparseMoeBlock:
 *   router   logits = x Wgᵀ [N, E], probs = softmax(logits), the top-k experts of each row with
 *            their probabilities (renormalised to sum 1 when norm_topk_prob);
 *   experts  y = sum_j w_j down_e(silu(gate_e(x)) * up_e(x)) over the row's k experts (every
 *            routed token is computed: no capacity limit, no token dropping);
 *   shared   + sigmoid(x wsᵀ) * down_s(silu(gate_s(x)) * up_s(x)).
 * Checkpoints hold each expert as its own linears (mlp.experts.N.gate_proj.weight ...: what
 * save_pretrained writes, transformers fusing them into gate_up_proj [E, 2I, C] only in memory).
 *
 * Training adds transformers' load_balancing_loss_func (Switch Transformer eq. 4-6) over the
 * sparse layers of a forward: aux = E * sum_e f_e * P_e, f_e the share of routing decisions that
 * picked e and P_e the mean router probability of e, both over all sparse layers' rows; the loss
 * gains router_aux_loss_coef * aux when output_router_logits is set (as transformers). f is
 * constant, so d aux / d probs[l, n, e] = E f_e / rows: an identity op on the probabilities adds
 * that in backward (once every layer's f is known), which also holds under recompute.
 *
 * Expert parallelism (mmc_ep.h): with an ep group of P ranks each holds experts
 * [r E/P, (r+1) E/P); the rows sorted by expert are sent to their experts' ranks with an
 * all-to-all-v, computed there and sent back, then weighted and summed as above.
 *
 * Tensor parallelism (mmc_tp.h; Megatron-LM's expert tensor parallelism at the size of the
 * attention's, its default): every expert and the shared expert are split like the dense MLP,
 * gate/up on their moe_intermediate_size rows and down on its columns, so each tp rank holds
 * 1/tp of every expert it holds; the router and shared_expert_gate are replicated. The block's
 * input is replicated over the tp group (f before the experts: its gradient is all-reduced), the
 * routing is the same on every tp rank, the ep exchange runs within each tp rank's own ep group
 * (the ranks of other data-parallel replicas at the same tp rank), and the experts' partial
 * outputs are all-reduced (g) before they are weighted, so the routing weights' gradient is
 * whole; the shared expert's likewise before its gate. */
#include "mmc_models.h"
#include "mmc_ep.h"
#include "mmc_parallel.h"
#include "mmc_quant.h"
#include "mmc_tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct mmc_moe_block {
    mmc_tensor *router;               /* [E, C] mlp.gate.weight */
    mmc_linear_w *gate, *up, *down;   /* [n_local]: w [I, C], [I, C], [C, I] (experts first ..) */
    mmc_linear_w sh_gate, sh_up;      /* shared expert: w [Is, C] */
    mmc_linear_w sh_down;             /* w [C, Is] */
    mmc_tensor *sh_router;            /* [1, C] shared_expert_gate.weight */
    mmc_moe *moe;
    int sparse_idx;                   /* index among the sparse layers */
};

enum { AUX_OFF, AUX_COLLECT, AUX_APPLY };

struct mmc_moe {
    int64_t n_experts, top_k, inter, shared_inter, sparse_step, n_layers, n_sparse;
    bool norm_topk_prob, output_router_logits;
    double aux_coef;
    bool *sparse;                     /* [n_layers] */
    mmc_moe_block *blocks;            /* [n_layers], used where sparse */
    struct mmc_comm *ep;              /* expert-parallel group (not owned) or NULL */
    int64_t first, n_local;           /* experts held here */
    struct mmc_comm *tp;              /* tensor-parallel group (not owned) or NULL */
    int tp_size;                      /* 1 without tp: the experts' and shared expert's rows held = inter / tp_size */
    /* the auxiliary loss of the current forward */
    int aux_state;
    double aux_weight;                /* this forward's aux factor in the step's loss */
    double *aux_own;                  /* [1 + 2E] a single-process forward's sums (mmc_moe_aux_begin) */
    float *aux_own_grad;              /* [E] its gradient, set by mmc_moe_aux_end */
    /* where the forward running now collects and its backward reads: the own pair, or a
     * pipeline stage's per-micro-batch pair (mmc_moe_aux_attach) */
    double *aux_stats;                /* [1 + 2E]: rows routed (summed over the sparse layers), then the
                                       * routing decisions per expert, then the summed probabilities */
    float *aux_grad;                  /* [E] d loss / d probs[., e] */
    /* capacity statistics */
    int64_t *stat_tokens;             /* [n_sparse, E] */
    int64_t stat_routed;
};

/* ------------------------------------------------------------------ config */
mmc_status mmc_qwen2_moe_config_read(const mmc_json *root, mmc_qwen2_config *qc) {
    mmc_status st = mmc_qwen2_config_read(root, qc);
    if (st) return st;
    qc->moe = NULL;
    static const char *const need[] = {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                       "shared_expert_intermediate_size"};
    int64_t v[4];
    for (int i = 0; i < 4; i++) {
        if (!mmc_json_has(root, need[i]))
            return mmc_error(MMC_ERR_FORMAT, "config.json: '%s' is missing (a Qwen2-MoE config needs num_experts, "
                             "num_experts_per_tok, moe_intermediate_size and shared_expert_intermediate_size)", need[i]);
        if ((st = mmc_json_int(root, need[i], 0, &v[i]))) return st;
        if (v[i] < (i == 3 ? 0 : 1) || v[i] > MMC_CONFIG_MAX_DIM)
            return mmc_error(MMC_ERR_FORMAT, "config.json: '%s' %lld must be from %d to %lld", need[i], (long long)v[i],
                             i == 3 ? 0 : 1, (long long)MMC_CONFIG_MAX_DIM);
    }
    if (v[1] > v[0])
        return mmc_error(MMC_ERR_FORMAT, "config.json: num_experts_per_tok %lld exceeds num_experts %lld",
                         (long long)v[1], (long long)v[0]);
    int64_t step;
    if ((st = mmc_json_int(root, "decoder_sparse_step", 1, &step))) return st;
    if (step < 1 || step > MMC_CONFIG_MAX_DIM)
        return mmc_error(MMC_ERR_FORMAT, "config.json: decoder_sparse_step %lld must be 1 or more", (long long)step);
    bool swa = false;
    if ((st = mmc_json_bool(root, "use_sliding_window", false, &swa))) return st;
    if (swa) return mmc_error(MMC_ERR_UNSUPPORTED, "config.json: use_sliding_window true is not supported for "
                              "Qwen2-MoE (full causal attention only)");
    const char *act = NULL;
    if ((st = mmc_json_str(root, "hidden_act", "silu", &act))) return st;
    if (strcmp(act, "silu") && strcmp(act, "swish"))
        return mmc_error(MMC_ERR_UNSUPPORTED, "config.json: hidden_act '%s' is not supported for Qwen2-MoE (silu)", act);
    bool qkv = true;
    if ((st = mmc_json_bool(root, "qkv_bias", true, &qkv))) return st;
    qc->qkv_bias = qkv;
    mmc_moe *moe = calloc(1, sizeof *moe);
    if (!moe) return mmc_error(MMC_ERR_OOM, "out of memory");
    moe->n_experts = v[0]; moe->top_k = v[1]; moe->inter = v[2]; moe->shared_inter = v[3];
    moe->sparse_step = step;
    moe->n_layers = qc->num_layers;
    moe->n_local = moe->n_experts;
    moe->tp_size = 1;
    moe->sparse = calloc((size_t)qc->num_layers, sizeof *moe->sparse);
    moe->blocks = calloc((size_t)qc->num_layers, sizeof *moe->blocks);
    moe->aux_own = calloc((size_t)(1 + 2 * moe->n_experts), sizeof(double));
    moe->aux_own_grad = calloc((size_t)moe->n_experts, sizeof(float));
    moe->aux_stats = moe->aux_own;
    moe->aux_grad = moe->aux_own_grad;
    if (!moe->sparse || !moe->blocks || !moe->aux_own || !moe->aux_own_grad) {
        mmc_moe_free(moe);
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    if ((st = mmc_json_bool(root, "norm_topk_prob", false, &moe->norm_topk_prob)) ||
        (st = mmc_json_bool(root, "output_router_logits", false, &moe->output_router_logits)) ||
        (st = mmc_json_num(root, "router_aux_loss_coef", 0.001, &moe->aux_coef))) {
        mmc_moe_free(moe);
        return st;
    }
    for (int64_t l = 0; l < qc->num_layers; l++) moe->sparse[l] = (l + 1) % step == 0;
    if (mmc_json_get(root, "mlp_only_layers")) {   /* at most one entry per layer */
        int n = (int)qc->num_layers + 1;
        int64_t *ids = malloc(sizeof *ids * (size_t)n);
        if (!ids) { mmc_moe_free(moe); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        st = mmc_json_int_array(root, "mlp_only_layers", ids, &n);
        for (int i = 0; !st && i < n; i++) {
            if (ids[i] < 0 || ids[i] >= qc->num_layers)
                st = mmc_error(MMC_ERR_FORMAT, "config.json: mlp_only_layers holds %lld, not a layer index (0 to %lld)",
                               (long long)ids[i], (long long)qc->num_layers - 1);
            else moe->sparse[ids[i]] = false;
        }
        free(ids);
        if (st) { mmc_moe_free(moe); return st; }
    }
    for (int64_t l = 0; l < qc->num_layers; l++)
        if (moe->sparse[l]) moe->blocks[l].sparse_idx = (int)moe->n_sparse++;
    if (moe->n_sparse * (5 + 3 * moe->n_experts) + 16 * qc->num_layers > (int64_t)1 << 28) {   /* parameter tables */
        mmc_status e = mmc_error(MMC_ERR_FORMAT, "config.json: %lld sparse layers x num_experts %lld is more expert "
                                 "tensors than a model can hold", (long long)moe->n_sparse, (long long)moe->n_experts);
        mmc_moe_free(moe);
        return e;
    }
    moe->stat_tokens = calloc((size_t)(moe->n_sparse * moe->n_experts + 1), sizeof(int64_t));
    if (!moe->stat_tokens) { mmc_moe_free(moe); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    qc->moe = moe;
    return MMC_OK;
}

void mmc_moe_free(mmc_moe *moe) {
    if (!moe) return;
    for (int64_t l = 0; moe->blocks && l < moe->n_layers; l++) {
        mmc_moe_block *b = &moe->blocks[l];
        for (int64_t e = 0; b->gate && e < moe->n_local; e++) {
            mmc_nf4_free(b->gate[e].q); mmc_nf4_free(b->up[e].q); mmc_nf4_free(b->down[e].q);
        }
        mmc_nf4_free(b->sh_gate.q); mmc_nf4_free(b->sh_up.q); mmc_nf4_free(b->sh_down.q);
        free(b->gate); free(b->up); free(b->down);   /* (their tensors are the model's parameters) */
    }
    free(moe->sparse); free(moe->blocks);
    free(moe->aux_own); free(moe->aux_own_grad); free(moe->stat_tokens);
    free(moe);
}

int mmc_moe_param_count(const mmc_moe *moe) {
    return (int)(moe->n_sparse * (5 + 3 * moe->n_local));
}

bool mmc_moe_layer_sparse(const mmc_moe *moe, int64_t layer) {
    return moe && layer >= 0 && layer < moe->n_layers && moe->sparse[layer];
}

/* ------------------------------------------------------------------ parameters */
typedef struct { char name[96]; mmc_tensor **slot; int64_t shape[2]; int64_t expert; int split; } mspec;

/* The sparse block's tensors, in a fixed order; experts not held here (ep) are listed with
 * slot NULL so that a seeded init draws the same numbers whatever the layout. */
static int block_specs(mmc_moe *moe, mmc_moe_block *b, int64_t layer, int64_t C, mspec *s) {
    int n = 0;
    const int64_t E = moe->n_experts, I = moe->inter, Is = moe->shared_inter;
#define MS(sl, d0, d1, ex, sp, ...) do { snprintf(s[n].name, sizeof s[n].name, "layers.%lld.mlp." __VA_ARGS__); \
    s[n].slot = (sl); s[n].shape[0] = d0; s[n].shape[1] = d1; s[n].expert = ex; s[n].split = sp; n++; } while (0)
    /* (full shapes; split: the dimension tensor parallelism splits, -1 replicated) */
    MS(&b->router, E, C, -1, -1, "gate.weight", (long long)layer);
    for (int64_t e = 0; e < E; e++) {
        bool here = e >= moe->first && e < moe->first + moe->n_local;
        int64_t el = e - moe->first;
        MS(here ? &b->gate[el].w : NULL, I, C, e, 0, "experts.%lld.gate_proj.weight", (long long)layer, (long long)e);
        MS(here ? &b->up[el].w : NULL, I, C, e, 0, "experts.%lld.up_proj.weight", (long long)layer, (long long)e);
        MS(here ? &b->down[el].w : NULL, C, I, e, 1, "experts.%lld.down_proj.weight", (long long)layer, (long long)e);
    }
    MS(&b->sh_gate.w, Is, C, -1, 0, "shared_expert.gate_proj.weight", (long long)layer);
    MS(&b->sh_up.w, Is, C, -1, 0, "shared_expert.up_proj.weight", (long long)layer);
    MS(&b->sh_down.w, C, Is, -1, 1, "shared_expert.down_proj.weight", (long long)layer);
    MS(&b->sh_router, 1, C, -1, -1, "shared_expert_gate.weight", (long long)layer);
#undef MS
    return n;
}

static bool prepare_block(mmc_moe *moe, mmc_moe_block *b, int64_t C) {
    b->moe = moe;
    b->gate = calloc((size_t)moe->n_local, sizeof *b->gate);
    b->up = calloc((size_t)moe->n_local, sizeof *b->up);
    b->down = calloc((size_t)moe->n_local, sizeof *b->down);
    if (!b->gate || !b->up || !b->down) return false;
    const int64_t I = moe->inter / moe->tp_size, Is = moe->shared_inter / moe->tp_size;   /* rows held here */
    for (int64_t e = 0; e < moe->n_local; e++) {
        b->gate[e].out_features = b->up[e].out_features = I;
        b->gate[e].in_features = b->up[e].in_features = C;
        b->down[e].out_features = C; b->down[e].in_features = I;
    }
    b->sh_gate.out_features = b->sh_up.out_features = Is;
    b->sh_gate.in_features = b->sh_up.in_features = C;
    b->sh_down.out_features = C; b->sh_down.in_features = Is;
    return true;
}

static mspec *specs_alloc(const mmc_moe *moe) {
    return calloc((size_t)(5 + 3 * moe->n_experts), sizeof(mspec));
}

int mmc_moe_bind(mmc_qwen2 *m, const mmc_st *st, const char *prefix, bool trainable, char *errs, size_t errcap) {
    mmc_moe *moe = m->cfg.moe;
    const int64_t C = m->cfg.hidden_size;
    mspec *s = specs_alloc(moe);
    if (!s) return 1;
    int bad = 0;
    for (int64_t l = 0; l < moe->n_layers; l++) {
        if (!moe->sparse[l]) continue;
        mmc_moe_block *b = &moe->blocks[l];
        if (!prepare_block(moe, b, C)) { bad++; break; }
        m->layers[l].moe = b;
        int n = block_specs(moe, b, l, C, s);
        for (int i = 0; i < n; i++) {
            if (!s[i].slot) continue;
            char full[256];
            snprintf(full, sizeof full, "%s%s", prefix, s[i].name);
            if (mmc_model_bind(st, full, 2, s[i].shape, trainable, s[i].slot, errs, errcap) != MMC_OK) bad++;
            else mmc_qwen2_register_param(m, *s[i].slot, s[i].name);
        }
    }
    free(s);
    return bad;
}

void mmc_moe_init(mmc_qwen2 *m, mmc_rng *rng) {
    mmc_moe *moe = m->cfg.moe;
    const int64_t C = m->cfg.hidden_size;
    mspec *s = specs_alloc(moe);
    MMC_CHECK(s, "mmc_moe_init: out of memory");
    float *skip = malloc(sizeof(float) * (size_t)(moe->inter * C));
    MMC_CHECK(skip, "mmc_moe_init: out of memory");
    for (int64_t l = 0; l < moe->n_layers; l++) {
        if (!moe->sparse[l]) continue;
        mmc_moe_block *b = &moe->blocks[l];
        MMC_CHECK(prepare_block(moe, b, C), "mmc_moe_init: out of memory");
        m->layers[l].moe = b;
        int n = block_specs(moe, b, l, C, s);
        for (int i = 0; i < n; i++) {
            if (!s[i].slot) {   /* another rank's expert: the same draws, dropped */
                mmc_rng_normal(rng, skip, s[i].shape[0] * s[i].shape[1], 0.0f, 0.02f);
                continue;
            }
            mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, s[i].shape);
            MMC_CHECK(t, "mmc_moe_init: out of memory");
            t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
            mmc_rng_normal(rng, t->data, mmc_numel(t), 0.0f, 0.02f);
            *s[i].slot = t;
            mmc_qwen2_register_param(m, t, s[i].name);
        }
    }
    free(skip);
    free(s);
}

/* Tensor parallelism: this rank's slices of every block tensor (its experts' and the shared
 * expert's, the router whole), from checkpoint st (only the slices are read) or sliced from the
 * blocks of full, a model of the same config and expert layout; split recorded in
 * m->param_split as tp_build does for the decoder's tensors. */
int mmc_moe_bind_tp(mmc_qwen2 *m, const mmc_st *st, const char *prefix, mmc_qwen2 *full, bool trainable, char *errs,
                    size_t errcap) {
    mmc_moe *moe = m->cfg.moe, *fm = full ? full->moe : NULL;
    const int64_t C = m->cfg.hidden_size;
    const int P = moe->tp_size, r = mmc_comm_rank(moe->tp);
    mspec *s = specs_alloc(moe), *fs = fm ? specs_alloc(fm) : NULL;
    if (!s || (fm && !fs)) { free(s); free(fs); return 1; }
    int bad = 0;
    for (int64_t l = 0; l < moe->n_layers; l++) {
        if (!moe->sparse[l]) continue;
        mmc_moe_block *b = &moe->blocks[l];
        if (!prepare_block(moe, b, C)) { bad++; break; }
        m->layers[l].moe = b;
        int n = block_specs(moe, b, l, C, s);
        if (fm) block_specs(fm, &fm->blocks[l], l, C, fs);
        for (int i = 0; i < n; i++) {
            if (!s[i].slot) continue;
            if (fm) {
                const mmc_tensor *src = *fs[i].slot;
                int64_t local[2];
                mmc_tp_local_shape(2, s[i].shape, s[i].split, P, local);
                mmc_tensor *t = mmc_tensor_new(MMC_F32, 2, local);
                if (!t) { bad++; continue; }
                MMC_CHECK(src && src->dtype == MMC_F32 && mmc_is_contiguous(src), "mmc_moe_bind_tp: full model must be f32");
                mmc_tp_take_slice(src->data, 2, s[i].shape, s[i].split, r, P, t->data);
                if (trainable) t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
                *s[i].slot = t;
            } else {
                char fulln[256];
                snprintf(fulln, sizeof fulln, "%s%s", prefix, s[i].name);
                if (mmc_tp_bind(st, fulln, 2, s[i].shape, s[i].split, moe->tp, trainable, s[i].slot, errs, errcap)) {
                    bad++;
                    continue;
                }
            }
            m->param_split[m->n_params] = (signed char)s[i].split;
            mmc_qwen2_register_param(m, *s[i].slot, s[i].name);
        }
    }
    free(s);
    free(fs);
    return bad;
}

mmc_status mmc_moe_linears(mmc_moe_block *b, const char *lp, mmc_module_list *out) {
    char name[MMC_MODULE_NAME];
    mmc_status st;
    static const char *const nm[3] = {"gate_proj", "up_proj", "down_proj"};
    mmc_linear_w *sh[3] = {&b->sh_gate, &b->sh_up, &b->sh_down};
    for (int j = 0; j < 3; j++) {
        snprintf(name, sizeof name, "%smlp.shared_expert.%s", lp, nm[j]);
        if ((st = mmc_module_list_add(out, sh[j], name))) return st;
    }
    for (int64_t e = 0; e < b->moe->n_local; e++) {
        mmc_linear_w *ex[3] = {&b->gate[e], &b->up[e], &b->down[e]};
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "%smlp.experts.%lld.%s", lp, (long long)(b->moe->first + e), nm[j]);
            if ((st = mmc_module_list_add(out, ex[j], name))) return st;
        }
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ small autograd ops */
static void sigmoid_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *x = n->in[0];
    if (!mmc_requires_grad(x)) return;
    const float *y = n->out->data, *dy = n->out->grad->data;
    float *dx = mmc_grad(ctx, x)->data;
    for (int64_t i = 0; i < mmc_numel(x); i++) dx[i] += dy[i] * y[i] * (1.0f - y[i]);
}

/* torch.sigmoid; x contiguous f32 */
static mmc_tensor *sigmoid(mmc_ctx *ctx, mmc_tensor *x) {
    x = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new_like(ctx, x);
    const float *a = x->data;
    float *o = y->data;
    for (int64_t i = 0; i < mmc_numel(x); i++) o[i] = 1.0f / (1.0f + expf(-a[i]));
    mmc_tape_record(ctx, "sigmoid", sigmoid_backward, y, 1, &x);
    return y;
}

static void topk_norm_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *w = n->in[0];
    if (!mmc_requires_grad(w)) return;
    const int64_t N = w->shape[0], k = w->shape[1];
    const float *x = w->data, *y = n->out->data, *dy = n->out->grad->data;
    float *dx = mmc_grad(ctx, w)->data;
    for (int64_t r = 0; r < N; r++) {
        float s = 0, dot = 0;
        for (int64_t j = 0; j < k; j++) s += x[r * k + j];
        for (int64_t j = 0; j < k; j++) dot += dy[r * k + j] * y[r * k + j];
        for (int64_t j = 0; j < k; j++) dx[r * k + j] += (dy[r * k + j] - dot) / s;
    }
}

/* w [N, k] -> w / w.sum(-1, keepdim=True) (norm_topk_prob) */
static mmc_tensor *topk_norm(mmc_ctx *ctx, mmc_tensor *w) {
    w = mmc_contiguous(ctx, w);
    mmc_tensor *y = mmc_new_like(ctx, w);
    const int64_t N = w->shape[0], k = w->shape[1];
    const float *x = w->data;
    float *o = y->data;
    for (int64_t r = 0; r < N; r++) {
        float s = 0;
        for (int64_t j = 0; j < k; j++) s += x[r * k + j];
        for (int64_t j = 0; j < k; j++) o[r * k + j] = x[r * k + j] / s;
    }
    mmc_tape_record(ctx, "moe_topk_norm", topk_norm_backward, y, 1, &w);
    return y;
}

/* The auxiliary loss's gradient: identity on probs [N, E]; backward adds grad[e], the [E] vector
 * of the forward the node belongs to (moe->aux_grad when it was recorded), filled in by then. */
static void aux_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *p = n->in[0];
    if (!mmc_requires_grad(p)) return;
    const float *g = n->extra;
    const int64_t N = p->shape[0], E = p->shape[1];
    const float *dy = n->out->grad->data;
    float *dx = mmc_grad(ctx, p)->data;
    for (int64_t r = 0; r < N; r++)
        for (int64_t e = 0; e < E; e++) dx[r * E + e] += dy[r * E + e] + g[e];
}

static mmc_tensor *aux_hook(mmc_ctx *ctx, mmc_moe *moe, mmc_tensor *probs) {
    mmc_tensor *y = mmc_alias(ctx, probs);
    mmc_node *n = mmc_tape_record(ctx, "moe_aux", aux_backward, y, 1, &probs);
    if (n) n->extra = moe->aux_grad;
    return y;
}

static void stack_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor **xs = n->extra;
    const int cnt = (int)n->i[0];
    const float *g = n->out->grad->data;
    int64_t off = 0;
    for (int i = 0; i < cnt; i++) {
        const int64_t len = mmc_numel(xs[i]);
        if (mmc_requires_grad(xs[i])) {
            float *d = mmc_grad(ctx, xs[i])->data;
            for (int64_t j = 0; j < len; j++) d[j] += g[off + j];
        }
        off += len;
    }
}

/* Rows of any number of [n_i, C] tensors one after another -> [sum n_i, C] (mmc_concat takes 8). */
static mmc_tensor *stack_rows(mmc_ctx *ctx, mmc_tensor **xs, int cnt, int64_t C) {
    int64_t M = 0;
    for (int i = 0; i < cnt; i++) M += xs[i]->shape[0];
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(M, C));
    mmc_tensor **keep = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *keep * (size_t)(cnt ? cnt : 1));
    int64_t off = 0;
    mmc_tensor *grad_in = NULL;
    for (int i = 0; i < cnt; i++) {
        keep[i] = mmc_contiguous(ctx, xs[i]);
        memcpy((float *)y->data + off, keep[i]->data, mmc_nbytes(keep[i]));
        off += mmc_numel(keep[i]);
        if (!grad_in && mmc_requires_grad(keep[i])) grad_in = keep[i];
    }
    if (grad_in) {
        mmc_node *n = mmc_tape_record(ctx, "moe_stack_rows", stack_backward, y, 1, &grad_in);
        if (n) { n->extra = keep; n->i[0] = cnt; }
    }
    return y;
}

/* ys [N*k, C] in expert order; order[p] = the sorted row of pair p (row n's j-th pick is pair
 * n*k + j) -> out [N, C] = sum_j ys[order[n*k + j]] (the experts' index_add). */
static void unsort_backward(mmc_ctx *ctx, mmc_node *n) {
    mmc_tensor *ys = n->in[0];
    if (!mmc_requires_grad(ys)) return;
    const int32_t *order = n->extra;
    const int64_t k = n->i[0], C = ys->shape[1], Nk = ys->shape[0];
    const float *g = n->out->grad->data;
    float *d = mmc_grad(ctx, ys)->data;
    for (int64_t p = 0; p < Nk; p++)
        for (int64_t c = 0; c < C; c++) d[order[p] * C + c] += g[(p / k) * C + c];
}

static mmc_tensor *unsort_sum(mmc_ctx *ctx, mmc_tensor *ys, const int32_t *order, int64_t k) {
    ys = mmc_contiguous(ctx, ys);
    const int64_t Nk = ys->shape[0], C = ys->shape[1], N = Nk / k;
    mmc_tensor *out = mmc_zeros(ctx, MMC_F32, 2, MMC_SHAPE(N, C));
    const float *y = ys->data;
    float *o = out->data;
    for (int64_t p = 0; p < Nk; p++)
        for (int64_t c = 0; c < C; c++) o[(p / k) * C + c] += y[order[p] * C + c];
    mmc_node *nd = mmc_tape_record(ctx, "moe_unsort_sum", unsort_backward, out, 1, &ys);
    if (nd) { nd->extra = (void *)order; nd->i[0] = k; }
    return out;
}

/* ------------------------------------------------------------------ forward */
static mmc_tensor *swiglu_mlp(mmc_ctx *ctx, mmc_tensor *x, const mmc_linear_w *g, const mmc_linear_w *u,
                              const mmc_linear_w *d) {
    return mmc_nn_linear(ctx, mmc_swiglu(ctx, mmc_nn_linear(ctx, x, g), mmc_nn_linear(ctx, x, u)), d);
}

/* The grouped expert GEMMs (mmc_moe_experts_swiglu) unless switched off: MMC_MOE_GROUPED=0 or
 * mmc_moe_set_grouped(0) (the benchmark's A/B) runs the per-expert loop below instead. */
static int g_grouped = -1;
void mmc_moe_set_grouped(int on) { g_grouped = on; }
static bool grouped_on(void) {
    if (g_grouped < 0) {
        const char *e = getenv("MMC_MOE_GROUPED");
        g_grouped = !(e && !strcmp(e, "0"));
    }
    return g_grouped == 1;
}

/* This rank's experts over rows x [M, C] grouped by local expert (counts[el] rows each) -> [M, C]. */
static mmc_tensor *run_experts(mmc_ctx *ctx, mmc_moe_block *b, mmc_tensor *x, const int64_t *counts) {
    const int64_t C = x->shape[1];
    if (grouped_on() && mmc_moe_experts_grouped_ok(b->gate, b->up, b->down, b->moe->n_local))
        return mmc_moe_experts_swiglu(ctx, x, counts, b->moe->n_local, b->gate, b->up, b->down);
    mmc_tensor **ys = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *ys * (size_t)b->moe->n_local);
    int cnt = 0;
    int64_t off = 0;
    for (int64_t e = 0; e < b->moe->n_local; e++) {
        if (!counts[e]) continue;   /* as transformers: an expert no row picked is not run */
        mmc_tensor *seg = mmc_narrow(ctx, x, 0, off, counts[e]);                   /* [n_e, C] */
        ys[cnt++] = swiglu_mlp(ctx, seg, &b->gate[e], &b->up[e], &b->down[e]);  /* [n_e, C] */
        off += counts[e];
    }
    return stack_rows(ctx, ys, cnt, C);
}

mmc_tensor *mmc_moe_block_forward(mmc_ctx *ctx, mmc_moe_block *b, mmc_tensor *h) {
    mmc_moe *moe = b->moe;
    const int64_t C = h->shape[h->ndim - 1], N = mmc_numel(h) / C, E = moe->n_experts, k = moe->top_k;
    mmc_arena *ar = mmc_ctx_arena(ctx);
    mmc_tensor *x = mmc_reshape(ctx, mmc_contiguous(ctx, h), 2, MMC_SHAPE(N, C));    /* [N, C] */
    /* router */
    mmc_tensor *probs = mmc_softmax(ctx, mmc_linear(ctx, x, b->router, NULL));      /* [N, E] */
    const float *pd = probs->data;
    int32_t *pick = mmc_arena_alloc(ar, sizeof(int32_t) * (size_t)(N * k));          /* [N, k] expert ids */
    for (int64_t r = 0; r < N; r++)   /* torch.topk: largest first */
        for (int64_t j = 0; j < k; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t q = 0; q < j && !taken; q++) taken = pick[r * k + q] == e;
                if (!taken && (best < 0 || pd[r * E + e] > pd[r * E + best])) best = e;
            }
            pick[r * k + j] = (int32_t)best;
        }
    int64_t *counts = mmc_arena_alloc(ar, sizeof(int64_t) * (size_t)E);
    memset(counts, 0, sizeof(int64_t) * (size_t)E);
    for (int64_t p = 0; p < N * k; p++) counts[pick[p]]++;
    if (moe->aux_state == AUX_COLLECT) {   /* once per training forward (not again when recomputed) */
        double *cnt = moe->aux_stats + 1, *psum = moe->aux_stats + 1 + E;
        moe->aux_stats[0] += (double)N;
        for (int64_t e = 0; e < E; e++) cnt[e] += (double)counts[e];
        for (int64_t r = 0; r < N; r++)
            for (int64_t e = 0; e < E; e++) psum[e] += pd[r * E + e];
        for (int64_t e = 0; e < E; e++) moe->stat_tokens[b->sparse_idx * E + e] += counts[e];
        moe->stat_routed += N * k;
    }
    if (moe->aux_state != AUX_OFF && moe->output_router_logits && mmc_grad_enabled(ctx))
        probs = aux_hook(ctx, moe, probs);
    /* routing weights: the picked probabilities [N*k, 1] (renormalised with norm_topk_prob) */
    mmc_tensor *sel = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(N * k));
    for (int64_t p = 0; p < N * k; p++) ((int32_t *)sel->data)[p] = (int32_t)((p / k) * E + pick[p]);
    mmc_tensor *w = mmc_gather_rows(ctx, mmc_reshape(ctx, probs, 2, MMC_SHAPE(N * E, 1)), sel);   /* [N*k, 1] */
    if (moe->norm_topk_prob)
        w = mmc_reshape(ctx, topk_norm(ctx, mmc_reshape(ctx, w, 2, MMC_SHAPE(N, k))), 2, MMC_SHAPE(N * k, 1));
    /* pairs sorted by expert (stable): sorted row s holds pair perm[s]; order[p] = its row */
    int64_t *start = mmc_arena_alloc(ar, sizeof(int64_t) * (size_t)(E + 1));
    start[0] = 0;
    for (int64_t e = 0; e < E; e++) start[e + 1] = start[e] + counts[e];
    mmc_tensor *perm = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(N * k)), *tok = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(N * k));
    int32_t *order = mmc_arena_alloc(ar, sizeof(int32_t) * (size_t)(N * k));
    for (int64_t p = 0; p < N * k; p++) {
        int64_t s = start[pick[p]]++;
        ((int32_t *)perm->data)[s] = (int32_t)p;
        ((int32_t *)tok->data)[s] = (int32_t)(p / k);
        order[p] = (int32_t)s;
    }
    /* tp: f before the split experts (x's gradient from them is partial on each rank) */
    mmc_tensor *xe = mmc_tp_copy(ctx, moe->tp, x);                                     /* [N, C] */
    mmc_tensor *xs = mmc_gather_rows(ctx, xe, tok);                                    /* [N*k, C] by expert */
    mmc_tensor *ys;
    if (moe->ep && mmc_comm_size(moe->ep) > 1) ys = mmc_ep_experts(ctx, moe->ep, xs, counts, E, b, run_experts);
    else ys = run_experts(ctx, b, xs, counts);                                         /* [N*k, C] */
    ys = mmc_tp_reduce(ctx, moe->tp, ys);                          /* tp: g, the partial outputs summed */
    ys = mmc_mul(ctx, ys, mmc_gather_rows(ctx, w, perm));                              /* weighted */
    mmc_tensor *out = unsort_sum(ctx, ys, order, k);                                   /* [N, C] */
    /* shared expert, gated */
    mmc_tensor *sh = swiglu_mlp(ctx, xe, &b->sh_gate, &b->sh_up, &b->sh_down);        /* [N, C] (tp: partial) */
    sh = mmc_tp_reduce(ctx, moe->tp, sh);
    sh = mmc_mul(ctx, sh, sigmoid(ctx, mmc_linear(ctx, x, b->sh_router, NULL)));       /* [N, C] * [N, 1] */
    return mmc_reshape(ctx, mmc_add(ctx, out, sh), h->ndim, h->shape);
}

/* ------------------------------------------------------------------ auxiliary loss, statistics */
void mmc_moe_aux_set_weight(mmc_moe *moe, double w) { moe->aux_weight = w; }

void mmc_moe_aux_begin(mmc_moe *moe) {
    memset(moe->aux_own, 0, sizeof(double) * (size_t)(1 + 2 * moe->n_experts));
    mmc_moe_aux_attach(moe, NULL, NULL, true);
}

double mmc_moe_aux_end(mmc_moe *moe) {
    mmc_moe_aux_attach(moe, NULL, NULL, false);
    return mmc_moe_aux_finish(moe, moe->aux_own, moe->aux_own_grad);
}

int64_t mmc_moe_aux_len(const mmc_moe *moe) { return 1 + 2 * moe->n_experts; }

void mmc_moe_aux_attach(mmc_moe *moe, double *stats, float *grad, bool collect) {
    moe->aux_stats = stats ? stats : moe->aux_own;
    moe->aux_grad = stats ? grad : moe->aux_own_grad;
    moe->aux_state = collect ? AUX_COLLECT : AUX_APPLY;   /* (training only: inference never attaches) */
}

double mmc_moe_aux_finish(const mmc_moe *moe, const double *stats, float *grad) {
    const int64_t n = moe->n_experts;
    memset(grad, 0, sizeof(float) * (size_t)n);
    if (!moe->output_router_logits || stats[0] == 0) return 0.0;
    const double E = (double)n, R = stats[0];
    const double *cnt = stats + 1, *psum = stats + 1 + n;
    const double f = moe->aux_weight * moe->aux_coef;
    double aux = 0;
    for (int64_t e = 0; e < n; e++) {
        aux += (cnt[e] / R) * (psum[e] / R);
        grad[e] = (float)(f * E * cnt[e] / (R * R));
    }
    return f * E * aux;
}

double mmc_moe_aux_coef(const mmc_moe *moe) { return moe->output_router_logits ? moe->aux_coef : 0.0; }

const int64_t *mmc_moe_expert_tokens(const mmc_moe *moe, int64_t *n_sparse, int64_t *n_experts, int64_t *n_routed) {
    *n_sparse = moe->n_sparse;
    *n_experts = moe->n_experts;
    *n_routed = moe->stat_routed;
    return moe->stat_tokens;
}

void mmc_moe_stats_reset(mmc_moe *moe) {
    memset(moe->stat_tokens, 0, sizeof(int64_t) * (size_t)(moe->n_sparse * moe->n_experts));
    moe->stat_routed = 0;
}

int64_t mmc_moe_num_experts(const mmc_moe *moe) { return moe->n_experts; }

void mmc_moe_shape(const mmc_moe *moe, int64_t *n_experts, int64_t *top_k, int64_t *inter, int64_t *shared_inter) {
    *n_experts = moe->n_experts, *top_k = moe->top_k, *inter = moe->inter, *shared_inter = moe->shared_inter;
}

/* ------------------------------------------------------------------ loading */
static mmc_status set_ep(mmc_moe *moe, struct mmc_comm *ep) {
    const int P = mmc_comm_size(ep);
    mmc_status st = mmc_ep_check(moe->n_experts, P);
    if (st) return st;
    moe->ep = P > 1 ? ep : NULL;
    moe->n_local = moe->n_experts / P;
    moe->first = (int64_t)mmc_comm_rank(ep) * moe->n_local;
    return MMC_OK;
}

mmc_status mmc_qwen2_moe_load(const char *dir, const mmc_json *config, bool trainable, struct mmc_comm *ep,
                              mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg;
    mmc_status st = mmc_qwen2_moe_config_read(config, &cfg);
    if (st) return mmc_error_prefix(st, "%s/config.json", dir);
    if (ep && (st = set_ep(cfg.moe, ep))) { mmc_moe_free(cfg.moe); return st; }
    if (!trainable) cfg.moe->aux_state = AUX_OFF;
    st = mmc_decoder_load_cfg(dir, &cfg, trainable, out);
    if (st) { mmc_moe_free(cfg.moe); return st; }
    (*out)->moe = cfg.moe;
    return MMC_OK;
}

/* Tensor parallelism over tp: the expert and shared-expert widths must split evenly (the
 * decoder's own sizes are mmc_qwen2_tp_check's). */
static mmc_status set_tp(mmc_moe *moe, struct mmc_comm *tp) {
    const int P = mmc_comm_size(tp);
    const char *key = moe->inter % P ? "moe_intermediate_size" : moe->shared_inter % P ? "shared_expert_intermediate_size"
                                                                                      : NULL;
    if (key) {
        char ok[160] = "";
        size_t len = 0;
        for (int d = 1; d <= 64 && len + 8 < sizeof ok; d++)
            if (!(moe->inter % d) && !(moe->shared_inter % d))
                len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%d", len ? ", " : "", d);
        return mmc_error(MMC_ERR_INVALID, "tensor_parallel %d does not divide %s %lld: every expert's gate/up rows and "
                         "down columns are split evenly over the tensor-parallel ranks; use tensor_parallel %s", P, key,
                         (long long)(moe->inter % P ? moe->inter : moe->shared_inter), ok);
    }
    moe->tp = P > 1 ? tp : NULL;
    moe->tp_size = P;
    return MMC_OK;
}

/* The config with its MoE state laid out for ep and tp (either NULL), the decoder's tp sizes checked. */
static mmc_status read_tp(const mmc_json *config, struct mmc_comm *ep, struct mmc_comm *tp, mmc_qwen2_config *cfg) {
    mmc_status st = mmc_qwen2_moe_config_read(config, cfg);
    if (st) return st;
    if (ep) st = set_ep(cfg->moe, ep);
    if (!st) st = set_tp(cfg->moe, tp);
    if (!st) st = mmc_qwen2_tp_check(cfg, mmc_comm_size(tp), "the language model");
    if (st) { mmc_moe_free(cfg->moe); cfg->moe = NULL; }
    return st;
}

mmc_status mmc_qwen2_moe_load_tp(const char *dir, const mmc_json *config, bool trainable, struct mmc_comm *ep,
                                 struct mmc_comm *tp, mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg;
    mmc_status st = read_tp(config, ep, tp, &cfg);
    if (st) return mmc_error_prefix(st, "%s/config.json", dir);
    if (!trainable) cfg.moe->aux_state = AUX_OFF;
    st = mmc_qwen2_load_tp(dir, &cfg, tp, trainable, out);
    if (st) { mmc_moe_free(cfg.moe); return st; }
    (*out)->moe = cfg.moe;
    return MMC_OK;
}

mmc_status mmc_qwen2_moe_new_tp(const mmc_json *config, uint64_t seed, struct mmc_comm *ep, struct mmc_comm *tp,
                                mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2 *full = NULL;   /* the single-process draw (this rank's experts), then sliced */
    mmc_status st = mmc_qwen2_moe_new(config, seed, ep, &full);
    if (st) return st;
    mmc_qwen2_config cfg;
    if ((st = read_tp(config, ep, tp, &cfg))) { mmc_qwen2_free(full); return mmc_error_prefix(st, "config.json"); }
    st = mmc_qwen2_shard_tp_cfg(&cfg, full, tp, out);
    mmc_qwen2_free(full);
    if (st) { mmc_moe_free(cfg.moe); return st; }
    (*out)->moe = cfg.moe;
    return MMC_OK;
}

mmc_status mmc_qwen2_moe_new(const mmc_json *config, uint64_t seed, struct mmc_comm *ep, mmc_qwen2 **out) {
    *out = NULL;
    mmc_qwen2_config cfg;
    mmc_status st = mmc_qwen2_moe_config_read(config, &cfg);
    if (st) return mmc_error_prefix(st, "config.json");
    if (ep && (st = set_ep(cfg.moe, ep))) { mmc_moe_free(cfg.moe); return st; }
    st = mmc_qwen2_new(&cfg, seed, out);
    if (st) { mmc_moe_free(cfg.moe); return st; }
    (*out)->moe = cfg.moe;
    return MMC_OK;
}
