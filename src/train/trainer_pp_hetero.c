/* trainer_pp_hetero.c — the per-modality plan (mmc_hetero.h) with the language model pipelined:
 * Qwen2-VL's / Qwen2.5-VL's vision tower (with its merger) data-parallel over all the job's ranks,
 * feeding a language model at pipeline_parallel x tensor_parallel x data_parallel (MindSpeed-MM's
 * layout for large models: encoders at DP over every rank, the LM in a pipeline).
 *
 * Which images a rank encodes. The ranks of one LM replica — its P stages x tp ranks, Megatron's
 * model-parallel group — all read the same micro-batches (every stage decodes them: it computes the
 * M-RoPE positions from the grids), so they already hold the pixels of the replica's whole step.
 * Each step the replica's images of all its M micro-batches, in order, are shared out over those
 * P x tp ranks as contiguous runs balanced by patch count (mmc_hetero_share). Sharing over the
 * replica rather than the world moves no pixels between replicas (a rank holds only its own
 * replica's data), and a step's images of M micro-batches give a share fine enough to balance
 * (M x images per micro-batch items over P x tp ranks); the replicas are balanced against each
 * other as plain data parallelism is, by the data loader. Every rank of the world then encodes
 * about 1 / world of the global batch's images.
 *
 * Forward, before the pipeline runs: each rank encodes its share with the whole tower in a context
 * of its own (kept until the step's backward); one uneven all-to-all over the replica sends every
 * rank's merged features to each tp rank of the first stage (only they splice features), so they
 * hold the step's features [rows, Co] in image order. The first stage's micro-batch forwards take
 * their images' rows from there (mmc_qwen2_vl's encode_hook: a leaf tensor over those rows, whose
 * gradient is a buffer of ours) instead of running the tower.
 *
 * Backward, after the pipeline's: the first stage holds d(features) of every image (the residual
 * stream's gradient is replicated over its tp group, Megatron's f / g, so each tp rank holds all
 * rows); tp rank j of the first stage sends the ranks of its pipeline column (stage s, tp rank j)
 * the rows of the images they encoded (a second all-to-all), each rank runs the tower's backward
 * on its share, and the tower's weight gradients — each rank's partial sum over its images — are
 * summed over the replica here, then over the replicas by the stage's ordinary data-parallel
 * reduction (or ZeRO's reduce-scatter): the two groups together are the world, so each tower
 * gradient is counted once. The tower then holds the same gradient and takes the same AdamW step
 * on every rank; the first stage's copy is the one the norm counts and the checkpoint writes
 * (mmc_trainer_pp_hetero_copy). A frozen tower needs no backward: only its features travel.
 *
 * Any schedule works (1F1B, interleaved, DualPipeV): the features leave before the step and their
 * gradient comes back after it, so the schedule never waits on the tower; the first virtual stage
 * is always pipeline rank 0. Evaluation batches are not shared (the hook has no rows for them): the
 * first stage encodes them itself. */
#include "trainer_internal.h"
#include "mmc_hetero.h"
#include "mmc_nn.h"
#include "mmc_pp.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const int64_t *grid;   /* the micro-batch's grids (images or videos): the hook's key */
    int n;                 /* images in it */
    int64_t row0, rows;    /* its merged-feature rows in the step's features */
    mmc_tensor *feat;      /* first stage: [rows, Co] over F, gradient over dF */
} hgroup;

struct mmc_pp_hetero {
    mmc_comm *rep;         /* the replica: every stage x tp rank at this dp rank (rank = stage tp + tp rank) */
    int R, r, tp;
    int *tower;            /* opt indices of the tower's trained tensors (LoRA factors included) */
    int n_tower;
    int64_t tower_numel;
    float *buf;            /* their gradients, packed for one all-reduce */
    mmc_ctx *ctx;          /* this rank's share through the tower, kept until the step's backward */
    /* one step's state */
    hgroup *g;
    int n_g, cap_g;
    int64_t *rows_of;      /* [R] feature rows each replica rank encodes */
    mmc_tensor **out;      /* this rank's tower outputs (one per run of its share within a group) */
    int n_out, cap_out;
    float *F, *dF;         /* first stage: [total rows, Co] */
    int64_t total_rows, Co;
    bool active;
};

bool mmc_trainer_pp_hetero_copy(const mmc_trainer *t, const char *name) {
    return t->cfg->parallel.hetero && t->pp && t->pp_rank > 0 && name && strstr(name, "visual.");
}

