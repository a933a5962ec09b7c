/* pp.c — pipeline parallelism (mmc_pp.h) for the Qwen2 / Qwen2-MoE / Qwen2-VL decoder, after Megatron-LM's
 * pipeline_parallel/schedules.py (forward_backward_pipelining_without_interleaving: warm-up,
 * steady 1F1B, cool-down; ..._with_interleaving: v model chunks per rank) and p2p_communication.py
 * (the residual stream and its gradient sent between neighbouring stages), and DualPipeV (DeepSeek's
 * DualPipe folded into a V, with zero-bubble's split backward: B ops for the input gradient, W ops
 * for the weight gradient from the autograd's deferred queue, mmc_wgrad.h): the schedules and
 * their simulators, the layer split, trimming a model to its stage, and the runtime that executes
 * one step's micro-batches.
 *
 * Each micro-batch in flight has its own autograd context (tape and activation arena), so the
 * backward of micro-batch k walks only its own graph while later forwards are still alive; the
 * parameters and their gradient buffers are shared (persistent). The activation a stage sends
 * stays in its context until that micro-batch's backward (the send is waited on there, when the
 * next stage has certainly received it); the gradient sent back is copied into a per-slot
 * buffer so the context is released at once. Sends are non-blocking, and receives are posted
 * early (a few ops ahead, into buffers of their own; parallel.pipeline_early_recv) and waited on
 * by the op that needs them: no stage ever waits on a send, and a receive is waited on exactly
 * where the blocking one ran before, so the step deadlocks only if the schedules' dependency
 * graph has a cycle, which the simulator (the same graph) rules out for every P, v, M the tests
 * try. A communicator failure inside the step is returned. Qwen2-MoE's load-balancing loss, a
 * function of every stage's routing, rides the same messages (TAG_AUX below). */
#include "mmc_pp.h"
#include "mmc_ops.h"
#include "mmc_quant.h"
#include "mmc_wgrad.h"
#include "mmc_tp.h"
#include "mmc_trainer.h"
#include "mmc_vl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TAG_TIED = 103 };

/* ------------------------------------------------------------------ schedule */
int mmc_pp_schedule(int P, int v, int stage, int M, mmc_pp_op *ops) {
    if (P < 1 || v < 1 || stage < 0 || stage >= P || M < 1 || !ops || (v > 1 && (P < 2 || M % P))) return -1;
    int n = 0;
    if (v == 1) {
        const int warm = P - 1 - stage < M ? P - 1 - stage : M;
        int f = 0, b = 0;
        for (; f < warm; f++) ops[n++] = (mmc_pp_op){MMC_PP_FORWARD, f, 0};
        for (; f < M; f++, b++) {   /* steady: one forward, one backward */
            ops[n++] = (mmc_pp_op){MMC_PP_FORWARD, f, 0};
            ops[n++] = (mmc_pp_op){MMC_PP_BACKWARD, b, 0};
        }
        for (; b < M; b++) ops[n++] = (mmc_pp_op){MMC_PP_BACKWARD, b, 0};   /* cool-down */
        return n;
    }
    /* interleaved (Megatron's forward_backward_pipelining_with_interleaving): the k-th forward of
     * the rank runs chunk (k mod P v) / P on micro-batch (k / P v) P + k mod P, i.e. groups of P
     * micro-batches go through chunk 0, then chunk 1, ...; backwards visit the chunks in reverse */
    const int total = M * v;
    int warm = (P - stage - 1) * 2 + (v - 1) * P;
    if (warm > total) warm = total;
#define OP(kind, k) ((mmc_pp_op){(kind), ((k) / (P * v)) * P + (k) % P, \
                     (kind) == MMC_PP_FORWARD ? ((k) % (P * v)) / P : v - 1 - ((k) % (P * v)) / P})
    int f = 0, b = 0;
    for (; f < warm; f++) ops[n++] = OP(MMC_PP_FORWARD, f);
    for (; f < total; f++, b++) {
        ops[n++] = OP(MMC_PP_FORWARD, f);
        ops[n++] = OP(MMC_PP_BACKWARD, b);
    }
    for (; b < total; b++) ops[n++] = OP(MMC_PP_BACKWARD, b);
#undef OP
    return n;
}

int mmc_pp_schedule_1f1b(int P, int stage, int M, mmc_pp_op *ops) { return mmc_pp_schedule(P, 1, stage, M, ops); }

/* DualPipeV (DeepSeek's DualPipe folded into a V; Qi et al.'s zero-bubble B / W split): rank r
 * holds chunk 0 = virtual stage r and chunk 1 = virtual stage 2P-1-r. The order is built from
 * eight phases; "FB" is a forward of one chunk followed by a full backward of the other (the
 * pair DualPipe overlaps on a GPU), "B*" a backward whose weight half is queued and run later by
 * a "W" (queue order, so each chunk's weight gradients still accumulate in micro-batch order).
 *   1. 2(P-1-r) forwards of chunk 0 (warm-up: rank 0 feeds the V, rank P-1 turns it)
 *   2. r+1 pairs F0 F1
 *   3. P-1-r triples B*1 W F1 (the weight half fills the wait for chunk 1's next input)
 *   4. M-2P+r+1 pairs FB(0, 1) FB(1, 0) (the steady state)
 *   5. P-1-r pairs B1 FB(1, 0)
 *   6. r+1 pairs B1 B0, the later half of them split (B*)
 *   7. P-1-r pairs W B*0
 *   8. the queued weight halves left (r+1 of them) */
typedef struct {
    mmc_pp_op *ops;
    int n, f[2], b[2];
    int q[64 * 1024], qh, qt;   /* the weight-half queue: chunk * M + micro-batch */
    int M;
} dpv_gen;

static void dpv_f(dpv_gen *g, int c) { g->ops[g->n++] = (mmc_pp_op){MMC_PP_FORWARD, g->f[c]++, c}; }
static void dpv_b(dpv_gen *g, int c, bool split) {
    if (split) g->q[g->qt++] = c * g->M + g->b[c];
    g->ops[g->n++] = (mmc_pp_op){split ? MMC_PP_BACKWARD_INPUT : MMC_PP_BACKWARD, g->b[c]++, c};
}
static void dpv_w(dpv_gen *g) {
    const int e = g->q[g->qh++];
    g->ops[g->n++] = (mmc_pp_op){MMC_PP_WEIGHT, e % g->M, e / g->M};
}

int mmc_pp_schedule_dualpipev(int P, int r, int M, mmc_pp_op *ops) {
    if (P < 2 || r < 0 || r >= P || M < 2 * P || M > 16 * 1024 || !ops) return -1;
    dpv_gen *g = calloc(1, sizeof *g);
    if (!g) return -1;
    g->ops = ops;
    g->M = M;
    for (int i = 0; i < 2 * (P - 1 - r); i++) dpv_f(g, 0);                         /* 1 */
    for (int i = 0; i < r + 1; i++) dpv_f(g, 0), dpv_f(g, 1);                       /* 2 */
    for (int i = 0; i < P - 1 - r; i++) dpv_b(g, 1, true), dpv_w(g), dpv_f(g, 1);    /* 3 */
    for (int i = 0; i < M - 2 * P + r + 1; i++) {                                    /* 4 */
        dpv_f(g, 0), dpv_b(g, 1, false);
        dpv_f(g, 1), dpv_b(g, 0, false);
    }
    for (int i = 0; i < P - 1 - r; i++) dpv_b(g, 1, false), dpv_f(g, 1), dpv_b(g, 0, false);   /* 5 */
    const int n6 = r + 1;                                                             /* 6 */
    for (int i = 0; i < n6; i++) {   /* from the middle on the backwards are split (odd ranks one op earlier) */
        dpv_b(g, 1, i > n6 / 2 || (i == n6 / 2 && r % 2 == 1));
        dpv_b(g, 0, i >= n6 / 2);
    }
    for (int i = 0; i < P - 1 - r; i++) dpv_w(g), dpv_b(g, 0, true);                  /* 7 */
    while (g->qh < g->qt) dpv_w(g);                                                   /* 8 */
    const int n = g->n;
    free(g);
    return n;
}

