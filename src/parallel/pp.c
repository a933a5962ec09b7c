/* pp.c — pipeline parallelism (mmc_pp.h) for the Qwen2 / Qwen2-VL decoder, after Megatron-LM's
 * pipeline_parallel/schedules.py (forward_backward_pipelining_without_interleaving: warm-up,
 * steady 1F1B, cool-down) and p2p_communication.py (the residual stream and its gradient sent
 * between neighbouring stages): the schedule and its simulator, the layer split, trimming a
 * model to its stage, and the runtime that executes one step's micro-batches.
 *
 * Each micro-batch in flight has its own autograd context (tape and activation arena), so the
 * backward of micro-batch k walks only its own graph while later forwards are still alive; the
 * parameters and their gradient buffers are shared (persistent). The activation a stage sends
 * stays in its context until that micro-batch's backward (the send is waited on there, when the
 * next stage has certainly received it); the gradient sent back is copied into a per-slot
 * buffer so the context is released at once. Receives are blocking, sends non-blocking: with
 * the 1F1B order no stage ever waits on a send, so the step cannot deadlock (the simulator
 * checks the same dependency graph). A communicator failure inside the step is returned. */
#include "mmc_pp.h"
#include "mmc_ops.h"
#include "mmc_trainer.h"
#include "mmc_vl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_ACT = 101, TAG_GRAD = 102, TAG_TIED = 103 };

/* ------------------------------------------------------------------ schedule */
int mmc_pp_schedule_1f1b(int P, int stage, int M, mmc_pp_op *ops) {
    if (P < 1 || stage < 0 || stage >= P || M < 1 || !ops) return -1;
    const int warm = P - 1 - stage < M ? P - 1 - stage : M;
    int n = 0, f = 0, b = 0;
    for (; f < warm; f++) ops[n++] = (mmc_pp_op){MMC_PP_FORWARD, f};
    for (; f < M; f++, b++) {   /* steady: one forward, one backward */
        ops[n++] = (mmc_pp_op){MMC_PP_FORWARD, f};
        ops[n++] = (mmc_pp_op){MMC_PP_BACKWARD, b};
    }
    for (; b < M; b++) ops[n++] = (mmc_pp_op){MMC_PP_BACKWARD, b};   /* cool-down */
    return n;
}

int mmc_pp_max_in_flight(int P, int stage, int M) {
    int warm = P - 1 - stage < M ? P - 1 - stage : M;
    return warm < M ? warm + 1 : warm;
}

double mmc_pp_bubble_fraction(int P, int M) {
    return P < 1 || M < 1 ? 0.0 : (double)(P - 1) / (double)(M + P - 1);
}

double mmc_pp_simulate(int P, int M, double tf, double tb, double *bubble) {
    if (bubble) *bubble = 0;
    if (P < 1 || M < 1) return -1;
    mmc_pp_op *ops = malloc(sizeof *ops * (size_t)(2 * M * P));
    double *fend = malloc(sizeof *fend * (size_t)(M * P)), *bend = malloc(sizeof *bend * (size_t)(M * P));
    double *free_at = calloc((size_t)P, sizeof *free_at);
    int *next = calloc((size_t)P, sizeof *next);
    double span = -1;
    if (!ops || !fend || !bend || !free_at || !next) goto done;
    for (int s = 0; s < P; s++) mmc_pp_schedule_1f1b(P, s, M, ops + (size_t)s * 2 * M);
    for (int i = 0; i < M * P; i++) fend[i] = bend[i] = -1;   /* [stage * M + mb]: finish times */
    for (int left = 2 * M * P; left > 0;) {
        int progressed = 0;
        for (int s = 0; s < P; s++) {
            while (next[s] < 2 * M) {
                const mmc_pp_op o = ops[(size_t)s * 2 * M + next[s]];
                double ready;   /* when its input has arrived */
                if (o.kind == MMC_PP_FORWARD) ready = s == 0 ? 0 : fend[(s - 1) * M + o.mb];
                else ready = s == P - 1 ? fend[s * M + o.mb] : bend[(s + 1) * M + o.mb];
                if (ready < 0) break;
                double start = ready > free_at[s] ? ready : free_at[s];
                free_at[s] = start + (o.kind == MMC_PP_FORWARD ? tf : tb);
                (o.kind == MMC_PP_FORWARD ? fend : bend)[s * M + o.mb] = free_at[s];
                next[s]++, left--, progressed++;
            }
        }
        if (!progressed) goto done;   /* deadlock */
    }
    span = 0;
    for (int s = 0; s < P; s++) span = free_at[s] > span ? free_at[s] : span;
    if (bubble) *bubble = 1.0 - (double)M * (tf + tb) / span;   /* per stage: busy M (tf + tb) of span */
done:
    free(ops); free(fend); free(bend); free(free_at); free(next);
    return span;
}