static void step_clear(mmc_pp_hetero *h) {
    for (int i = 0; i < h->n_g; i++) mmc_tensor_free(h->g[i].feat);
    h->n_g = 0;
    h->n_out = 0;
    free(h->F);
    free(h->dF);
    h->F = h->dF = NULL;
    if (h->ctx) mmc_ctx_reset(h->ctx);
    h->active = false;
}

void mmc_trainer_pp_hetero_free(mmc_trainer *t) {
    mmc_pp_hetero *h = t->pph;
    if (!h) return;
    step_clear(h);
    if (t->vl && t->vl->encode_hook_arg == h) t->vl->encode_hook = NULL, t->vl->encode_hook_arg = NULL;
    mmc_comm_free(h->rep);
    mmc_ctx_free(h->ctx);
    free(h->tower);
    free(h->buf);
    free(h->g);
    free(h->rows_of);
    free(h->out);
    free(h);
    t->pph = NULL;
}

/* the first stage's micro-batch forward asks for its images' features (grid: the batch's own array) */
static mmc_status hook(void *arg, mmc_ctx *ctx, const int64_t *grid, int n, mmc_tensor **feats) {
    (void)ctx;
    const mmc_pp_hetero *h = arg;
    if (!h->active || !h->F) return MMC_ERR_NOT_FOUND;
    for (int i = 0; i < h->n_g; i++)
        if (h->g[i].grid == grid && h->g[i].n == n) {
            *feats = h->g[i].feat;
            return MMC_OK;
        }
    return MMC_ERR_NOT_FOUND;   /* (an evaluation batch: the tower runs there) */
}

mmc_status mmc_trainer_pp_hetero_setup(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    if (!t->vl)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: parallel.vision data-parallel with pipeline_parallel %d: "
                         "implemented for Qwen2-VL / Qwen2.5-VL (LLaVA and InternVL run their tower on the first "
                         "stage); leave parallel.vision out", c->file, t->pp_size);
    mmc_pp_hetero *h = calloc(1, sizeof *h);
    if (!h) return mmc_error(MMC_ERR_OOM, "out of memory");
    t->pph = h;
    h->tp = t->tp_size > 1 ? t->tp_size : 1;
    const int tpr = t->tpc ? t->groups.tp_rank : 0;
    mmc_status st = mmc_comm_split(t->world, t->dp_rank, t->pp_rank * h->tp + tpr, "pp-hetero replica", &h->rep);
    if (st) return st;
    h->R = mmc_comm_size(h->rep);
    h->r = mmc_comm_rank(h->rep);
    if (!(h->ctx = mmc_ctx_new()) || !(h->tower = calloc((size_t)t->n_opt + 1, sizeof *h->tower)) ||
        !(h->rows_of = calloc((size_t)h->R, sizeof *h->rows_of)))
        return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_opt; i++)
        if (strstr(t->opt_names[i], "visual.")) {
            h->tower[h->n_tower++] = i;
            h->tower_numel += mmc_numel(t->opt_model[i]);
        }
    if (h->tower_numel && !(h->buf = malloc(sizeof(float) * (size_t)h->tower_numel)))
        return mmc_error(MMC_ERR_OOM, "out of memory for the vision tower's gradients (%lld floats)",
                         (long long)h->tower_numel);
    h->Co = t->vl->visual->cfg.out_hidden_size;
    if (t->pp_rank == 0) {
        t->vl->encode_hook = hook;
        t->vl->encode_hook_arg = h;
    }
    if (t->rank == 0) {
        char tps[48] = "";
        if (t->tp_size > 1) snprintf(tps, sizeof tps, " x tensor parallelism %d", t->tp_size);
        fprintf(stderr, "mmc train: per-modality plan: vision tower data-parallel over %d ranks, language model pipeline "
                "parallelism %d%s x data parallelism %d (%s); each rank encodes its share of its replica's step (%d "
                "ranks, all micro-batches), the features sent to the first stage%s\n", t->world_size, t->pp_size, tps,
                t->dp_size, mmc_comm_backend_name(t->world), h->R,
                h->n_tower ? ", their gradient back, the tower's gradients summed over the world" : " (tower frozen)");
    }
    return MMC_OK;
}

