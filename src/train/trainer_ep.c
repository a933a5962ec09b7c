/* trainer_ep.c — the trainer's side of expert parallelism (mmc_ep.h) and of MoE models: the
 * expert-parallel groups (Megatron-LM's layout: expert_parallel consecutive data-parallel ranks
 * share one copy of every layer's experts; the ranks holding the same experts form the
 * expert-data-parallel group), the gradient reduction after backward (dense parameters summed
 * over all data-parallel ranks, a routed expert's over the ranks holding it: the exchange's
 * backward already brought it every token routed to it within its group), the swap to every
 * expert's weights for checkpoints (the Hugging Face layout, so they load into any layout), and
 * the capacity statistics logged each step (tokens per expert, max / min over the mean). */
#include "trainer_internal.h"
#include "mmc_ep.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mmc_status mmc_ep_trainer_groups(mmc_trainer *t) {
    const int E = (int)t->cfg->parallel.expert_parallel, d = t->dp_rank;
    if (t->dp_size % E)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.expert_parallel %d does not divide the %d data-parallel ranks",
                         t->cfg->file, E, t->dp_size);
    mmc_status st = mmc_comm_split(t->dpc, d / E, d % E, "ep", &t->epc);
    if (!st) st = mmc_comm_split(t->dpc, d % E, d / E, "edp", &t->edpc);
    return st;
}

mmc_status mmc_ep_trainer_setup(mmc_trainer *t) {
    if (!(t->ep_split = calloc((size_t)t->n_opt + 1, 1))) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_opt; i++) {
        t->ep_split[i] = mmc_ep_is_expert_param(t->opt_names[i]) ? 0 : -1;
        /* a LoRA checkpoint is rank 0's adapters: every one must be replicated */
        if (t->lora && t->ep_split[i] >= 0)
            return mmc_error(MMC_ERR_UNSUPPORTED, "%s: LoRA on the routed experts (%s) with parallel.expert_parallel is "
                             "not supported yet; target the attention, shared_expert or dense MLP modules (e.g. q_proj, "
                             "v_proj, shared_expert.up_proj), or train without expert_parallel", t->cfg->file,
                             t->opt_names[i]);
        /* every trained tensor gets a gradient buffer now, so that each rank joins the same reductions
         * whether or not a token reached its experts this step */
        if (!t->opt_model[i]->grad) mmc_grad(t->ctx, t->opt_model[i]);
    }
    return MMC_OK;
}

mmc_status mmc_ep_trainer_reduce(mmc_trainer *t, double *loss) {
    mmc_status st;
    for (int i = 0; i < t->n_opt; i++) {
        mmc_tensor *g = t->opt_model[i]->grad;
        mmc_comm *c = t->ep_split[i] >= 0 ? t->edpc : t->dpc;
        if (g && mmc_comm_size(c) > 1 && (st = mmc_all_reduce(c, g->data, g->data, mmc_numel(g), MMC_F32, MMC_SUM)))
            return st;
    }
    if ((st = mmc_all_reduce(t->dpc, loss, loss, 1, MMC_F64, MMC_SUM))) return st;
    if (!isfinite(*loss))   /* every rank sees the sum: all stop at the same step */
        return mmc_error(MMC_ERR_NUMERIC, "step %lld: the loss is not finite on some rank; stopping without updating "
                         "the weights — the last checkpoint is intact; lower optimizer.lr or check the data",
                         (long long)t->step + 1);
    return MMC_OK;
}

mmc_status mmc_ep_trainer_grad_norm(mmc_trainer *t, double *norm) {
    double sq[3] = {0, 0, 0};   /* replicated, tp-split dense, experts */
    for (int i = 0; i < t->n_opt; i++) {
        const mmc_tensor *g = t->opt[i]->grad;
        if (!g) continue;
        const float *d = g->data;
        double s = 0;
        for (int64_t e = 0, n = mmc_numel(g); e < n; e++) s += (double)d[e] * d[e];
        sq[t->ep_split[i] >= 0 ? 2 : t->opt_split && t->opt_split[i] >= 0 ? 1 : 0] += s;
    }
    mmc_status st = mmc_all_reduce(t->epc, &sq[2], &sq[2], 1, MMC_F64, MMC_SUM);
    if (!st && t->tpc) st = mmc_all_reduce(t->tpc, &sq[1], &sq[1], 2, MMC_F64, MMC_SUM);
    if (st) return st;
    *norm = sqrt(sq[0] + sq[1] + sq[2]);
    return MMC_OK;
}

/* The optimizer's tensors, names and AdamW moments with every rank's experts (all-gathered over
 * epc), so that optimizer.safetensors holds the whole state under the global names and a resume in
 * any layout reads each rank's experts by name. */