/* ------------------------------------------------------------------ stages */
mmc_status mmc_pp_split_layers(int64_t n_layers, int P, const int64_t *sizes, int n_sizes, int64_t *bounds) {
    if (P < 1) return mmc_error(MMC_ERR_INVALID, "parallel.pipeline_parallel must be at least 1 (got %d)", P);
    if (n_sizes > 0) {
        if (n_sizes != P)
            return mmc_error(MMC_ERR_INVALID, "parallel.pipeline_layers has %d entries but pipeline_parallel is %d: "
                             "give one layer count per stage", n_sizes, P);
        int64_t sum = 0;
        for (int s = 0; s < P; s++) {
            if (sizes[s] < 1)
                return mmc_error(MMC_ERR_INVALID, "parallel.pipeline_layers: stage %d gets %lld layers; every stage "
                                 "needs at least one decoder layer", s, (long long)sizes[s]);
            sum += sizes[s];
        }
        if (sum != n_layers)
            return mmc_error(MMC_ERR_INVALID, "parallel.pipeline_layers adds up to %lld layers but the model has %lld "
                             "(num_hidden_layers): the counts must add up to it", (long long)sum, (long long)n_layers);
        bounds[0] = 0;
        for (int s = 0; s < P; s++) bounds[s + 1] = bounds[s] + sizes[s];
        return MMC_OK;
    }
    if (n_layers < P)
        return mmc_error(MMC_ERR_INVALID, "parallel.pipeline_parallel %d is more than the model's %lld decoder layers "
                         "(num_hidden_layers): a stage would be empty; use at most %lld stages", P,
                         (long long)n_layers, (long long)n_layers);
    if (n_layers % P)
        return mmc_error(MMC_ERR_INVALID, "parallel.pipeline_parallel %d does not divide the model's %lld decoder "
                         "layers; use a divisor of %lld or give each stage's count in parallel.pipeline_layers "
                         "(e.g. [%lld, %lld, ...])", P, (long long)n_layers, (long long)n_layers,
                         (long long)(n_layers / P + 1), (long long)(n_layers / P));
    for (int s = 0; s <= P; s++) bounds[s] = n_layers / P * s;
    return MMC_OK;
}

static bool keep_param(const char *name, int stage, int P, bool tied, int64_t l0, int64_t l1) {
    if (!strncmp(name, "layers.", 7)) {
        long long l = atoll(name + 7);
        return l >= l0 && l < l1;
    }
    if (!strcmp(name, "embed_tokens.weight")) return stage == 0 || (tied && stage == P - 1);
    return stage == P - 1;   /* norm.weight, lm_head.weight */
}

mmc_status mmc_pp_trim_qwen2_vl(mmc_qwen2_vl *m, int stage, int P, int64_t l0, int64_t l1) {
    mmc_vision *v = m->visual;
    if (stage > 0) {   /* the towers run on the first stage only */
        for (int i = 0; i < v->n_params; i++) mmc_tensor_free(v->params[i]);
        v->n_params = 0;
    }
    return mmc_pp_trim_qwen2(m->lm, stage, P, l0, l1);
}