int mmc_pp_dualpipev_vstage(int P, int stage, int chunk) { return chunk == 0 ? stage : 2 * P - 1 - stage; }

int mmc_pp_max_in_flight(int P, int stage, int M) {
    int warm = P - 1 - stage < M ? P - 1 - stage : M;
    return warm < M ? warm + 1 : warm;
}

double mmc_pp_bubble_fraction(int P, int M) { return mmc_pp_bubble_fraction_v(P, 1, M); }

double mmc_pp_bubble_fraction_v(int P, int v, int M) {
    return P < 1 || M < 1 || v < 1 ? 0.0 : (double)(P - 1) / ((double)v * M + P - 1);
}

double mmc_pp_simulate(int P, int M, double tf, double tb, double *bubble) {
    return mmc_pp_simulate_v(P, 1, M, tf, tb, bubble);
}

double mmc_pp_simulate_v(int P, int v, int M, double tf, double tb, double *bubble) {
    if (bubble) *bubble = 0;
    if (P < 1 || M < 1 || v < 1) return -1;
    const int nops = 2 * M * v, nst = P * v;   /* ops per rank; virtual stages (chunk c of rank r: c P + r) */
    mmc_pp_op *ops = malloc(sizeof *ops * (size_t)(nops * P));
    double *fend = malloc(sizeof *fend * (size_t)(M * nst)), *bend = malloc(sizeof *bend * (size_t)(M * nst));
    double *free_at = calloc((size_t)P, sizeof *free_at);
    int *next = calloc((size_t)P, sizeof *next);
    double span = -1;
    if (!ops || !fend || !bend || !free_at || !next) goto done;
    for (int s = 0; s < P; s++)
        if (mmc_pp_schedule(P, v, s, M, ops + (size_t)s * nops) != nops) goto done;
    for (int i = 0; i < M * nst; i++) fend[i] = bend[i] = -1;   /* [virtual stage * M + mb]: finish times */
    for (int left = nops * P; left > 0;) {
        int progressed = 0;
        for (int s = 0; s < P; s++) {
            while (next[s] < nops) {
                const mmc_pp_op o = ops[(size_t)s * nops + next[s]];
                const int j = o.chunk * P + s;   /* its virtual stage */
                double ready;   /* when its input has arrived */
                if (o.kind == MMC_PP_FORWARD) ready = j == 0 ? 0 : fend[(j - 1) * M + o.mb];
                else ready = j == nst - 1 ? fend[j * M + o.mb] : bend[(j + 1) * M + o.mb];
                if (ready < 0) break;
                double start = ready > free_at[s] ? ready : free_at[s];
                free_at[s] = start + (o.kind == MMC_PP_FORWARD ? tf : tb) / v;
                (o.kind == MMC_PP_FORWARD ? fend : bend)[j * M + o.mb] = free_at[s];
                next[s]++, left--, progressed++;
            }
        }
        if (!progressed) goto done;   /* deadlock */
    }
    span = 0;
    for (int s = 0; s < P; s++) span = free_at[s] > span ? free_at[s] : span;
    if (bubble) *bubble = 1.0 - (double)M * (tf + tb) / span;   /* per rank: busy M (tf + tb) of span */
done:
    free(ops); free(fend); free(bend); free(free_at); free(next);
    return span;
}

/* DualPipeV in simulated time: every rank's op list run against the others (an op starts when its
 * rank is free and its input is there: the previous virtual stage's forward, the next one's input
 * gradient; a W only after its own B). A chunk takes half of a rank's tf / tb / tw. */
double mmc_pp_simulate_dualpipev(int P, int M, double tf, double tb, double tw, double *bubble) {
    if (bubble) *bubble = 0;
    if (P < 2 || M < 2 * P) return -1;
    const int cap = 6 * M, nst = 2 * P;
    mmc_pp_op *ops = malloc(sizeof *ops * (size_t)(cap * P));
    double *fend = malloc(sizeof *fend * (size_t)(M * nst)), *bend = malloc(sizeof *bend * (size_t)(M * nst));
    double *free_at = calloc((size_t)P, sizeof *free_at), busy = 0, span = -1;
    int *next = calloc((size_t)P, sizeof *next), *nops = calloc((size_t)P, sizeof *nops), left = 0;
    if (!ops || !fend || !bend || !free_at || !next || !nops) goto done;
    for (int s = 0; s < P; s++) {
        if ((nops[s] = mmc_pp_schedule_dualpipev(P, s, M, ops + (size_t)s * cap)) < 0) goto done;
        left += nops[s];
    }
    for (int i = 0; i < M * nst; i++) fend[i] = bend[i] = -1;   /* [virtual stage * M + mb] */
    while (left > 0) {
        int progressed = 0;
        for (int s = 0; s < P; s++) {
            while (next[s] < nops[s]) {
                const mmc_pp_op o = ops[(size_t)s * cap + next[s]];
                const int j = mmc_pp_dualpipev_vstage(P, s, o.chunk);
                double ready, d;
                if (o.kind == MMC_PP_FORWARD) ready = j == 0 ? 0 : fend[(j - 1) * M + o.mb], d = tf / 2;
                else if (o.kind == MMC_PP_WEIGHT) ready = bend[j * M + o.mb], d = tw / 2;
                else {
                    ready = j == nst - 1 ? fend[j * M + o.mb] : bend[(j + 1) * M + o.mb];
                    d = (o.kind == MMC_PP_BACKWARD ? tb + tw : tb) / 2;
                }
                if (ready < 0) break;
                const double start = ready > free_at[s] ? ready : free_at[s];
                free_at[s] = start + d;
                busy += d;
                if (o.kind == MMC_PP_FORWARD) fend[j * M + o.mb] = free_at[s];
                else if (o.kind != MMC_PP_WEIGHT) bend[j * M + o.mb] = free_at[s];
                next[s]++, left--, progressed++;
            }
        }
        if (!progressed) goto done;   /* deadlock */
    }
    span = 0;
    for (int s = 0; s < P; s++) span = free_at[s] > span ? free_at[s] : span;
    if (bubble) *bubble = 1.0 - busy / (P * span);
done:
    free(ops); free(fend); free(bend); free(free_at); free(next); free(nops);
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
                         "layers; use a divisor of %lld, give each stage's count in parallel.pipeline_layers "
                         "(e.g. [%lld, %lld, ...]) or set it to auto (from the layers' measured costs)", P,
                         (long long)n_layers, (long long)n_layers,
                         (long long)(n_layers / P + 1), (long long)(n_layers / P));
    for (int s = 0; s <= P; s++) bounds[s] = n_layers / P * s;
    return MMC_OK;
}

/* Minimise the slowest stage exactly (f[k][j]: the best slowest stage of the first j layers in k
 * stages), then, among the splits whose every stage is within it, the sum of squared stage costs
 * (g[k][j], arg[k][j]: where its last stage starts, the earliest on a tie). A stage's cost is a
 * prefix-sum difference plus its extra. O(ns n^2): a few ms at n = 200. */