static mmc_status gather_opt(mmc_trainer *t, mmc_ep_swap *sw) {
    const int P = mmc_comm_size(t->epc), r = mmc_comm_rank(t->epc);
    const int64_t El = mmc_moe_num_experts(t->lm->moe) / P, first = (int64_t)r * El;
    const int cap = t->n_opt * P + 1;
    sw->fopt = calloc((size_t)cap, sizeof *sw->fopt);
    sw->fopt_model = calloc((size_t)cap, sizeof *sw->fopt_model);
    sw->fnames = calloc((size_t)cap, sizeof *sw->fnames);
    sw->fptrs = calloc((size_t)cap, sizeof *sw->fptrs);
    sw->fm = calloc((size_t)cap, sizeof *sw->fm);
    sw->fv = calloc((size_t)cap, sizeof *sw->fv);
    sw->own = calloc((size_t)cap, sizeof *sw->own);
    if (!sw->fopt || !sw->fopt_model || !sw->fnames || !sw->fptrs || !sw->fm || !sw->fv || !sw->own)
        return mmc_error(MMC_ERR_OOM, "out of memory");
    mmc_status st = MMC_OK;
    int n = 0;
    for (int i = 0; i < t->n_opt && !st; i++) {
        mmc_tensor *p = t->opt[i];
        const char *name = t->opt_names[i], *at = strstr(name, ".mlp.experts.");
        if (t->ep_split[i] < 0 || !at || !t->adamw.m) {
            sw->fopt[n] = p; sw->fopt_model[n] = t->opt_model[i]; sw->fptrs[n] = name;
            sw->fm[n] = t->adamw.m ? t->adamw.m[i] : NULL; sw->fv[n] = t->adamw.v ? t->adamw.v[i] : NULL;
            n++;
            continue;
        }
        const int64_t len = mmc_numel(p);
        long long e = 0;
        const char *num = at + strlen(".mlp.experts."), *tail = strchr(num, '.');
        sscanf(num, "%lld", &e);
        float *g = malloc(sizeof(float) * (size_t)(3 * len * P));
        if (!g || !tail) { free(g); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        const float *src[3] = {p->data, t->adamw.m[i], t->adamw.v[i]};
        for (int k = 0; k < 3 && !st; k++) st = mmc_all_gather(t->epc, src[k], g + (size_t)(k * len * P), len, MMC_F32);
        for (int q = 0; q < P && !st; q++, n++) {
            sw->own[n] = true;
            sw->fopt[n] = mmc_tensor_new(MMC_F32, p->ndim, p->shape);
            sw->fm[n] = malloc(sizeof(float) * (size_t)len);
            sw->fv[n] = malloc(sizeof(float) * (size_t)len);
            if (!sw->fopt[n] || !sw->fm[n] || !sw->fv[n]) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            memcpy(sw->fopt[n]->data, g + (size_t)(q * len), sizeof(float) * (size_t)len);
            /* a bf16 run's masters differ from the model tensors: checkpoint.c then saves them as master.* */
            sw->fopt_model[n] = p != t->opt_model[i] ? t->opt_model[i] : sw->fopt[n];
            memcpy(sw->fm[n], g + (size_t)((P + q) * len), sizeof(float) * (size_t)len);
            memcpy(sw->fv[n], g + (size_t)((2 * P + q) * len), sizeof(float) * (size_t)len);
            snprintf(sw->fnames[n], sizeof sw->fnames[n], "%.*s%lld%s", (int)(num - name), name,
                     (long long)(e - first + q * El), tail);
            sw->fptrs[n] = sw->fnames[n];
        }
        free(g);
    }
    sw->n_fopt = n;
    return st;
}

static void free_opt(mmc_ep_swap *sw) {
    for (int i = 0; sw->own && i < sw->n_fopt; i++)
        if (sw->own[i]) { mmc_tensor_free(sw->fopt[i]); free(sw->fm[i]); free(sw->fv[i]); }
    free(sw->fopt); free(sw->fopt_model); free(sw->fnames); free(sw->fptrs); free(sw->fm); free(sw->fv); free(sw->own);
    sw->fopt = NULL; sw->own = NULL;
}

mmc_status mmc_ep_trainer_to_full(mmc_trainer *t, mmc_ep_swap *sw) {
    memset(sw, 0, sizeof *sw);
    mmc_status st = gather_opt(t, sw);
    if (!st) st = mmc_ep_full_weights(t->lm, t->epc, &sw->full, &sw->full_names, &sw->n_full);
    if (st) { free_opt(sw); return st; }
    if (!(sw->full_ptrs = calloc((size_t)sw->n_full + 1, sizeof *sw->full_ptrs))) {
        mmc_ep_full_free(sw->full, sw->full_names, sw->n_full);
        return mmc_error(MMC_ERR_OOM, "out of memory");
    }
    /* HF names as build_param_list gives them: model.* and lm_head.weight */
    for (int i = 0; i < sw->n_full; i++) {
        char tmp[96];
        snprintf(tmp, sizeof tmp, "%s", sw->full_names[i]);
        if (strcmp(tmp, "lm_head.weight")) snprintf(sw->full_names[i], 96, "model.%.89s", tmp);
        sw->full_ptrs[i] = sw->full_names[i];
    }
    sw->params = t->params; sw->names = t->names; sw->n = t->n_params;
    t->params = sw->full; t->names = sw->full_ptrs; t->n_params = sw->n_full;
    sw->opt = t->opt; sw->opt_model = t->opt_model; sw->opt_names = t->opt_names; sw->n_opt = t->n_opt;
    sw->m = t->adamw.m; sw->v = t->adamw.v;
    t->opt = sw->fopt; t->opt_model = sw->fopt_model; t->opt_names = sw->fptrs; t->n_opt = sw->n_fopt;
    t->adamw.m = sw->fm; t->adamw.v = sw->fv;
    return MMC_OK;
}

void mmc_ep_trainer_to_local(mmc_trainer *t, mmc_ep_swap *sw) {
    if (!sw->full) return;
    t->params = sw->params; t->names = sw->names; t->n_params = sw->n;
    t->opt = sw->opt; t->opt_model = sw->opt_model; t->opt_names = sw->opt_names; t->n_opt = sw->n_opt;
    t->adamw.m = sw->m; t->adamw.v = sw->v;
    free_opt(sw);
    free(sw->full_ptrs);
    mmc_ep_full_free(sw->full, sw->full_names, sw->n_full);
    memset(sw, 0, sizeof *sw);
}

mmc_status mmc_moe_trainer_stats(mmc_trainer *t, mmc_step_stats *s) {
    int64_t ns, ne, routed;
    const int64_t *tok = mmc_moe_expert_tokens(t->lm->moe, &ns, &ne, &routed);
    const int64_t n = ns * ne;
    if (n == 0) return MMC_OK;
    if (!t->moe_tokens && !(t->moe_tokens = calloc((size_t)n + 1, sizeof *t->moe_tokens)))
        return mmc_error(MMC_ERR_OOM, "out of memory");
    memcpy(t->moe_tokens, tok, sizeof(int64_t) * (size_t)n);
    t->moe_tokens[n] = routed;
    mmc_status st;
    if (t->dp_size > 1 && (st = mmc_all_reduce(t->dpc, t->moe_tokens, t->moe_tokens, n + 1, MMC_I64, MMC_SUM))) return st;
    /* pipeline stages: each counted its own layers' (zeros elsewhere) */
    if (t->pp_size > 1 && (st = mmc_all_reduce(t->groups.pp, t->moe_tokens, t->moe_tokens, n + 1, MMC_I64, MMC_SUM)))
        return st;
    mmc_moe_stats_reset(t->lm->moe);
    const double mean = (double)t->moe_tokens[n] / (double)n;
    int64_t mx = 0, mn = INT64_MAX;
    for (int64_t i = 0; i < n; i++) {
        if (t->moe_tokens[i] > mx) mx = t->moe_tokens[i];
        if (t->moe_tokens[i] < mn) mn = t->moe_tokens[i];
    }
    s->moe_load_max = mean > 0 ? (double)mx / mean : 0;
    s->moe_load_min = mean > 0 ? (double)mn / mean : 0;
    return MMC_OK;
}

void mmc_moe_trainer_metrics(const mmc_trainer *t, const mmc_step_stats *s, char *buf, size_t cap) {
    int64_t ns, ne, routed;
    mmc_moe_expert_tokens(t->lm->moe, &ns, &ne, &routed);
    size_t len = strlen(buf);
    len += (size_t)snprintf(buf + len, cap - len, ", \"moe_load_max\": %.6g, \"moe_load_min\": %.6g, "
                            "\"moe_tokens_per_expert\": [", s->moe_load_max, s->moe_load_min);
    for (int64_t e = 0; e < ne && len + 24 < cap; e++) {   /* summed over the sparse layers */
        int64_t sum = 0;
        for (int64_t l = 0; l < ns; l++) sum += t->moe_tokens[l * ne + e];
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", e ? ", " : "", (long long)sum);
    }
    if (len + 2 < cap) snprintf(buf + len, cap - len, "]");
}