mmc_status mmc_pp_trim_qwen2(mmc_qwen2 *m, int stage, int P, int64_t l0, int64_t l1) {
    if (m->adapter) return mmc_error(MMC_ERR_UNSUPPORTED, "pipeline stages: the model has an inference adapter");
    const bool tied = m->lm_head == m->embed;
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        mmc_tensor *p = m->params[i];
        if (keep_param(m->param_names[i], stage, P, tied, l0, l1)) {
            if (n != i) {
                m->params[n] = p;
                memcpy(m->param_names[n], m->param_names[i], sizeof m->param_names[0]);
                if (m->param_split) m->param_split[n] = m->param_split[i];   /* tensor parallelism */
            }
            n++;
            continue;
        }
        /* the model's slots that point at it go too */
        if (m->embed == p) m->embed = NULL;
        if (m->norm == p) m->norm = NULL;
        if (m->lm_head == p) m->lm_head = NULL;
        mmc_tensor_free(p);
    }
    m->n_params = n;
    if (!m->embed && tied) m->lm_head = NULL;
    for (int64_t l = 0; l < m->cfg.num_layers; l++)
        if (l < l0 || l >= l1) {
            mmc_qwen2_layer *L = &m->layers[l];
            memset(L, 0, sizeof *L);   /* (its tensors were freed above) */
        }
    return MMC_OK;
}

/* ------------------------------------------------------------------ runtime */
struct mmc_pp {
    mmc_comm *pp;
    int stage, P;
    int64_t l0, l1;
    mmc_qwen2 *m;
    mmc_qwen2_vl *vl;       /* Qwen2-VL (m == vl->lm), or NULL */
    int n_slots;
    mmc_ctx **ctx;          /* [n_slots] one autograd context per micro-batch in flight */
    mmc_tensor **in, **out; /* [n_slots] received input (not on stage 0), output or loss */
    mmc_dist_req **act_req, **grad_req;   /* [n_slots] pending sends */
    float **grad_buf;       /* [n_slots] the input gradient being sent back */
    int64_t *grad_cap;
    int64_t bytes;
    double recv_s;
};

mmc_status mmc_pp_new(mmc_comm *pp, mmc_qwen2 *m, int64_t l0, int64_t l1, mmc_pp **out) {
    *out = NULL;
    mmc_pp *p = calloc(1, sizeof *p);
    if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
    p->pp = pp;
    p->stage = mmc_comm_rank(pp);
    p->P = mmc_comm_size(pp);
    p->l0 = l0, p->l1 = l1, p->m = m;
    p->n_slots = p->P - p->stage;
    const size_t n = (size_t)p->n_slots;
    p->ctx = calloc(n, sizeof *p->ctx);
    p->in = calloc(n, sizeof *p->in);
    p->out = calloc(n, sizeof *p->out);
    p->act_req = calloc(n, sizeof *p->act_req);
    p->grad_req = calloc(n, sizeof *p->grad_req);
    p->grad_buf = calloc(n, sizeof *p->grad_buf);
    p->grad_cap = calloc(n, sizeof *p->grad_cap);
    if (!p->ctx || !p->in || !p->out || !p->act_req || !p->grad_req || !p->grad_buf || !p->grad_cap) goto oom;
    for (size_t i = 0; i < n; i++)
        if (!(p->ctx[i] = mmc_ctx_new())) goto oom;
    *out = p;
    return MMC_OK;
oom:
    mmc_pp_free(p);
    return mmc_error(MMC_ERR_OOM, "out of memory for the pipeline stage's contexts");
}