mmc_status mmc_pp_partition(const double *cost, int64_t n, int ns, const double *extra, int64_t *bounds,
                            double *stage_cost) {
    if (ns < 1) return mmc_error(MMC_ERR_INVALID, "pipeline stages: %d stages (at least 1)", ns);
    if (n < ns)
        return mmc_error(MMC_ERR_INVALID, "pipeline stages: %d stages for %lld decoder layers: a stage would be empty; "
                         "use at most %lld stages", ns, (long long)n, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (!(cost[i] >= 0) || !isfinite(cost[i]))
            return mmc_error(MMC_ERR_INVALID, "pipeline stages: layer %lld's cost %g is not a finite non-negative time",
                             (long long)i, cost[i]);
    for (int k = 0; extra && k < ns; k++)
        if (!(extra[k] >= 0) || !isfinite(extra[k]))
            return mmc_error(MMC_ERR_INVALID, "pipeline stages: stage %d's extra cost %g is not a finite non-negative "
                             "time", k, extra[k]);
    const size_t W = (size_t)n + 1;
    double *pre = malloc(W * sizeof *pre), *f = malloc((size_t)(ns + 1) * W * sizeof *f);
    double *g = malloc((size_t)(ns + 1) * W * sizeof *g);
    int64_t *arg = malloc((size_t)(ns + 1) * W * sizeof *arg);
    if (!pre || !f || !g || !arg) {
        free(pre); free(f); free(g); free(arg);
        return mmc_error(MMC_ERR_OOM, "out of memory partitioning %lld layers into %d stages", (long long)n, ns);
    }
    pre[0] = 0;
    for (int64_t i = 0; i < n; i++) pre[i + 1] = pre[i] + cost[i];
#define SC(k, i, j) (pre[j] - pre[i] + (extra ? extra[k] : 0.0))   /* stage k holding layers [i, j) */
    for (size_t x = 0; x < (size_t)(ns + 1) * W; x++) f[x] = g[x] = INFINITY;
    f[0] = g[0] = 0;
    for (int k = 1; k <= ns; k++)   /* pass 1: the slowest stage */
        for (int64_t j = k; j <= n - (ns - k); j++)
            for (int64_t i = k - 1; i < j; i++) {
                const double a = f[(size_t)(k - 1) * W + i], b = SC(k - 1, i, j), m = a > b ? a : b;
                if (m < f[(size_t)k * W + j]) f[(size_t)k * W + j] = m;
            }
    const double T = f[(size_t)ns * W + n], lim = T + 1e-9 * (T > 0 ? T : 1);   /* (rounding of the sums) */
    for (int k = 1; k <= ns; k++)   /* pass 2: the most even split whose stages are all within T */
        for (int64_t j = k; j <= n - (ns - k); j++)
            for (int64_t i = k - 1; i < j; i++) {
                const double a = g[(size_t)(k - 1) * W + i], b = SC(k - 1, i, j);
                if (!isfinite(a) || b > lim) continue;
                const double q = a + b * b, cur = g[(size_t)k * W + j];
                if (!isfinite(cur) || q < cur - 1e-12 * cur) g[(size_t)k * W + j] = q, arg[(size_t)k * W + j] = i;
            }
    MMC_ASSERT(isfinite(g[(size_t)ns * W + n]));   /* (n >= ns: the split of one layer per stage exists) */
    bounds[ns] = n;
    for (int k = ns; k > 0; k--) bounds[k - 1] = arg[(size_t)k * W + bounds[k]];
    for (int k = 0; stage_cost && k < ns; k++) stage_cost[k] = SC(k, bounds[k], bounds[k + 1]);
#undef SC
    free(pre); free(f); free(g); free(arg);
    return MMC_OK;
}

mmc_status mmc_pp_auto_split(const double *cost, int64_t n, int P, int v, bool dualpipev, bool vision_stage,
                             double first, double last, double vision, double keep_even, int64_t *bounds,
                             double *stage_cost, bool *even) {
    if (even) *even = false;
    if (P < 1 || v < 1 || (dualpipev && v != 2) || (vision_stage && (P < 2 || v != 1)))
        return mmc_error(MMC_ERR_INVALID, "pipeline stages: bad layout (%d stages x %d chunks%s%s)", P, v,
                         dualpipev ? ", dualpipev" : "", vision_stage ? ", vision stage" : "");
    const int nst = P * v, off = vision_stage ? 1 : 0, nd = nst - off;   /* the decoder's (virtual) stages */
    double *extra = calloc((size_t)nd, sizeof *extra), *alt = malloc((size_t)nd * sizeof *alt);
    int64_t *eb = malloc((size_t)(nd + 1) * sizeof *eb);
    mmc_status st = MMC_OK;
    if (!extra || !alt || !eb) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    if (!vision_stage) extra[0] += first;   /* (with a vision stage `first` sits on the tower's stage) */
    extra[nd - 1] += last;                  /* the last virtual stage (DualPipeV: rank 0's chunk 1) */
    if ((st = mmc_pp_partition(cost, n, nd, extra, bounds + off, stage_cost ? stage_cost + off : NULL))) goto done;
    if (n % nd == 0) {   /* the even split, kept when the best one is not measurably faster */
        double worst_even = 0, worst = 0;
        for (int k = 0; k < nd; k++) {
            eb[k] = n / nd * k;
            double s = extra[k];
            for (int64_t i = n / nd * k; i < n / nd * (k + 1); i++) s += cost[i];
            alt[k] = s;
            worst_even = s > worst_even ? s : worst_even;
            double b = extra[k];
            for (int64_t i = bounds[off + k]; i < bounds[off + k + 1]; i++) b += cost[i];
            worst = b > worst ? b : worst;
        }
        eb[nd] = n;
        if (worst_even <= worst * (1.0 + keep_even)) {
            memcpy(bounds + off, eb, (size_t)(nd + 1) * sizeof *eb);
            if (stage_cost) memcpy(stage_cost + off, alt, (size_t)nd * sizeof *alt);
            if (even) *even = true;
        }
    }
    if (vision_stage) {
        bounds[0] = 0;
        if (stage_cost) stage_cost[0] = vision + first;
    }
done:
    free(extra); free(alt); free(eb);
    return st;
}

static bool keep_param(const char *name, int stage, int last, bool tied, int nr, const int64_t *l0, const int64_t *l1) {
    if (!strncmp(name, "layers.", 7)) {
        long long l = atoll(name + 7);
        for (int c = 0; c < nr; c++)
            if (l >= l0[c] && l < l1[c]) return true;
        return false;
    }
    if (!strcmp(name, "embed_tokens.weight") || !strcmp(name, "tok_embeddings.weight"))   /* (InternLM2's) */
        return stage == 0 || (tied && stage == last);
    return stage == last;   /* norm.weight, lm_head.weight */
}

mmc_status mmc_pp_trim_qwen2_vl(mmc_qwen2_vl *m, int stage, int P, int nc, const int64_t *l0, const int64_t *l1) {
    return mmc_pp_trim_qwen2_vl_at(m, stage, P - 1, nc, l0, l1);
}

mmc_status mmc_pp_trim_qwen2_vl_at(mmc_qwen2_vl *m, int stage, int last, int nc, const int64_t *l0, const int64_t *l1) {
    mmc_vision *v = m->visual;
    if (stage > 0) {   /* the towers run on the first stage only */
        for (int i = 0; i < v->n_params; i++) mmc_tensor_free(v->params[i]);
        v->n_params = 0;
    }
    return mmc_pp_trim_qwen2_at(m->lm, stage, last, nc, l0, l1);
}

mmc_status mmc_pp_trim_qwen2(mmc_qwen2 *m, int stage, int P, int64_t l0, int64_t l1) {
    return mmc_pp_trim_qwen2_chunks(m, stage, P, 1, &l0, &l1);
}

mmc_status mmc_pp_trim_qwen2_chunks(mmc_qwen2 *m, int stage, int P, int nc, const int64_t *l0, const int64_t *l1) {
    return mmc_pp_trim_qwen2_at(m, stage, P - 1, nc, l0, l1);
}

mmc_status mmc_pp_trim_qwen2_at(mmc_qwen2 *m, int stage, int last, int nc, const int64_t *l0, const int64_t *l1) {
    if (m->adapter) return mmc_error(MMC_ERR_UNSUPPORTED, "pipeline stages: the model has an inference adapter");
    const bool tied = m->lm_head == m->embed;
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        mmc_tensor *p = m->params[i];
        if (keep_param(m->param_names[i], stage, last, tied, nc, l0, l1)) {
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
    for (int64_t l = 0; l < m->cfg.num_layers; l++) {
        bool mine = false;
        for (int c = 0; c < nc; c++) mine |= l >= l0[c] && l < l1[c];
        if (mine) continue;
        mmc_qwen2_layer *L = &m->layers[l];   /* QLoRA: its NF4 weights are in no parameter list */
        mmc_linear_w *ls[8] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down, &L->qkv};
        for (int j = 0; j < 8; j++) mmc_linear_quant_free(ls[j]);
        memset(L, 0, sizeof *L);   /* (its tensors were freed above) */
    }
    return MMC_OK;
}

mmc_status mmc_pp_trim_lora(mmc_lora_set *s, int stage, int last, int nc, const int64_t *l0, const int64_t *l1) {
    return mmc_pp_trim_lora_ex(s, stage, last, nc, l0, l1, false);
}

mmc_status mmc_pp_trim_lora_ex(mmc_lora_set *s, int stage, int last, int nc, const int64_t *l0, const int64_t *l1,
                               bool tower_everywhere) {
    bool *keep = calloc((size_t)s->n + 1, sizeof *keep);
    if (!keep) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < s->n; i++) {
        const char *nm = s->names[i], *ly = strstr(nm, "layers.");
        if (strstr(nm, "visual.") || strstr(nm, "vision_tower.") || strstr(nm, "multi_modal_projector."))
            keep[i] = stage == 0 || (tower_everywhere && strstr(nm, "visual."));   /* the tower (and LLaVA's /
                                      * InternVL's projector) runs on the first stage, or (per-modality) on all */
        else if (ly && ly[7] >= '0' && ly[7] <= '9') {
            const long long l = atoll(ly + 7);
            for (int c = 0; c < nc; c++) keep[i] |= l >= l0[c] && l < l1[c];
        } else keep[i] = stage == last;
    }
    mmc_lora_keep(s, keep);
    free(keep);
    return MMC_OK;
}

