/* autograd.c — the execution context and the reverse-mode tape.
 *
 * Ops run eagerly. In grad mode, an op whose inputs require grad appends one node to the
 * tape (mmc_tape_record). mmc_backward seeds d(loss)/d(loss) = 1 and walks the tape in
 * reverse; each node's backward reads out->grad and accumulates into its inputs' grads.
 * Nodes whose output received no gradient are skipped.
 *
 * Activation checkpointing (mmc_checkpoint) records a single node for a whole block; its
 * backward re-runs the block on a sub-tape, backpropagates through it, and then releases
 * the recomputed activations back to the arena, so at most one block's activations are
 * alive at a time during backward. */
#include "mmc.h"
#include "ctx_internal.h"
#include "mmc_ops.h"
#include "mmc_wgrad.h"

#include <stdlib.h>
#include <string.h>

mmc_ctx *mmc_ctx_new(void) {
    mmc_ctx *c = calloc(1, sizeof *c);
    MMC_CHECK(c, "out of memory");
    c->act = mmc_arena_new(64u << 20);
    c->scratch = mmc_arena_new(16u << 20);
    c->grad_enabled = true;
    return c;
}

void mmc_ctx_free(mmc_ctx *c) {
    if (!c) return;
    if (c->act_saved) c->act = c->act_saved;
    mmc_arena_free(c->act);
    mmc_arena_free(c->off);
    mmc_arena_free(c->scratch);
    free(c->tape);
    free(c->wq);
    free(c->wq_fn);
    free(c);
}

void mmc_ctx_reset(mmc_ctx *c) {
    /* persistent grads of parameters survive; arena tensors vanish */
    c->tape_len = 0;
    c->wq_len = 0;   /* queued weight halves point into the arena: dropped with it */
    if (c->act_saved) c->act = c->act_saved, c->act_saved = NULL;
    mmc_arena_reset(c->act);
    if (c->off) mmc_arena_reset(c->off);
    mmc_arena_reset(c->scratch);
}

mmc_status mmc_ctx_offload_begin(mmc_ctx *c, const char *dir) {
    if (c->act_saved) return mmc_error(MMC_ERR_INVALID, "activation offload: a region is already open");
    if (!c->off) {
        mmc_status st = mmc_arena_new_mapped(dir, 256u << 20, &c->off);
        if (st) return st;
    }
    c->act_saved = c->act;
    c->act = c->off;
    return MMC_OK;
}

void mmc_ctx_offload_end(mmc_ctx *c) {
    if (!c->act_saved) return;
    c->act = c->act_saved;
    c->act_saved = NULL;
    mmc_arena_evict(c->off);
}

size_t mmc_ctx_offload_peak(const mmc_ctx *c) { return c->off ? mmc_arena_peak(c->off) : 0; }

mmc_arena *mmc_ctx_arena(mmc_ctx *c) { return c->act; }
mmc_arena *mmc_ctx_scratch(mmc_ctx *c) { return c->scratch; }
bool mmc_grad_enabled(const mmc_ctx *c) { return c->grad_enabled; }
bool mmc_set_grad_enabled(mmc_ctx *c, bool on) {
    bool prev = c->grad_enabled;
    c->grad_enabled = on;
    return prev;
}

void *mmc_scratch_alloc(mmc_ctx *c, size_t n) { return mmc_arena_alloc(c->scratch, n); }
mmc_arena_mark mmc_scratch_mark(mmc_ctx *c) { return mmc_arena_get_mark(c->scratch); }
void mmc_scratch_release(mmc_ctx *c, mmc_arena_mark m) { mmc_arena_release(c->scratch, m); }

int mmc_tape_len(const mmc_ctx *c) { return c->tape_len; }

static mmc_node *append_node(mmc_ctx *c, const char *op, mmc_backward_fn fn, mmc_tensor *out,
                             int n_in, mmc_tensor *const *in) {
    MMC_CHECK(n_in <= MMC_NODE_MAX_IN, "op %s: %d inputs > %d", op, n_in, MMC_NODE_MAX_IN);
    mmc_node *n = mmc_arena_alloc(c->act, sizeof *n);
    memset(n, 0, sizeof *n);
    n->op = op;
    n->backward = fn;
    n->out = out;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) n->in[i] = in[i];
    out->flags |= MMC_REQUIRES_GRAD;
    if (c->tape_len == c->tape_cap) {
        c->tape_cap = c->tape_cap ? 2 * c->tape_cap : 256;
        c->tape = realloc(c->tape, (size_t)c->tape_cap * sizeof *c->tape);
        MMC_CHECK(c->tape, "out of memory growing the tape");
    }
    c->tape[c->tape_len++] = n;
    return n;
}