void mmc_pp_free(mmc_pp *p) {
    if (!p) return;
    for (int i = 0; i < p->n_slots; i++) {
        if (p->act_req) mmc_dist_wait(p->act_req[i]);
        if (p->grad_req) mmc_dist_wait(p->grad_req[i]);
        if (p->ctx && p->ctx[i]) mmc_ctx_free(p->ctx[i]);
        if (p->grad_buf) free(p->grad_buf[i]);
    }
    free(p->ctx); free(p->in); free(p->out); free(p->act_req); free(p->grad_req); free(p->grad_buf);
    free(p->grad_cap);
    free(p);
}

void mmc_pp_set_vl(mmc_pp *p, mmc_qwen2_vl *vl) { p->vl = vl; }

int mmc_pp_stage(const mmc_pp *p) { return p->stage; }
int mmc_pp_stages(const mmc_pp *p) { return p->P; }

void mmc_pp_last_stats(const mmc_pp *p, int64_t *bytes_sent, double *recv_wait_s) {
    if (bytes_sent) *bytes_sent = p->bytes;
    if (recv_wait_s) *recv_wait_s = p->recv_s;
}

typedef struct {
    mmc_pp *p;
    int layer;
    mmc_tensor *cos, *sin;
    mmc_attn_opts attn;
} block_args;

static mmc_tensor *block_fn(mmc_ctx *ctx, void *user, mmc_tensor **in, int n_in) {
    block_args *a = user;
    (void)n_in;
    return mmc_qwen2_layer_forward(ctx, &a->p->m->cfg, &a->p->m->layers[a->layer], in[0], a->cos, a->sin, &a->attn,
                                   NULL, a->layer);
}

static mmc_status recv_timed(mmc_pp *p, void *buf, int64_t n, int peer, int tag) {
    double t0 = mmc_now();
    mmc_status st = mmc_recv(p->pp, buf, n, MMC_F32, peer, tag);
    p->recv_s += mmc_now() - t0;
    return st;
}

/* Forward of micro-batch k (slot k % n_slots): embed or receive, this stage's layers, then send
 * on or (last stage) the loss. */