/* ------------------------------------------------------------------ runtime */
/* A rank holds v chunks (v = 1 without interleaving): chunk c is virtual stage c P + stage, with
 * decoder layers [l0[c], l1[c]); under DualPipeV v = 2 and chunk c is virtual stage stage or
 * 2 P - 1 - stage. Messages carry the receiving chunk in their tag, so transfers for different
 * chunks between the same two ranks never match each other. DualPipeV's turn (virtual stages
 * P - 1 and P, both on rank P - 1) is a local hand-off through per-micro-batch buffers.
 *
 * Split backward (DualPipeV's B / W): a B runs the micro-batch's backward with the context's
 * weight halves deferred (mmc_set_defer_weight_grads) and sends the input gradient at once; the
 * slot keeps its context (x and dy of every linear) until the W runs the queue and frees it. */
enum { TAG_CHUNK = 1000 };   /* + 2 chunk (activations), + 2 chunk + 1 (gradients) */

/* Qwen2-MoE's load-balancing loss (qwen2_moe.c) is one function of every sparse layer's routing
 * in a forward, so no stage can finish it alone. Its sums (mmc_moe_aux_len doubles: rows, and per
 * expert the routing decisions and the summed probabilities) travel with the micro-batch: each
 * activation is followed by the sums over the virtual stages so far, to which the receiver adds
 * its layers' (in layer order: the one process's additions, in its order), so the last virtual
 * stage holds the whole forward's sums; it adds the aux loss to the micro-batch's loss, and each
 * gradient sent back is followed by those whole sums, from which every stage's backward gets the
 * router probabilities' gradient (mmc_moe_aux_finish) before it runs. The sums ride the schedule's
 * own messages (same peers, order and dependencies, their own tags): no new wait, any schedule. */
enum { TAG_AUX = 3000 };     /* + 2 chunk (forward sums), + 2 chunk + 1 (whole sums sent back) */

typedef struct {
    mmc_ctx *ctx;           /* one autograd context per micro-batch (and chunk) in flight */
    mmc_tensor *in, *out;   /* received input (not on the first virtual stage), output or loss */
    mmc_dist_req *act_req, *grad_req;   /* pending sends */
    float *grad_buf;        /* the input gradient being sent back */
    int64_t grad_cap;
    double *aux_fwd, *aux_bwd;   /* MoE: copies of the sums being sent on / back ([mmc_moe_aux_len]) */
    mmc_dist_req *aux_act_req, *aux_grad_req;
    bool busy;
} pp_slot;

struct mmc_pp {
    mmc_comm *pp;
    int stage, P, v;
    bool dualpipev;         /* v = 2 chunks folded into a V (mmc_pp_new_dualpipev) */
    float **turn_act, **turn_grad;   /* [M] DualPipeV on rank P - 1: chunk 0's output, chunk 1's input gradient */
    int turn_cap;
    int64_t *l0, *l1;       /* [v] */
    mmc_qwen2 *m;
    mmc_qwen2_vl *vl;       /* Qwen2-VL (m == vl->lm), or NULL */
    mmc_pp_embeds_fn embeds;   /* LLaVA / InternVL: the first stage's input embeddings (mmc_pp_set_embeds), or NULL */
    void *embeds_arg;
    int n_slots;
    pp_slot *slots;
    int *slot_of;           /* [v M] during a run: the slot of (chunk, micro-batch) */
    int64_t bytes;
    int64_t tokens;         /* label tokens of the losses this rank computed (mmc_pp_eval) */
    double recv_s;
    bool late_recv;         /* mmc_pp_set_early_recv(p, false): each receive posted when its op runs */
    bool dropout;           /* mmc_pp_set_dropout: LoRA dropout masks per (seed, step, micro-batch) */
    uint64_t dropout_seed, dropout_step;
    int64_t aux_len;        /* MoE: the aux loss's sums per forward (0: a dense model) */
    double *aux;            /* [M, aux_len] during a run: micro-batch k's sums (partial, then whole) */
    float *aux_g;           /* [M, E]: its router probabilities' gradient */
    int aux_cap;            /* micro-batches aux / aux_g hold */
};

mmc_status mmc_pp_new_v(mmc_comm *pp, mmc_qwen2 *m, int v, const int64_t *l0, const int64_t *l1, mmc_pp **out) {
    *out = NULL;
    mmc_pp *p = calloc(1, sizeof *p);
    if (!p) return mmc_error(MMC_ERR_OOM, "out of memory");
    p->pp = pp;
    p->stage = mmc_comm_rank(pp);
    p->P = mmc_comm_size(pp);
    p->v = v;
    p->m = m;
    p->l0 = malloc(sizeof *p->l0 * (size_t)v);
    p->l1 = malloc(sizeof *p->l1 * (size_t)v);
    if (!p->l0 || !p->l1) goto oom;
    memcpy(p->l0, l0, sizeof *p->l0 * (size_t)v);
    memcpy(p->l1, l1, sizeof *p->l1 * (size_t)v);
    p->aux_len = m->moe ? mmc_moe_aux_len(m->moe) : 0;
    *out = p;
    return MMC_OK;
oom:
    mmc_pp_free(p);
    return mmc_error(MMC_ERR_OOM, "out of memory for the pipeline stage");
}

mmc_status mmc_pp_new_dualpipev(mmc_comm *pp, mmc_qwen2 *m, const int64_t *l0, const int64_t *l1, mmc_pp **out) {
    *out = NULL;
    if (mmc_comm_size(pp) < 2)
        return mmc_error(MMC_ERR_INVALID, "DualPipeV needs at least 2 pipeline ranks (got %d)", mmc_comm_size(pp));
    mmc_status st = mmc_pp_new_v(pp, m, 2, l0, l1, out);
    if (!st) (*out)->dualpipev = true;
    return st;
}

