/* ep.c — expert parallelism (mmc_ep.h), after Megatron-LM's token dispatcher
 * (moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher) and DeepSpeed-MoE: the routed rows of
 * one MoE block, sorted by expert, travel to their experts' ranks with an all-to-all-v (the
 * per-expert row counts first, with a plain all-to-all), are regrouped by local expert, run,
 * put back in arrival order and returned with the reverse all-to-all-v. Both exchanges are
 * autograd ops whose backward is the opposite exchange. Every rank records both exchanges of
 * every block whatever its rows (a rank that received none still answers its peers in
 * backward), so the collectives pair up. A communicator failure inside an op is fatal, as in
 * tp.c and cp.c: half-exchanged activations cannot be recovered. Also: the layout check, which
 * parameters are experts', and the full weights for checkpoints. */
#include "mmc_ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ep_ok(mmc_status st, const char *what) {
    MMC_CHECK(st == MMC_OK, "expert parallel %s: %s", what, mmc_last_error());
}

mmc_status mmc_ep_check(int64_t n_experts, int ep) {
    if (ep >= 1 && n_experts % ep == 0) return MMC_OK;
    char ok[200] = "";
    size_t len = 0;
    for (int64_t d = 1; d <= n_experts && d <= 4096 && len + 16 < sizeof ok; d++)
        if (n_experts % d == 0) len += (size_t)snprintf(ok + len, sizeof ok - len, "%s%lld", len ? ", " : "", (long long)d);
    return mmc_error(MMC_ERR_INVALID, "parallel.expert_parallel %d does not divide num_experts %lld: every rank holds "
                     "the same number of whole experts; use expert_parallel %s", ep, (long long)n_experts, ok);
}

bool mmc_ep_is_expert_param(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

/* ------------------------------------------------------------------ the exchange op */
typedef struct {
    mmc_comm *ep;
    int64_t *send, *recv;   /* [P] rows to / from each rank */
    mmc_tensor *partner;    /* the dispatch's output, for the return exchange: its gradient must exist */
} xchg;

static void exchange_rows(mmc_comm *ep, const float *x, const int64_t *send, float *y, const int64_t *recv, int64_t C) {
    const int P = mmc_comm_size(ep);
    int64_t sc[P], rc[P];
    for (int i = 0; i < P; i++) sc[i] = send[i] * C, rc[i] = recv[i] * C;
    ep_ok(mmc_all_to_all_v(ep, x, sc, y, rc, MMC_F32), "all-to-all-v");
}

static void exchange_backward(mmc_ctx *ctx, mmc_node *n) {
    xchg *e = n->extra;
    mmc_tensor *x = n->in[0];
    const int64_t S = x->shape[0], C = x->shape[1];
    /* the dispatch's backward must run on every rank: give its output a gradient */
    if (e->partner && mmc_requires_grad(e->partner)) mmc_grad(ctx, e->partner);
    float *dx = malloc(sizeof(float) * (size_t)(S * C + 1));
    MMC_CHECK(dx, "expert parallel: out of memory in backward");
    exchange_rows(e->ep, n->out->grad->data, e->recv, dx, e->send, C);
    if (mmc_requires_grad(x)) {
        float *g = mmc_grad(ctx, x)->data;
        for (int64_t i = 0; i < S * C; i++) g[i] += dx[i];
    }
    free(dx);
}

/* x [S, C] (rows for rank i packed in rank order, send[i] of them) -> [sum recv, C] */
static mmc_tensor *exchange(mmc_ctx *ctx, mmc_comm *ep, mmc_tensor *x, int64_t *send, int64_t *recv,
                            mmc_tensor *partner) {
    const int P = mmc_comm_size(ep);
    const int64_t C = x->shape[1];
    int64_t R = 0;
    for (int i = 0; i < P; i++) R += recv[i];
    x = mmc_contiguous(ctx, x);
    mmc_tensor *y = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(R, C));
    exchange_rows(ep, x->data, send, y->data, recv, C);
    if (!mmc_grad_enabled(ctx)) return y;
    /* recorded on every rank alike (the token input always requires grad), whatever x's rows */
    mmc_tensor *tok = mmc_scalar(ctx, 0.0f);
    tok->flags |= MMC_REQUIRES_GRAD;
    mmc_tensor *in[2] = {x, tok};
    mmc_node *n = mmc_tape_record(ctx, "ep_all_to_all_v", exchange_backward, y, 2, in);
    xchg *e = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *e);
    *e = (xchg){ep, send, recv, partner};
    n->extra = e;
    return y;
}