static mmc_status stage_forward(mmc_pp *p, int k, const mmc_batch *b, double scale, double *loss) {
    const int slot = k % p->n_slots;
    mmc_ctx *ctx = p->ctx[slot];
    mmc_qwen2 *m = p->m;
    const int64_t B = b->B, T = b->T, C = m->cfg.hidden_size;
    const int D = (int)m->cfg.head_dim;
    mmc_status st;
    mmc_ctx_reset(ctx);
    mmc_tensor *cos, *sin, *x = NULL;
    mmc_attn_opts attn = {.causal = true, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
    if (p->vl) {   /* Qwen2-VL: positions from the ids and the media's grids; towers and splice on stage 0 */
        mmc_vl_media media;
        mmc_tensor *ids = mmc_qwen2_vl_batch_media(ctx, b, &media);                 /* [B, T] */
        mmc_vl_seq seq = {.position_ids = b->position_ids, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
        if ((st = mmc_qwen2_vl_inputs(ctx, p->vl, ids, &media, &seq, NULL, NULL, p->stage == 0 ? &x : NULL, &cos,
                                      &sin, &attn)))
            return mmc_error_prefix(st, "micro-batch %d (first sample %lld)", k + 1, (long long)b->sample_index);
    } else if (m->cfg.mrope) {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, B, T));          /* [3, B, T] */
        memcpy(pos->data, b->position_ids, (size_t)(3 * B * T) * sizeof(int64_t));
        mmc_rope_table_mrope(ctx, pos, m->cfg.mrope_section, D, m->cfg.rope_theta, &cos, &sin);
    } else {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(B, T));             /* [B, T] */
        memcpy(pos->data, b->position_ids, (size_t)(B * T) * sizeof(int64_t));
        mmc_rope_table_1d(ctx, pos, D, m->cfg.rope_theta, &cos, &sin);
    }
    if (p->stage == 0 && p->vl) {
        p->in[slot] = NULL;   /* (x: the embeddings with the vision features) */
    } else if (p->stage == 0) {
        mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));             /* [B, T] */
        memcpy(ids->data, b->input_ids, (size_t)(B * T) * sizeof(int32_t));
        x = mmc_qwen2_embed(ctx, m, ids);                                        /* [B, T, C] */
        p->in[slot] = NULL;
    } else {
        x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, T, C));                        /* [B, T, C] from stage - 1 */
        if ((st = recv_timed(p, x->data, B * T * C, p->stage - 1, TAG_ACT)))
            return mmc_error_prefix(st, "pipeline stage %d: receiving micro-batch %d's activations", p->stage, k + 1);
        x->flags |= MMC_REQUIRES_GRAD;   /* a leaf whose gradient goes back to stage - 1 */
        p->in[slot] = x;
    }
    const bool ckpt = m->recompute;
    for (int64_t l = p->l0; l < p->l1; l++) {
        if (ckpt) {
            block_args *a = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *a);
            *a = (block_args){p, (int)l, cos, sin, attn};
            x = mmc_checkpoint(ctx, block_fn, a, &x, 1);
        } else {
            x = mmc_qwen2_layer_forward(ctx, &m->cfg, &m->layers[l], x, cos, sin, &attn, NULL, (int)l);
        }
    }
    if (p->stage == p->P - 1) {
        mmc_tensor *h = mmc_rmsnorm(ctx, x, m->norm, (float)m->cfg.rms_norm_eps);   /* [B, T, C] */
        int64_t n;
        if (m->tp) {   /* vocab-parallel: this rank's logits [B, T, V/tp], never gathered */
            mmc_tensor *logits = mmc_qwen2_logits_local(ctx, m, h);              /* [B, T, V/tp] */
            p->out[slot] = mmc_causal_lm_loss_tp(ctx, m->tp, mmc_comm_rank(m->tp) * m->lm_head->shape[0], logits,
                                                 b->labels, scale, &n);         /* [] */
        } else {
            mmc_tensor *logits = mmc_qwen2_logits(ctx, m, h);                     /* [B, T, V] */
            p->out[slot] = mmc_causal_lm_loss(ctx, logits, b->labels, scale, &n); /* [] */
        }
        *loss += *(const float *)p->out[slot]->data;
        return MMC_OK;
    }
    x = mmc_contiguous(ctx, x);
    p->out[slot] = x;
    p->bytes += (int64_t)mmc_nbytes(x);
    if ((st = mmc_send_start(p->pp, x->data, B * T * C, MMC_F32, p->stage + 1, TAG_ACT, &p->act_req[slot])))
        return mmc_error_prefix(st, "pipeline stage %d: sending micro-batch %d's activations", p->stage, k + 1);
    return MMC_OK;
}