mmc_status mmc_pp_new(mmc_comm *pp, mmc_qwen2 *m, int64_t l0, int64_t l1, mmc_pp **out) {
    return mmc_pp_new_v(pp, m, 1, &l0, &l1, out);
}

/* contexts for `need` micro-batches in flight (grown on first use; kept across steps) */
static mmc_status ensure_slots(mmc_pp *p, int need) {
    if (need <= p->n_slots) return MMC_OK;
    pp_slot *s = realloc(p->slots, sizeof *s * (size_t)need);
    if (!s) return mmc_error(MMC_ERR_OOM, "out of memory");
    p->slots = s;
    for (int i = p->n_slots; i < need; i++) {
        memset(&s[i], 0, sizeof s[i]);
        if (!(s[i].ctx = mmc_ctx_new())) return mmc_error(MMC_ERR_OOM, "out of memory for the pipeline's contexts");
        p->n_slots = i + 1;
        if (p->aux_len && (!(s[i].aux_fwd = malloc(sizeof(double) * (size_t)p->aux_len)) ||
                           !(s[i].aux_bwd = malloc(sizeof(double) * (size_t)p->aux_len))))
            return mmc_error(MMC_ERR_OOM, "out of memory for the pipeline's contexts");
    }
    return MMC_OK;
}

void mmc_pp_free(mmc_pp *p) {
    if (!p) return;
    for (int i = 0; i < p->n_slots; i++) {
        mmc_dist_wait(p->slots[i].act_req);
        mmc_dist_wait(p->slots[i].grad_req);
        mmc_dist_wait(p->slots[i].aux_act_req);
        mmc_dist_wait(p->slots[i].aux_grad_req);
        mmc_ctx_free(p->slots[i].ctx);
        free(p->slots[i].grad_buf);
        free(p->slots[i].aux_fwd);
        free(p->slots[i].aux_bwd);
    }
    free(p->aux);
    free(p->aux_g);
    free(p->slots);
    free(p->slot_of);
    for (int i = 0; i < p->turn_cap; i++) free(p->turn_act[i]), free(p->turn_grad[i]);
    free(p->turn_act);
    free(p->turn_grad);
    free(p->l0);
    free(p->l1);
    free(p);
}

void mmc_pp_set_vl(mmc_pp *p, mmc_qwen2_vl *vl) { p->vl = vl; }
void mmc_pp_set_embeds(mmc_pp *p, mmc_pp_embeds_fn fn, void *arg) { p->embeds = fn, p->embeds_arg = arg; }

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

/* Early receives (parallel.pipeline_early_recv, off by default): the receive an op needs is posted
 * (mmc_recv_start into a buffer of its own) PP_LOOKAHEAD ops before the op runs, so the
 * communicator's thread takes the message in while this stage computes the ops before; the op
 * then waits (what is left of the transfer) and copies it into its context. Receives are still
 * posted in schedule order, so messages of the same peer and tag match as before. */
enum { PP_LOOKAHEAD = 2 };
typedef struct {
    float *buf;
    int64_t n;
    mmc_dist_req *req;
} pp_pre;

/* the receive op o needs from another rank (its peer, tag and float count), if any */
static bool op_recv(const mmc_pp *p, mmc_pp_op o, const mmc_batch *mbs, int *peer, int *tag, int64_t *n);

static mmc_status recv_timed(mmc_pp *p, pp_pre *pre, void *buf, int64_t n, int peer, int tag) {
    double t0 = mmc_now();
    mmc_status st;
    if (pre && pre->buf) {   /* posted early: wait for the rest, then take it */
        MMC_CHECK(pre->n == n, "pipeline: early receive of %lld floats for an op expecting %lld", (long long)pre->n,
                  (long long)n);
        st = mmc_dist_wait(pre->req);
        pre->req = NULL;
        if (!st) memcpy(buf, pre->buf, (size_t)n * sizeof(float));
        free(pre->buf);
        pre->buf = NULL;
    } else {
        st = mmc_recv(p->pp, buf, n, MMC_F32, peer, tag);
    }
    p->recv_s += mmc_now() - t0;
    return st;
}

/* virtual stages: chunk c of this rank, and the (rank, chunk) that holds virtual stage j */
static int vstage(const mmc_pp *p, int c) {
    return p->dualpipev ? mmc_pp_dualpipev_vstage(p->P, p->stage, c) : c * p->P + p->stage;
}
static int vs_rank(const mmc_pp *p, int j) { return p->dualpipev ? (j < p->P ? j : 2 * p->P - 1 - j) : j % p->P; }
static int vs_chunk(const mmc_pp *p, int j) { return p->dualpipev ? j >= p->P : j / p->P; }
static bool first_vs(const mmc_pp *p, int c) { return vstage(p, c) == 0; }
static bool last_vs(const mmc_pp *p, int c) { return vstage(p, c) == p->P * p->v - 1; }
/* the neighbouring virtual stages: (rank, chunk) before and after chunk c of this rank */
static int prev_rank(const mmc_pp *p, int c) { return vs_rank(p, vstage(p, c) - 1); }
static int prev_chunk(const mmc_pp *p, int c) { return vs_chunk(p, vstage(p, c) - 1); }
static int next_rank(const mmc_pp *p, int c) { return vs_rank(p, vstage(p, c) + 1); }
static int next_chunk(const mmc_pp *p, int c) { return vs_chunk(p, vstage(p, c) + 1); }
/* MoE: micro-batch k's aux-loss sums and router-probability gradient */
static double *aux_of(const mmc_pp *p, int k) { return p->aux + (size_t)k * (size_t)p->aux_len; }
static float *aux_grad_of(const mmc_pp *p, int k) {
    return p->aux_g + (size_t)k * (size_t)mmc_moe_num_experts(p->m->moe);
}

/* DualPipeV's turn: a copy of n floats kept for micro-batch k until the other chunk takes it */
static mmc_status turn_put(float **slot, const float *src, int64_t n) {
    free(*slot);
    if (!(*slot = malloc((size_t)n * sizeof(float) + 1))) return mmc_error(MMC_ERR_OOM, "out of memory");
    if (src) memcpy(*slot, src, (size_t)n * sizeof(float));
    else memset(*slot, 0, (size_t)n * sizeof(float));
    return MMC_OK;
}
static mmc_status turn_take(float **slot, float *dst, int64_t n, int k) {
    MMC_CHECK(*slot, "pipeline: DualPipeV's turn has nothing for micro-batch %d (schedule out of order)", k + 1);
    memcpy(dst, *slot, (size_t)n * sizeof(float));
    free(*slot);
    *slot = NULL;
    return MMC_OK;
}

/* Forward of micro-batch k through chunk c: embed or receive, the chunk's layers, then send on
 * or (last virtual stage) the loss. */