mmc_tensor *mmc_ep_experts(mmc_ctx *ctx, mmc_comm *ep, mmc_tensor *xs, const int64_t *counts, int64_t E,
                           mmc_moe_block *b, mmc_ep_run_fn run) {
    mmc_arena *ar = mmc_ctx_arena(ctx);
    const int P = mmc_comm_size(ep);
    const int64_t El = E / P, C = xs->shape[1];
    /* rows per (source rank, local expert) */
    int64_t *got = mmc_arena_alloc(ar, sizeof(int64_t) * (size_t)E);
    ep_ok(mmc_all_to_all(ep, counts, got, El, MMC_I64), "all-to-all of the expert counts");
    int64_t *send = mmc_arena_alloc(ar, sizeof(int64_t) * (size_t)P), *recv = mmc_arena_alloc(ar, sizeof(int64_t) * (size_t)P);
    int64_t *local = mmc_arena_alloc(ar, sizeof(int64_t) * (size_t)El);
    memset(local, 0, sizeof(int64_t) * (size_t)El);
    int64_t R = 0;
    for (int i = 0; i < P; i++) {
        send[i] = recv[i] = 0;
        for (int64_t el = 0; el < El; el++) {
            send[i] += counts[i * El + el];
            recv[i] += got[i * El + el];
            local[el] += got[i * El + el];
        }
        R += recv[i];
    }
    mmc_tensor *xr = exchange(ctx, ep, xs, send, recv, NULL);                   /* [R, C] by source rank */
    mmc_tensor *yr;
    if (R > 0) {
        /* arrival order (source i, then expert) -> grouped by local expert (then source) */
        mmc_tensor *grp = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(R)), *back = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(R));
        int32_t *g = grp->data, *bk = back->data;
        int64_t t = 0;
        for (int64_t el = 0; el < El; el++) {
            int64_t src = 0;
            for (int i = 0; i < P; i++) {
                int64_t off = src;
                for (int64_t q = 0; q < el; q++) off += got[i * El + q];
                for (int64_t j = 0; j < got[i * El + el]; j++, t++) { g[t] = (int32_t)(off + j); bk[off + j] = (int32_t)t; }
                src += recv[i];
            }
        }
        mmc_tensor *yg = run(ctx, b, mmc_gather_rows(ctx, xr, grp), local);      /* [R, C] by local expert */
        yr = mmc_gather_rows(ctx, yg, back);                                     /* [R, C] arrival order */
    } else {
        yr = mmc_new(ctx, MMC_F32, 2, MMC_SHAPE(0, C));
    }
    return exchange(ctx, ep, yr, recv, send, xr);                                /* [S, C] */
}

/* ------------------------------------------------------------------ full weights */
void mmc_ep_full_free(mmc_tensor **full, char (*names)[96], int n) {
    for (int i = 0; full && i < n; i++) mmc_tensor_free(full[i]);
    free(full);
    free(names);
}

mmc_status mmc_ep_full_weights(mmc_qwen2 *m, mmc_comm *ep, mmc_tensor ***fullp, char (**namesp)[96], int *np) {
    const int P = mmc_comm_size(ep);
    int cap = m->n_params * P + 1, n = 0;
    mmc_tensor **full = calloc((size_t)cap, sizeof *full);
    char (*names)[96] = calloc((size_t)cap, sizeof *names);
    mmc_status st = MMC_OK;
    if (!full || !names) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto fail; }
    for (int i = 0; i < m->n_params && !st; i++) {
        const mmc_tensor *p = m->params[i];
        if (!mmc_ep_is_expert_param(m->param_names[i]) || P == 1) {
            if (!(full[n] = mmc_tensor_new(p->dtype, p->ndim, p->shape))) { st = MMC_ERR_OOM; break; }
            memcpy(full[n]->data, p->data, mmc_nbytes(p));
            snprintf(names[n++], 96, "%s", m->param_names[i]);
            continue;
        }
        /* a run of this layer's local experts: El x {gate, up, down}, the same shapes on every rank */
        long long layer = 0, e0 = 0;
        if (sscanf(m->param_names[i], "layers.%lld.mlp.experts.%lld.", &layer, &e0) != 2) {
            st = mmc_error(MMC_ERR_INVALID, "expert parallel: unexpected parameter name %s", m->param_names[i]);
            break;
        }
        int run = 0;
        while (i + run < m->n_params && mmc_ep_is_expert_param(m->param_names[i + run]) &&
               strncmp(m->param_names[i + run], m->param_names[i], (size_t)(strstr(m->param_names[i], ".mlp.") - m->param_names[i])) == 0)
            run++;
        const int El = run / 3;
        for (int q = 0; q < P && !st; q++)
            for (int j = 0; j < run && !st; j++) {
                const mmc_tensor *lp = m->params[i + j];
                if (!(full[n + q * run + j] = mmc_tensor_new(lp->dtype, lp->ndim, lp->shape))) st = MMC_ERR_OOM;
                const char *what = strstr(m->param_names[i + j], ".mlp.experts.");
                const char *tail = strchr(what + strlen(".mlp.experts."), '.');
                snprintf(names[n + q * run + j], 96, "layers.%lld.mlp.experts.%lld%s", layer, (long long)(q * El + j / 3), tail);
            }
        for (int j = 0; j < run && !st; j++) {
            const mmc_tensor *lp = m->params[i + j];
            const size_t bytes = mmc_nbytes(lp);
            char *buf = malloc(bytes * (size_t)P);
            if (!buf) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            st = mmc_all_gather(ep, lp->data, buf, mmc_numel(lp), lp->dtype);
            for (int q = 0; q < P && !st; q++) memcpy(full[n + q * run + j]->data, buf + (size_t)q * bytes, bytes);
            free(buf);
        }
        n += run * P;
        i += run - 1;
    }
    if (st) goto fail;
    *fullp = full;
    *namesp = names;
    *np = n;
    return MMC_OK;
fail:
    mmc_ep_full_free(full, names, cap);
    return st;
}