static mmc_status stage_backward(mmc_pp *p, int k) {
    const int slot = k % p->n_slots;
    mmc_ctx *ctx = p->ctx[slot];
    mmc_tensor *y = p->out[slot];
    mmc_status st;
    if (p->stage == p->P - 1) {
        mmc_backward(ctx, y);
    } else {
        mmc_tensor *g = mmc_grad(ctx, y);   /* [B, T, C] zeros: y has no consumer here */
        if ((st = recv_timed(p, g->data, mmc_numel(y), p->stage + 1, TAG_GRAD)))
            return mmc_error_prefix(st, "pipeline stage %d: receiving micro-batch %d's gradient", p->stage, k + 1);
        /* stage + 1 has used our activations: the send is complete (or completes now) */
        if ((st = mmc_dist_wait(p->act_req[slot]))) return st;
        p->act_req[slot] = NULL;
        if (mmc_requires_grad(y)) {
            bool prev = mmc_set_grad_enabled(ctx, false);   /* backward rules are not recorded */
            mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
            mmc_set_grad_enabled(ctx, prev);
        }
    }
    if (p->stage > 0) {
        mmc_tensor *x = p->in[slot];
        const int64_t n = mmc_numel(x);
        if ((st = mmc_dist_wait(p->grad_req[slot]))) return st;   /* the slot's previous send */
        p->grad_req[slot] = NULL;
        if (p->grad_cap[slot] < n) {
            free(p->grad_buf[slot]);
            if (!(p->grad_buf[slot] = malloc((size_t)n * sizeof(float)))) return mmc_error(MMC_ERR_OOM, "out of memory");
            p->grad_cap[slot] = n;
        }
        if (x->grad) memcpy(p->grad_buf[slot], x->grad->data, (size_t)n * sizeof(float));
        else memset(p->grad_buf[slot], 0, (size_t)n * sizeof(float));   /* nothing trainable reached it */
        p->bytes += n * (int64_t)sizeof(float);
        if ((st = mmc_send_start(p->pp, p->grad_buf[slot], n, MMC_F32, p->stage - 1, TAG_GRAD, &p->grad_req[slot])))
            return mmc_error_prefix(st, "pipeline stage %d: sending micro-batch %d's gradient", p->stage, k + 1);
    }
    mmc_ctx_reset(ctx);   /* this micro-batch's activations are done with */
    p->out[slot] = p->in[slot] = NULL;
    return MMC_OK;
}

mmc_status mmc_pp_run(mmc_pp *p, const mmc_batch *mbs, int M, double scale, double *loss) {
    *loss = 0;
    p->bytes = 0;
    p->recv_s = 0;
    mmc_pp_op *ops = malloc(sizeof *ops * (size_t)(2 * M));
    if (!ops) return mmc_error(MMC_ERR_OOM, "out of memory");
    const int n = mmc_pp_schedule_1f1b(p->P, p->stage, M, ops);
    mmc_status st = n == 2 * M ? MMC_OK : mmc_error(MMC_ERR_INVALID, "pipeline: bad schedule (%d micro-batches)", M);
    for (int i = 0; i < n && !st; i++)
        st = ops[i].kind == MMC_PP_FORWARD ? stage_forward(p, ops[i].mb, &mbs[ops[i].mb], scale, loss)
                                           : stage_backward(p, ops[i].mb);
    free(ops);
    for (int i = 0; i < p->n_slots; i++) {   /* the last gradients sent back */
        mmc_status s2 = mmc_dist_wait(p->grad_req[i]);
        p->grad_req[i] = NULL;
        if (!st) st = s2;
        if (st && p->act_req[i]) { mmc_dist_wait(p->act_req[i]); p->act_req[i] = NULL; }
        mmc_ctx_reset(p->ctx[i]);
        p->out[i] = p->in[i] = NULL;
    }
    return st;
}

mmc_status mmc_pp_tied_reduce(mmc_pp *p, float *g, int64_t count) {
    if (p->P < 2 || (p->stage != 0 && p->stage != p->P - 1)) return MMC_OK;
    const int peer = p->stage == 0 ? p->P - 1 : 0;
    float *other = malloc((size_t)count * sizeof(float));
    if (!other) return mmc_error(MMC_ERR_OOM, "out of memory for the tied embedding's gradient");
    mmc_dist_req *rq = NULL;
    mmc_status st = mmc_send_start(p->pp, g, count, MMC_F32, peer, TAG_TIED, &rq);
    if (!st) st = mmc_recv(p->pp, other, count, MMC_F32, peer, TAG_TIED);
    mmc_status s2 = mmc_dist_wait(rq);
    if (!st) st = s2;
    /* a + b is b + a in floating point: both copies get the same sum */
    if (!st)
        for (int64_t i = 0; i < count; i++) g[i] += other[i];
    free(other);
    return st ? mmc_error_prefix(st, "pipeline: summing the tied embedding's gradient") : MMC_OK;
}