static mmc_status stage_forward(mmc_pp *p, int c, int k, int M, const mmc_batch *b, double scale, double *loss,
                                pp_pre *pre) {
    int slot = -1;
    for (int i = 0; i < p->n_slots && slot < 0; i++)
        if (!p->slots[i].busy) slot = i;
    MMC_CHECK(slot >= 0, "pipeline: no free context (schedule and contexts disagree)");
    pp_slot *sl = &p->slots[slot];
    sl->busy = true;
    p->slot_of[c * M + k] = slot;
    mmc_ctx *ctx = sl->ctx;
    if (p->dropout) mmc_nn_set_dropout_seed(ctx, mmc_nn_dropout_seed(p->dropout_seed, p->dropout_step, (uint64_t)k));
    mmc_qwen2 *m = p->m;
    const int64_t B = b->B, T = b->T, C = m->cfg.hidden_size;
    const int D = (int)m->cfg.head_dim;
    /* sequence parallelism (training with tp): the residual stream between the stages is this tp
     * rank's slice of the sequence, [B, T/tp, C], as between the layers */
    const bool sp = m->tp && m->sp && mmc_grad_enabled(ctx);
    const int64_t Ts = sp ? T / mmc_comm_size(m->tp) : T;
    m->sp_active = sp;
    for (int64_t l = p->l0[c]; l < p->l1[c]; l++) m->layers[l].sp = sp;
    mmc_status st;
    mmc_ctx_reset(ctx);
    mmc_tensor *cos, *sin, *x = NULL;
    mmc_attn_opts attn = {.causal = true, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
    if (p->vl) {   /* Qwen2-VL: positions from the ids and the media's grids; towers and splice on stage 0 */
        mmc_vl_media media;
        mmc_tensor *ids = mmc_qwen2_vl_batch_media(ctx, b, &media);                 /* [B, T] */
        mmc_vl_seq seq = {.position_ids = b->position_ids, .cu_seqlens = b->cu_seqlens, .n_seqs = b->n_seqs};
        if ((st = mmc_qwen2_vl_inputs(ctx, p->vl, ids, &media, &seq, NULL, NULL, first_vs(p, c) ? &x : NULL, &cos,
                                      &sin, &attn)))
            return mmc_error_prefix(st, "micro-batch %d (first sample %lld)", k + 1, (long long)b->sample_index);
    } else if (p->embeds) {   /* LLaVA / InternVL: 1-D positions (each packed segment from 0); tower and splice on stage 0 */
        mmc_qwen2_rope_table(ctx, &m->cfg, mmc_embeds_positions(ctx, b), &cos, &sin);   /* [T, D] */
        attn = mmc_embeds_attn(ctx, b);
        if (first_vs(p, c) && (st = p->embeds(p->embeds_arg, ctx, b, &x)))   /* [B, T, C] */
            return mmc_error_prefix(st, "micro-batch %d (first sample %lld)", k + 1, (long long)b->sample_index);
    } else if (m->cfg.mrope) {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, B, T));          /* [3, B, T] */
        memcpy(pos->data, b->position_ids, (size_t)(3 * B * T) * sizeof(int64_t));
        mmc_rope_table_mrope(ctx, pos, m->cfg.mrope_section, D, m->cfg.rope_theta, &cos, &sin);
    } else {
        mmc_tensor *pos = mmc_new(ctx, MMC_I64, 2, MMC_SHAPE(B, T));             /* [B, T] */
        memcpy(pos->data, b->position_ids, (size_t)(B * T) * sizeof(int64_t));
        mmc_qwen2_rope_table(ctx, &m->cfg, pos, &cos, &sin);   /* default, or Llama's rope scaling */
    }
    sl->in = NULL;
    if (first_vs(p, c) && !p->vl && !p->embeds) {
        mmc_tensor *ids = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(B, T));             /* [B, T] */
        memcpy(ids->data, b->input_ids, (size_t)(B * T) * sizeof(int32_t));
        x = mmc_qwen2_embed(ctx, m, ids);                                        /* [B, T, C] */
    } else if (!first_vs(p, c)) {   /* (Qwen2-VL's first stage: x holds the embeddings with the features) */
        x = mmc_new(ctx, MMC_F32, 3, MMC_SHAPE(B, Ts, C));                       /* [B, Ts, C] from the stage before */
        if (prev_rank(p, c) == p->stage) st = turn_take(&p->turn_act[k], x->data, B * Ts * C, k);
        else st = recv_timed(p, pre, x->data, B * Ts * C, prev_rank(p, c), TAG_CHUNK + 2 * c);
        if (!st && p->aux_len && prev_rank(p, c) != p->stage)   /* (DualPipeV's turn: aux[k] runs on) */
            st = mmc_recv(p->pp, aux_of(p, k), p->aux_len, MMC_F64, prev_rank(p, c), TAG_AUX + 2 * c);
        if (st)
            return mmc_error_prefix(st, "pipeline stage %d: receiving micro-batch %d's activations", p->stage, k + 1);
        x->flags |= MMC_REQUIRES_GRAD;   /* a leaf whose gradient goes back */
        sl->in = x;
    }
    if (sp && first_vs(p, c)) x = mmc_tp_sp_split(ctx, m->tp, x);               /* [B, T/tp, C] */
    if (p->aux_len) {   /* this chunk's sparse layers add to micro-batch k's sums */
        if (first_vs(p, c)) memset(aux_of(p, k), 0, sizeof(double) * (size_t)p->aux_len);
        mmc_moe_aux_attach(m->moe, aux_of(p, k), aux_grad_of(p, k), true);
    }
    const bool ckpt = m->recompute;
    for (int64_t l = p->l0[c]; l < p->l1[c]; l++) {
        /* selective recompute and offload count the chunk's own layers: the first N of each stage */
        const bool sel = m->recompute_layers <= 0 || l - p->l0[c] < m->recompute_layers;
        const bool off = l - p->l0[c] < m->offload_layers;
        m->layers[l].recompute_attn = m->recompute_attn && sel;
        if (off && (st = mmc_ctx_offload_begin(ctx, m->offload_dir))) return st;
        if (ckpt && sel) {
            block_args *a = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof *a);
            *a = (block_args){p, (int)l, cos, sin, attn};
            x = mmc_checkpoint(ctx, block_fn, a, &x, 1);
        } else {
            x = mmc_qwen2_layer_forward(ctx, &m->cfg, &m->layers[l], x, cos, sin, &attn, NULL, (int)l);
        }
        if (off) mmc_ctx_offload_end(ctx);
    }
    if (last_vs(p, c)) {
        mmc_tensor *h = mmc_rmsnorm(ctx, x, m->norm, (float)m->cfg.rms_norm_eps);   /* [B, Ts, C] */
        if (sp) h = mmc_tp_sp_gather(ctx, m->tp, h);   /* [B, T, C] for the column-parallel lm_head */
        int64_t n;
        if (m->tp) {   /* vocab-parallel: this rank's logits [B, T, V/tp], never gathered */
            mmc_tensor *logits = mmc_qwen2_logits_local(ctx, m, h);              /* [B, T, V/tp] */
            sl->out = mmc_causal_lm_loss_tp(ctx, m->tp, mmc_comm_rank(m->tp) * m->lm_head->shape[0], logits,
                                            b->labels, scale, &n);              /* [] */
        } else {
            mmc_tensor *logits = mmc_qwen2_logits(ctx, m, h);                     /* [B, T, V] */
            sl->out = mmc_causal_lm_loss(ctx, logits, b->labels, scale, &n);     /* [] */
        }
        if (p->aux_len)   /* + the weighted aux loss of the whole forward, as the one process adds it */
            sl->out = mmc_add(ctx, sl->out, mmc_scalar(ctx, (float)mmc_moe_aux_finish(m->moe, aux_of(p, k),
                                                                                      aux_grad_of(p, k))));
        *loss += *(const float *)sl->out->data;
        p->tokens += n;
        return MMC_OK;
    }
    x = mmc_contiguous(ctx, x);
    sl->out = x;
    if (next_rank(p, c) == p->stage) return turn_put(&p->turn_act[k], x->data, B * Ts * C);
    p->bytes += (int64_t)mmc_nbytes(x);
    if ((st = mmc_send_start(p->pp, x->data, B * Ts * C, MMC_F32, next_rank(p, c), TAG_CHUNK + 2 * next_chunk(p, c),
                             &sl->act_req)))
        return mmc_error_prefix(st, "pipeline stage %d: sending micro-batch %d's activations", p->stage, k + 1);
    if (p->aux_len) {   /* the sums so far follow (a copy: aux[k] goes on changing on this rank) */
        memcpy(sl->aux_fwd, aux_of(p, k), sizeof(double) * (size_t)p->aux_len);
        p->bytes += p->aux_len * (int64_t)sizeof(double);
        if ((st = mmc_send_start(p->pp, sl->aux_fwd, p->aux_len, MMC_F64, next_rank(p, c),
                                 TAG_AUX + 2 * next_chunk(p, c), &sl->aux_act_req)))
            return mmc_error_prefix(st, "pipeline stage %d: sending micro-batch %d's MoE sums", p->stage, k + 1);
    }
    return MMC_OK;
}