/* one group per micro-batch and kind with images: the step's items in order */
static mmc_status add_group(mmc_pp_hetero *h, const int64_t *grid, int n) {
    if (h->n_g == h->cap_g) {
        int cap = h->cap_g ? 2 * h->cap_g : 16;
        hgroup *g = realloc(h->g, sizeof *g * (size_t)cap);
        if (!g) return mmc_error(MMC_ERR_OOM, "out of memory");
        h->g = g, h->cap_g = cap;
    }
    h->g[h->n_g++] = (hgroup){.grid = grid, .n = n};
    return MMC_OK;
}

static mmc_status push_out(mmc_pp_hetero *h, mmc_tensor *o) {
    if (h->n_out == h->cap_out) {
        int cap = h->cap_out ? 2 * h->cap_out : 16;
        mmc_tensor **a = realloc(h->out, sizeof *a * (size_t)cap);
        if (!a) return mmc_error(MMC_ERR_OOM, "out of memory");
        h->out = a, h->cap_out = cap;
    }
    h->out[h->n_out++] = o;
    return MMC_OK;
}

/* Before the pipeline: this rank's share of the replica's step through the tower, the features to
 * the first stage. Collective over the replica. */
mmc_status mmc_trainer_pp_hetero_forward(mmc_trainer *t, const mmc_batch *mbs, int64_t M) {
    mmc_pp_hetero *h = t->pph;
    step_clear(h);
    mmc_vision *vis = t->vl->visual;
    const int64_t ms = vis->cfg.spatial_merge_size, ms2 = ms * ms, Co = h->Co;
    const int64_t K = vis->cfg.in_channels * vis->cfg.temporal_patch_size * vis->cfg.patch_size * vis->cfg.patch_size;
    mmc_status st = MMC_OK;
    int n_items = 0;
    for (int64_t k = 0; k < M && !st; k++)
        for (int kind = 0; kind < 2 && !st; kind++) {
            const mmc_batch *b = &mbs[k];
            const int n = kind ? b->n_videos : b->n_images;
            if (n <= 0) continue;
            const int64_t *grid = kind ? b->video_grid_thw : b->image_grid_thw;
            const int64_t have = kind ? b->n_video_patches : b->n_patches;
            int64_t patches = 0;
            /* checked here, alike on every rank of the replica (the same data): no rank fails alone */
            for (int i = 0; i < n && !st; i++) {
                const int64_t gt = grid[3 * i], gh = grid[3 * i + 1], gw = grid[3 * i + 2];
                if (gt <= 0 || gh <= 0 || gw <= 0 || gh % ms || gw % ms)
                    st = mmc_error(MMC_ERR_INVALID, "micro-batch %lld: %s grid %d = (%lld, %lld, %lld): t, h, w must be "
                                   "positive and h, w multiples of spatial_merge_size %lld", (long long)k + 1,
                                   kind ? "video" : "image", i, (long long)gt, (long long)gh, (long long)gw, (long long)ms);
                patches += gt * gh * gw;
            }
            if (!st && (patches != have || b->patch_dim != K))
                st = mmc_error(MMC_ERR_SHAPE, "micro-batch %lld: %s pixel values [%lld, %lld] do not match the grids "
                               "([%lld, %lld])", (long long)k + 1, kind ? "video" : "image", (long long)have,
                               (long long)b->patch_dim, (long long)patches, (long long)K);
            if (!st) st = add_group(h, grid, n);
            n_items += n;
        }
    if (st) return mmc_error_prefix(st, "per-modality plan, step %lld", (long long)t->step + 1);
    /* the items' costs (patches) in order, and each replica rank's run */
    int64_t *cost = malloc(sizeof *cost * (size_t)(n_items + 1));
    if (!cost) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int gi = 0, at = 0; gi < h->n_g; gi++) {
        const hgroup *g = &h->g[gi];
        for (int i = 0; i < g->n; i++) cost[at++] = g->grid[3 * i] * g->grid[3 * i + 1] * g->grid[3 * i + 2];
    }
    int first = 0, cnt = 0;
    for (int q = 0; q < h->R; q++) {
        int f, n;
        mmc_hetero_share(cost, n_items, h->R, q, &f, &n);
        h->rows_of[q] = 0;
        for (int i = f; i < f + n; i++) h->rows_of[q] += cost[i] / ms2;
        if (q == h->r) first = f, cnt = n;
    }
    free(cost);
    /* encode the share: one tower call per group it touches (a group's images share a pixel array) */
    const bool train = h->n_tower > 0;
    bool prev = mmc_set_grad_enabled(h->ctx, train);
    /* LoRA dropout on the tower's adapters: one stream per rank and step for its whole share (so a
     * recomputed block draws its mask again); the masks are not one process's, which draws them per
     * micro-batch over all its images */
    if (t->lora && t->cfg->model.lora.dropout > 0)
        mmc_nn_set_dropout_seed(h->ctx, mmc_nn_dropout_seed((uint64_t)t->cfg->training.seed, (uint64_t)t->step,
                                                            (uint64_t)(1u << 30) + (uint64_t)t->rank));
    int64_t my_rows = 0;
    h->total_rows = 0;
    for (int gi = 0, at = 0; gi < h->n_g && !st; gi++) {
        hgroup *g = &h->g[gi];
        g->row0 = h->total_rows;
        g->rows = 0;
        for (int i = 0; i < g->n; i++) g->rows += g->grid[3 * i] * g->grid[3 * i + 1] * g->grid[3 * i + 2] / ms2;
        h->total_rows += g->rows;
        const int a = first > at ? first - at : 0, e = first + cnt - at < g->n ? first + cnt - at : g->n;
        at += g->n;
        if (a >= e) continue;
        /* the micro-batch and kind of this group: found by its grid array */
        const float *px = NULL;
        for (int64_t k = 0; k < M && !px; k++)
            px = mbs[k].image_grid_thw == g->grid ? mbs[k].pixel_values
               : mbs[k].video_grid_thw == g->grid ? mbs[k].video_values : NULL;
        int64_t p0 = 0, np = 0;
        for (int i = 0; i < a; i++) p0 += g->grid[3 * i] * g->grid[3 * i + 1] * g->grid[3 * i + 2];
        for (int i = a; i < e; i++) np += g->grid[3 * i] * g->grid[3 * i + 1] * g->grid[3 * i + 2];
        mmc_tensor *pix = mmc_new(h->ctx, MMC_F32, 2, MMC_SHAPE(np, K));   /* [np, K] */
        memcpy(pix->data, px + p0 * K, sizeof(float) * (size_t)(np * K));
        mmc_tensor *o;
        st = mmc_vision_forward(h->ctx, vis, pix, g->grid + 3 * a, e - a, &o, NULL);
        /* (fatal, as mmc_qwen2_vl's shared encode: the grids were checked alike on every rank, and a rank
         * failing alone would leave the replica waiting in the all-to-all) */
        MMC_CHECK(st == MMC_OK, "vision tower on this rank's share of step %lld (checked before): %s",
                  (long long)t->step + 1, mmc_last_error());
        o = mmc_contiguous(h->ctx, o);   /* [rows, Co] */
        MMC_CHECK(o->dtype == MMC_F32 && o->ndim == 2 && o->shape[1] == Co, "the tower's merged features are f32 [rows, %lld]",
                  (long long)Co);
        my_rows += o->shape[0];
        t->vl->share_images += e - a;
        t->vl->share_patches += np;
        st = push_out(h, o);
    }
    mmc_set_grad_enabled(h->ctx, prev);
    if (st) return mmc_error_prefix(st, "per-modality plan: the vision tower on this rank's share of step %lld",
                                    (long long)t->step + 1);
    MMC_CHECK(my_rows == h->rows_of[h->r], "share rows %lld vs %lld", (long long)my_rows, (long long)h->rows_of[h->r]);
    /* the features to each tp rank of the first stage (replica ranks 0 .. tp-1) */
    const bool first_stage = t->pp_rank == 0;
    int64_t *cnts = calloc((size_t)(2 * h->R), sizeof *cnts), *rc = cnts + h->R;
    float *send = malloc(sizeof(float) * (size_t)(h->tp * my_rows * Co) + 1);
    if (first_stage) {
        h->F = malloc(sizeof(float) * (size_t)(h->total_rows * Co) + 1);
        h->dF = train ? calloc((size_t)(h->total_rows * Co) + 1, sizeof(float)) : NULL;
    }
    if (!cnts || !send || (first_stage && (!h->F || (train && !h->dF)))) {
        free(cnts), free(send);
        return mmc_error(MMC_ERR_OOM, "out of memory for the vision features (%lld rows)", (long long)h->total_rows);
    }
    for (int j = 0; j < h->tp; j++) {
        int64_t at = 0;
        for (int i = 0; i < h->n_out; i++) {
            const int64_t n = mmc_numel(h->out[i]);
            memcpy(send + (int64_t)j * my_rows * Co + at, h->out[i]->data, sizeof(float) * (size_t)n);
            at += n;
        }
        cnts[j] = my_rows * Co;
    }
    for (int q = 0; first_stage && q < h->R; q++) rc[q] = h->rows_of[q] * Co;
    st = mmc_all_to_all_v(h->rep, send, cnts, h->F, rc, MMC_F32);
    free(cnts);
    free(send);
    if (st) return mmc_error_prefix(st, "per-modality plan: sending the vision features to the first stage");
    /* the first stage's leaves: each group's rows, their gradient in dF */
    for (int gi = 0; first_stage && gi < h->n_g; gi++) {
        hgroup *g = &h->g[gi];
        if (!(g->feat = mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(g->rows, Co), h->F + g->row0 * Co)))
            return mmc_error(MMC_ERR_OOM, "out of memory");
        if (train) {
            if (!(g->feat->grad = mmc_tensor_wrap(MMC_F32, 2, MMC_SHAPE(g->rows, Co), h->dF + g->row0 * Co)))
                return mmc_error(MMC_ERR_OOM, "out of memory");
            g->feat->flags |= MMC_REQUIRES_GRAD;
        }
    }
    h->active = true;
    return MMC_OK;
}