mmc_node *mmc_tape_record(mmc_ctx *c, const char *op, mmc_backward_fn fn, mmc_tensor *out,
                          int n_in, mmc_tensor *const *in) {
    if (!c->grad_enabled) return NULL;
    bool any = false;
    for (int i = 0; i < n_in; i++) any |= mmc_requires_grad(in[i]);
    return any ? append_node(c, op, fn, out, n_in, in) : NULL;
}

mmc_tensor *mmc_grad(mmc_ctx *c, mmc_tensor *t) {
    if (t->grad) return t->grad;
    if ((t->flags & MMC_PARAM) && c->hooks.grad && c->hooks.grad(c->hooks.user, c, t)) return t->grad;
    if (t->flags & MMC_PARAM) {
        t->grad = mmc_tensor_new(MMC_F32, t->ndim, t->shape);
        MMC_CHECK(t->grad, "out of memory allocating the gradient of %s", t->name);
    } else {
        t->grad = mmc_zeros(c, MMC_F32, t->ndim, t->shape);
    }
    return t->grad;
}

void mmc_ctx_set_param_hooks(mmc_ctx *c, const mmc_param_hooks *h) {
    if (h) c->hooks = *h;
    else memset(&c->hooks, 0, sizeof c->hooks);
}

void mmc_params_begin(mmc_ctx *c, const void *key) {
    if (c->hooks.begin) c->hooks.begin(c->hooks.user, c, key);
}

void mmc_params_end(mmc_ctx *c, const void *key) {
    if (c->hooks.end) c->hooks.end(c->hooks.user, c, key);
}

void mmc_zero_grad(mmc_tensor **params, int n) {
    for (int i = 0; i < n; i++)
        if (params[i]->grad) memset(params[i]->grad->data, 0, mmc_nbytes(params[i]->grad));
}

void mmc_backward_range(mmc_ctx *c, int from, int to) {
    for (int i = to - 1; i >= from; i--) {
        mmc_node *n = c->tape[i];
        if (!n->out->grad) continue;   /* no gradient reached this node */
        n->backward(c, n);
    }
}

void mmc_backward(mmc_ctx *c, mmc_tensor *loss) {
    MMC_CHECK(mmc_numel(loss) == 1, "mmc_backward: loss must be a scalar (has %lld elements)",
              (long long)mmc_numel(loss));
    if (!mmc_requires_grad(loss)) return;
    mmc_tensor *g = mmc_grad(c, loss);
    ((float *)g->data)[0] += 1.0f;
    bool prev = c->grad_enabled;
    c->grad_enabled = false;   /* backward rules are not themselves recorded */
    mmc_backward_range(c, 0, c->tape_len);
    c->grad_enabled = prev;
}

/* ---- split backward: input-gradient half now, weight-gradient half later */
bool mmc_set_defer_weight_grads(mmc_ctx *c, bool on) {
    bool prev = c->defer_w;
    c->defer_w = on;
    return prev;
}

bool mmc_defer_weight_grads(const mmc_ctx *c) { return c->defer_w; }

void mmc_defer_weight_grad(mmc_ctx *c, mmc_node *n, mmc_backward_fn wfn) {
    if (c->wq_len == c->wq_cap) {
        c->wq_cap = c->wq_cap ? 2 * c->wq_cap : 64;
        c->wq = realloc(c->wq, (size_t)c->wq_cap * sizeof *c->wq);
        c->wq_fn = realloc(c->wq_fn, (size_t)c->wq_cap * sizeof *c->wq_fn);
        MMC_CHECK(c->wq && c->wq_fn, "out of memory growing the deferred weight-gradient queue");
    }
    c->wq[c->wq_len] = n;
    c->wq_fn[c->wq_len++] = wfn;
}

int mmc_deferred_weight_grads(const mmc_ctx *c) { return c->wq_len; }