/* the slot's micro-batch is done with: its activations go */
static void release_slot(pp_slot *sl) {
    mmc_ctx_reset(sl->ctx);
    sl->out = sl->in = NULL;
    sl->busy = false;
}

/* Backward of micro-batch k through chunk c; input_only: the weight halves stay queued in the
 * slot's context for stage_weight (DualPipeV's B), else the whole backward. */
static mmc_status stage_backward(mmc_pp *p, int c, int k, int M, bool input_only, pp_pre *pre) {
    pp_slot *sl = &p->slots[p->slot_of[c * M + k]];
    mmc_ctx *ctx = sl->ctx;
    mmc_tensor *y = sl->out;
    mmc_status st;
    mmc_set_defer_weight_grads(ctx, input_only);
    /* (a recompute re-runs the layers: they record aux nodes again, reading k's gradient, but add no sums) */
    if (p->aux_len) mmc_moe_aux_attach(p->m->moe, aux_of(p, k), aux_grad_of(p, k), false);
    if (last_vs(p, c)) {
        mmc_backward(ctx, y);
    } else {
        mmc_tensor *g = mmc_grad(ctx, y);   /* [B, T, C] zeros: y has no consumer here */
        if (next_rank(p, c) == p->stage) st = turn_take(&p->turn_grad[k], g->data, mmc_numel(y), k);
        else st = recv_timed(p, pre, g->data, mmc_numel(y), next_rank(p, c), TAG_CHUNK + 2 * c + 1);
        if (!st && p->aux_len && next_rank(p, c) != p->stage)   /* the whole forward's sums */
            st = mmc_recv(p->pp, aux_of(p, k), p->aux_len, MMC_F64, next_rank(p, c), TAG_AUX + 2 * c + 1);
        if (st) {
            mmc_set_defer_weight_grads(ctx, false);
            return mmc_error_prefix(st, "pipeline stage %d: receiving micro-batch %d's gradient", p->stage, k + 1);
        }
        /* the next stage has used our activations: the send is complete (or completes now) */
        if ((st = mmc_dist_wait(sl->act_req))) return st;
        sl->act_req = NULL;
        if ((st = mmc_dist_wait(sl->aux_act_req))) return st;
        sl->aux_act_req = NULL;
        if (p->aux_len) mmc_moe_aux_finish(p->m->moe, aux_of(p, k), aux_grad_of(p, k));   /* the probs' gradient */
        if (mmc_requires_grad(y)) {
            bool prev = mmc_set_grad_enabled(ctx, false);   /* backward rules are not recorded */
            mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
            mmc_set_grad_enabled(ctx, prev);
        }
    }
    mmc_set_defer_weight_grads(ctx, false);
    if (!first_vs(p, c) && prev_rank(p, c) == p->stage) {   /* DualPipeV's turn */
        mmc_tensor *x = sl->in;
        if ((st = turn_put(&p->turn_grad[k], x->grad ? x->grad->data : NULL, mmc_numel(x)))) return st;
    } else if (!first_vs(p, c)) {
        mmc_tensor *x = sl->in;
        const int64_t n = mmc_numel(x);
        if ((st = mmc_dist_wait(sl->grad_req))) return st;   /* the slot's previous send */
        sl->grad_req = NULL;
        if (sl->grad_cap < n) {
            free(sl->grad_buf);
            if (!(sl->grad_buf = malloc((size_t)n * sizeof(float)))) return mmc_error(MMC_ERR_OOM, "out of memory");
            sl->grad_cap = n;
        }
        if (x->grad) memcpy(sl->grad_buf, x->grad->data, (size_t)n * sizeof(float));
        else memset(sl->grad_buf, 0, (size_t)n * sizeof(float));   /* nothing trainable reached it */
        p->bytes += n * (int64_t)sizeof(float);
        if ((st = mmc_send_start(p->pp, sl->grad_buf, n, MMC_F32, prev_rank(p, c), TAG_CHUNK + 2 * prev_chunk(p, c) + 1,
                                 &sl->grad_req)))
            return mmc_error_prefix(st, "pipeline stage %d: sending micro-batch %d's gradient", p->stage, k + 1);
        if (p->aux_len) {   /* the whole sums follow, for the stages before */
            if ((st = mmc_dist_wait(sl->aux_grad_req))) return st;
            sl->aux_grad_req = NULL;
            memcpy(sl->aux_bwd, aux_of(p, k), sizeof(double) * (size_t)p->aux_len);
            p->bytes += p->aux_len * (int64_t)sizeof(double);
            if ((st = mmc_send_start(p->pp, sl->aux_bwd, p->aux_len, MMC_F64, prev_rank(p, c),
                                     TAG_AUX + 2 * prev_chunk(p, c) + 1, &sl->aux_grad_req)))
                return mmc_error_prefix(st, "pipeline stage %d: sending micro-batch %d's MoE sums", p->stage, k + 1);
        }
    }
    if (!input_only) release_slot(sl);   /* this micro-batch's activations are done with */
    return MMC_OK;
}

/* DualPipeV's W: the weight halves the B of micro-batch k through chunk c queued, then its slot goes */
static mmc_status stage_weight(mmc_pp *p, int c, int k, int M) {
    pp_slot *sl = &p->slots[p->slot_of[c * M + k]];
    MMC_CHECK(sl->busy, "pipeline: W of micro-batch %d chunk %d without its B (schedule out of order)", k + 1, c);
    mmc_backward_weights(sl->ctx);
    release_slot(sl);
    return MMC_OK;
}