/* After the pipeline: d(features) from the first stage to the ranks that encoded them, the tower's
 * backward, its gradients summed over the replica (the stage's dp reduction adds the replicas).
 * Collective over the replica. */
mmc_status mmc_trainer_pp_hetero_backward(mmc_trainer *t) {
    mmc_pp_hetero *h = t->pph;
    mmc_status st = MMC_OK;
    if (!h->active || !h->n_tower) { step_clear(h); return MMC_OK; }
    const int64_t Co = h->Co;
    const bool first_stage = t->pp_rank == 0;
    const int col = h->r % h->tp;   /* this rank's tp rank: the first stage's rank `col` serves it */
    int64_t *cnts = calloc((size_t)(2 * h->R), sizeof *cnts), *rc = cnts + h->R;
    int64_t send_n = 0;
    for (int q = 0; first_stage && q < h->R; q++)
        if (q % h->tp == col) send_n += h->rows_of[q] * Co;
    float *send = malloc(sizeof(float) * (size_t)send_n + 1), *recv = malloc(sizeof(float) * (size_t)(h->rows_of[h->r] * Co) + 1);
    if (!cnts || !send || !recv) {
        free(cnts), free(send), free(recv);
        step_clear(h);
        return mmc_error(MMC_ERR_OOM, "out of memory for the vision features' gradient");
    }
    if (first_stage) {   /* the rows of the ranks in this tp column, in replica-rank (= image) order */
        int64_t row = 0, at = 0;
        for (int q = 0; q < h->R; q++) {
            if (q % h->tp == col) {
                memcpy(send + at, h->dF + row * Co, sizeof(float) * (size_t)(h->rows_of[q] * Co));
                at += h->rows_of[q] * Co;
                cnts[q] = h->rows_of[q] * Co;
            }
            row += h->rows_of[q];
        }
    }
    rc[col] = h->rows_of[h->r] * Co;   /* from the first stage's rank of this tp column (replica rank col) */
    st = mmc_all_to_all_v(h->rep, send, cnts, recv, rc, MMC_F32);
    free(cnts);
    free(send);
    if (!st) {   /* the tower's backward from its outputs' gradients */
        int64_t at = 0;
        for (int i = 0; i < h->n_out; i++) {
            mmc_tensor *o = h->out[i];
            const int64_t n = mmc_numel(o);
            if (mmc_requires_grad(o)) {
                float *g = mmc_grad(h->ctx, o)->data;
                for (int64_t e = 0; e < n; e++) g[e] += recv[at + e];
            }
            at += n;
        }
        bool prev = mmc_set_grad_enabled(h->ctx, false);   /* backward rules are not recorded */
        mmc_backward_range(h->ctx, 0, mmc_tape_len(h->ctx));
        mmc_set_grad_enabled(h->ctx, prev);
    }
    free(recv);
    step_clear(h);
    if (st) return mmc_error_prefix(st, "per-modality plan: the vision features' gradient back from the first stage");
    /* each rank's partial tower gradients summed over the replica (a rank with no image adds zeros) */
    return mmc_trainer_sum_grads(t, h->rep, h->tower, h->n_tower, h->buf, "MMC_TEST_PP_HETERO_NO_SUM");
}

/* after a failed step: nothing of it is kept */
void mmc_trainer_pp_hetero_abort(mmc_trainer *t) {
    if (t->pph) step_clear(t->pph);
}