int mmc_backward_weights(mmc_ctx *c) {
    const int n = c->wq_len;
    bool prev = c->grad_enabled;
    c->grad_enabled = false;
    for (int i = 0; i < n; i++) c->wq_fn[i](c, c->wq[i]);   /* the order the backward queued them */
    c->grad_enabled = prev;
    c->wq_len = 0;
    return n;
}

/* ---- activation checkpointing */
typedef struct {
    mmc_block_fn fn;
    void *user;
} ckpt_extra;

static void add_into(mmc_tensor *dst, const mmc_tensor *src) {
    float *d = dst->data;
    const float *s = src->data;
    int64_t n = mmc_numel(dst);
    for (int64_t i = 0; i < n; i++) d[i] += s[i];
}

static void checkpoint_backward(mmc_ctx *c, mmc_node *n) {
    ckpt_extra *ex = n->extra;
    /* grads of the block's inputs must outlive the released recomputation */
    for (int i = 0; i < n->n_in; i++)
        if (mmc_requires_grad(n->in[i])) mmc_grad(c, n->in[i]);
    mmc_arena_mark mark = mmc_arena_get_mark(c->act);
    int tape0 = c->tape_len;
    /* the recomputation is released below: its weight halves cannot wait, they run now */
    const bool defer = c->defer_w;
    c->defer_w = false;

    mmc_tensor *det[MMC_NODE_MAX_IN];
    for (int i = 0; i < n->n_in; i++) {
        if (n->in[i]->flags & MMC_PARAM) { det[i] = n->in[i]; continue; }
        det[i] = mmc_alias(c, n->in[i]);
        det[i]->flags |= n->in[i]->flags & MMC_REQUIRES_GRAD;
    }
    c->grad_enabled = true;
    mmc_tensor *y = ex->fn(c, ex->user, det, n->n_in);
    c->grad_enabled = false;
    if (mmc_requires_grad(y)) {
        mmc_tensor *gy = mmc_grad(c, y);
        memcpy(gy->data, n->out->grad->data, mmc_nbytes(gy));
        mmc_backward_range(c, tape0, c->tape_len);
    }
    for (int i = 0; i < n->n_in; i++)
        if (det[i] != n->in[i] && det[i]->grad) add_into(n->in[i]->grad, det[i]->grad);
    c->tape_len = tape0;
    c->defer_w = defer;
    mmc_arena_release(c->act, mark);
}

/* The block's output y, moved below its intermediates: everything allocated since mark goes
 * (backward rebuilds it), only a contiguous copy of y stays. */
static mmc_tensor *keep_output(mmc_ctx *c, mmc_tensor *y, mmc_arena_mark mark) {
    y = mmc_contiguous(c, y);
    const size_t nb = mmc_nbytes(y);
    const mmc_dtype dt = y->dtype;
    const int nd = y->ndim;
    int64_t shape[MMC_MAX_DIMS];
    memcpy(shape, y->shape, sizeof(int64_t) * (size_t)nd);
    void *tmp = malloc(nb ? nb : 1);
    MMC_CHECK(tmp, "out of memory keeping a checkpointed block's output (%zu bytes)", nb);
    memcpy(tmp, y->data, nb);
    mmc_arena_release(c->act, mark);
    mmc_tensor *o = mmc_new(c, dt, nd, shape);
    memcpy(o->data, tmp, nb);
    free(tmp);
    return o;
}

mmc_tensor *mmc_checkpoint(mmc_ctx *c, mmc_block_fn fn, void *user, mmc_tensor **in, int n_in) {
    bool prev = c->grad_enabled;
    c->grad_enabled = false;
    c->ckpt_depth += prev;
    mmc_arena_mark mark = mmc_arena_get_mark(c->act);
    mmc_tensor *y = fn(c, user, in, n_in);
    c->ckpt_depth -= prev;
    c->grad_enabled = prev;
    if (!prev) return y;
    /* a fresh tensor we may flag, and the block's intermediates released: the point of recompute */
    y = keep_output(c, y, mark);
    /* recorded even when no input requires grad: parameters inside the block may */
    mmc_node *n = append_node(c, "checkpoint", checkpoint_backward, y, n_in, in);
    ckpt_extra *ex = mmc_arena_alloc(c->act, sizeof *ex);
    ex->fn = fn;
    ex->user = user;
    n->extra = ex;
    return y;
}