mmc_status mmc_pp_run(mmc_pp *p, const mmc_batch *mbs, int M, double scale, double *loss) {
    *loss = 0;
    p->bytes = 0;
    p->recv_s = 0;
    const int nops = p->dualpipev ? 6 * M : 2 * M * p->v;   /* (DualPipeV: capacity) */
    mmc_pp_op *ops = malloc(sizeof *ops * (size_t)nops);
    int *slot_of = realloc(p->slot_of, sizeof *slot_of * (size_t)(M * p->v));
    if (!ops || !slot_of) { free(ops); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    p->slot_of = slot_of;
    if (p->dualpipev && p->turn_cap < M) {
        float **a = realloc(p->turn_act, sizeof *a * (size_t)M), **g = a ? realloc(p->turn_grad, sizeof *g * (size_t)M) : NULL;
        if (a) p->turn_act = a;
        if (g) p->turn_grad = g;
        if (!a || !g) { free(ops); return mmc_error(MMC_ERR_OOM, "out of memory"); }
        for (int i = p->turn_cap; i < M; i++) a[i] = g[i] = NULL;
        p->turn_cap = M;
    }
    const int n = p->dualpipev ? mmc_pp_schedule_dualpipev(p->P, p->stage, M, ops) : mmc_pp_schedule(p->P, p->v, p->stage, M, ops);
    mmc_status st = p->dualpipev ? (n > 0 ? MMC_OK : mmc_error(MMC_ERR_INVALID, "pipeline: DualPipeV over %d stages "
                                                                "needs at least %d micro-batches per step (2 x stages), "
                                                                "got %d", p->P, 2 * p->P, M))
                  : n == nops ? MMC_OK : mmc_error(MMC_ERR_INVALID, "pipeline: %d micro-batches do not make a schedule "
                                                   "over %d stages x %d chunks (interleaving needs a multiple of the "
                                                   "stages)", M, p->P, p->v);
    int fly = 0, need = 0;   /* contexts: the most micro-batches in flight (a split backward holds its own until W) */
    for (int i = 0; i < n; i++) {
        fly += ops[i].kind == MMC_PP_FORWARD ? 1 : ops[i].kind == MMC_PP_BACKWARD_INPUT ? 0 : -1;
        need = fly > need ? fly : need;
    }
    if (!st) st = ensure_slots(p, need);
    if (!st && p->aux_len && p->aux_cap < M) {   /* (not moved during a run: recorded nodes point into aux_g) */
        const int64_t E = mmc_moe_num_experts(p->m->moe);
        double *a = realloc(p->aux, sizeof *a * (size_t)(M * p->aux_len));
        if (a) p->aux = a;
        float *g = a ? realloc(p->aux_g, sizeof *g * (size_t)(M * E)) : NULL;
        if (g) p->aux_g = g, p->aux_cap = M;
        else st = mmc_error(MMC_ERR_OOM, "out of memory");
    }
    pp_pre *pre = !st && !p->late_recv && n > 0 ? calloc((size_t)n, sizeof *pre) : NULL;
    int posted = 0;   /* ops whose receive (if any) is posted */
    for (int i = 0; i < n && !st; i++) {
        for (; pre && posted < n && posted <= i + PP_LOOKAHEAD && !st; posted++) {
            int peer, tag;
            int64_t cnt;
            if (!op_recv(p, ops[posted], mbs, &peer, &tag, &cnt)) continue;
            pp_pre *q = &pre[posted];
            if (!(q->buf = malloc((size_t)cnt * sizeof(float) + 1))) { st = mmc_error(MMC_ERR_OOM, "out of memory"); break; }
            q->n = cnt;
            if ((st = mmc_recv_start(p->pp, q->buf, cnt, MMC_F32, peer, tag, &q->req))) {
                free(q->buf), q->buf = NULL;
                st = mmc_error_prefix(st, "pipeline stage %d: posting a receive", p->stage);
            }
        }
        if (st) break;
        const mmc_pp_op o = ops[i];
        pp_pre *q = pre ? &pre[i] : NULL;
        switch (o.kind) {
        case MMC_PP_FORWARD: st = stage_forward(p, o.chunk, o.mb, M, &mbs[o.mb], scale, loss, q); break;
        case MMC_PP_BACKWARD: st = stage_backward(p, o.chunk, o.mb, M, false, q); break;
        case MMC_PP_BACKWARD_INPUT: st = stage_backward(p, o.chunk, o.mb, M, true, q); break;
        default: st = stage_weight(p, o.chunk, o.mb, M); break;
        }
    }
    for (int i = 0; pre && i < posted; i++)   /* (left over only after an error: a buffer with a pending */
        if (pre[i].buf && !pre[i].req) free(pre[i].buf);   /* receive stays, the job is failing anyway) */
    free(pre);
    free(ops);
    for (int i = 0; i < p->turn_cap; i++) {   /* (left over only after an error) */
        free(p->turn_act[i]), free(p->turn_grad[i]);
        p->turn_act[i] = p->turn_grad[i] = NULL;
    }
    if (p->aux_len) mmc_moe_aux_attach(p->m->moe, NULL, NULL, false);   /* the model's own sums again */
    for (int i = 0; i < p->n_slots; i++) {   /* the last gradients sent back */
        pp_slot *sl = &p->slots[i];
        mmc_status s2 = mmc_dist_wait(sl->grad_req);
        sl->grad_req = NULL;
        if (!st) st = s2;
        s2 = mmc_dist_wait(sl->aux_grad_req);
        sl->aux_grad_req = NULL;
        if (!st) st = s2;
        if (st && sl->act_req) { mmc_dist_wait(sl->act_req); sl->act_req = NULL; }
        if (st && sl->aux_act_req) { mmc_dist_wait(sl->aux_act_req); sl->aux_act_req = NULL; }
        mmc_ctx_reset(sl->ctx);
        sl->out = sl->in = NULL;
        sl->busy = false;
    }
    return st;
}

mmc_status mmc_pp_eval(mmc_pp *p, const mmc_batch *b, double *nll, int64_t *tokens) {
    *nll = 0, *tokens = 0;
    int *slot_of = realloc(p->slot_of, sizeof *slot_of * (size_t)p->v);
    if (!slot_of) return mmc_error(MMC_ERR_OOM, "out of memory");
    p->slot_of = slot_of;
    if (p->dualpipev && p->turn_cap < 1) {   /* the turn's hand-off buffer for one micro-batch */
        float **a = realloc(p->turn_act, sizeof *a), **g = a ? realloc(p->turn_grad, sizeof *g) : NULL;
        if (a) p->turn_act = a;
        if (g) p->turn_grad = g;
        if (!a || !g) return mmc_error(MMC_ERR_OOM, "out of memory");
        a[0] = g[0] = NULL;
        p->turn_cap = 1;
    }
    mmc_status st = ensure_slots(p, 1);
    if (st) return st;
    /* forward only: no tape, no dropout; the rank's chunks in the order of their virtual stages
     * (each receive waits on an earlier virtual stage only, so the ranks never wait on each other
     * in a cycle) */
    const bool dropout = p->dropout;
    const int64_t aux_len = p->aux_len;   /* no MoE aux loss either: one process's evaluation has none */
    p->dropout = false;
    p->aux_len = 0;
    p->tokens = 0;
    double loss = 0;
    for (int c = 0; c < p->v && !st; c++) {
        mmc_set_grad_enabled(p->slots[0].ctx, false);
        st = stage_forward(p, c, 0, 1, b, 1.0, &loss, NULL);
        pp_slot *sl = &p->slots[p->slot_of[c]];
        const mmc_status s2 = mmc_dist_wait(sl->act_req);
        sl->act_req = NULL;
        if (!st) st = s2;
        mmc_set_grad_enabled(sl->ctx, true);
        release_slot(sl);
    }
    p->dropout = dropout;
    p->aux_len = aux_len;
    if (p->dualpipev) free(p->turn_act[0]), p->turn_act[0] = NULL;   /* (left over only after an error) */
    /* the summed NLL and its token count live on the last virtual stage's rank: to every stage */
    double v[2] = {loss, (double)p->tokens};
    if (!st) st = mmc_all_reduce(p->pp, v, v, 2, MMC_F64, MMC_SUM);
    if (st) return mmc_error_prefix(st, "pipeline stage %d: evaluation forward", p->stage);
    *nll = v[0], *tokens = (int64_t)v[1];
    return MMC_OK;
}

static bool op_recv(const mmc_pp *p, mmc_pp_op o, const mmc_batch *mbs, int *peer, int *tag, int64_t *n) {
    const int c = o.chunk;
    const mmc_qwen2 *m = p->m;   /* [B, T, C] ([B, T/tp, C] with sp), as stage_forward / _backward */
    *n = mbs[o.mb].B * (m->tp && m->sp ? mbs[o.mb].T / mmc_comm_size(m->tp) : mbs[o.mb].T) * m->cfg.hidden_size;
    if (o.kind == MMC_PP_FORWARD) {
        if (first_vs(p, c) || prev_rank(p, c) == p->stage) return false;
        *peer = prev_rank(p, c), *tag = TAG_CHUNK + 2 * c;
        return true;
    }
    if (o.kind == MMC_PP_BACKWARD || o.kind == MMC_PP_BACKWARD_INPUT) {
        if (last_vs(p, c) || next_rank(p, c) == p->stage) return false;
        *peer = next_rank(p, c), *tag = TAG_CHUNK + 2 * c + 1;
        return true;
    }
    return false;
}

void mmc_pp_set_early_recv(mmc_pp *p, bool on) { p->late_recv = !on; }
void mmc_pp_set_dropout(mmc_pp *p, bool on, uint64_t seed, uint64_t step) {
    p->dropout = on, p->dropout_seed = seed, p->dropout_step = step;
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
