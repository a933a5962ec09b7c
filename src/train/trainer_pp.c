/* trainer_pp.c — the trainer's side of pipeline parallelism (mmc_pp.h; parallel.pipeline_parallel):
 * the layout checks and process groups (Megatron's order: tensor fastest, then data, then
 * pipeline stages), cutting the loaded model down to this rank's stage, one
 * optimizer step's micro-batches through the 1F1B runtime with the gradient sums it needs
 * (over the stage's data-parallel group, and the tied embedding between the first and last
 * stage), the global gradient norm over the tensor slices and the stages, and checkpoints.
 * LLaVA / InternVL run their tower and projector on the first stage (as Qwen2-VL's tower), through
 * mmc_pp_set_embeds; the later stages keep only their decoder layers (mmc_trainer_pp_keep).
 *
 * A checkpoint is the normal single-process one (HF model.safetensors with every layer,
 * optimizer.safetensors, trainer_state.json): with tp the stage's tensors are first gathered
 * over its tp group (trainer.c's tp_to_full); then the first rank of each stage sends its
 * parameters, AdamW moments and fp32 masters to world rank 0, which writes them with the
 * single-process saver. So a run resumes at any number of stages (each stage loads the full
 * checkpoint and keeps its part), and transformers loads it as it is.
 *
 * parallel.pipeline_vision_stage (Qwen2-VL / Qwen2.5-VL, 1F1B): stage 0 holds the vision tower,
 * its merger and the token embedding and no decoder layer (the empty range [0, 0)); the runtime
 * treats it as any first stage: it sends the embeddings with the image features spliced in and
 * runs the tower's backward from the gradient that comes back. The decoder layers split over
 * stages 1 .. P-1 (pipeline_layers: P-1 counts).
 *
 * parallel.vision data-parallel over all ranks (a per-modality plan, trainer_pp_hetero.c): every stage
 * keeps the tower; each rank encodes its share of the replica's step before mmc_pp_run, the first
 * stage splices the features it was sent, and after the run the tower's backward and gradient sum
 * happen before the stage's dp reduction. Later stages' tower copies are left out of the norm and
 * the checkpoint (mmc_trainer_pp_hetero_copy).
 *
 * ZeRO-1/2/3 (parallel.zero) under pipeline parallelism: each stage's trained tensors are sharded
 * over that stage's data-parallel group by an mmc_dp of their own (mmc_trainer_pp_zero): 1F1B
 * accumulates a stage's micro-batches into its gradient tensors, as a pipeline must (a stage's
 * backward of one micro-batch interleaves with the forward of the next); after the step's last
 * micro-batch the buckets are reduce-scattered within the stage's dp group (mmc_dp_reduce_grads);
 * each rank keeps the AdamW moments of its shard, updates it and all-gathers the parameters.
 * ZeRO-2 then frees the full gradient tensors until the next step's backward (between steps a
 * rank holds 1/dp of the stage's gradients); within the backward both stages hold them whole —
 * gradients cannot be reduce-scattered per micro-batch across the 1F1B interleaving without a
 * hook per layer, which is why DeepSpeed refuses ZeRO-2 with its pipeline engine, and Megatron's
 * distributed optimizer does as here. The norm sums the shards' squares over dp, tp and the
 * stages (the tied embedding's copy on the last stage once). ZeRO-3 keeps 1/dp of the stage's
 * parameters (the fp32 master shard) between steps and gathers the whole stage, as one unit,
 * for a step's micro-batches (torchtitan does the same for FSDP under pp: resharding after each
 * micro-batch's forward would gather every layer again for its backward, which 1F1B runs after
 * other micro-batches' forwards). A checkpoint gathers the moments (ZeRO-3: and the parameters)
 * over dp first and is then the single-process one above (so it resumes at any layout). */
#include "trainer_internal.h"
#include "mmc_dp.h"
#include "mmc_plan.h"
#include "mmc_pp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ layout */
mmc_status mmc_trainer_pp_layout(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    const int P = (int)c->parallel.pipeline_parallel, W = t->world_size, TP = t->tp_size, MP = P * TP;
    t->pp_size = P;
    char what[96];   /* the model-parallel group, for the messages */
    if (TP > 1) snprintf(what, sizeof what, "pipeline_parallel %d x tensor_parallel %d", P, TP);
    else snprintf(what, sizeof what, "pipeline_parallel %d", P);
    if (MP > W)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.%s is larger than the job's %d process%s: each stage%s needs "
                         "its own rank; launch with mmc launch -n %d (or a multiple)", c->file, what, W,
                         W == 1 ? "" : "es", TP > 1 ? " and tensor slice" : "", MP);
    if (W % MP)
        return mmc_error(MMC_ERR_INVALID, "%s: the job's %d processes do not divide into %d pipeline stages%s "
                         "(parallel.%s); launch a multiple of %d processes", c->file, W, P,
                         TP > 1 ? " of tensor-parallel groups" : "", what, MP);
    t->dp_size = W / MP;
    if (c->parallel.data_parallel != t->dp_size && c->parallel.data_parallel != 1)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.data_parallel %lld x %s is not the job's %d processes; set "
                         "data_parallel: %d or leave it out", c->file, (long long)c->parallel.data_parallel, what, W,
                         t->dp_size);
    if (c->training.gradient_accumulation % t->dp_size)
        return mmc_error(MMC_ERR_INVALID, "%s: data.batch_size %lld does not divide into %d data-parallel replicas "
                         "(world %d / pipeline_parallel %d) x micro_batch_size %lld", c->file,
                         (long long)c->data.batch_size, t->dp_size, W, P, (long long)c->data.micro_batch_size);
    mmc_dist_layout lay = {.tensor = TP, .pipeline = P, .data = t->dp_size};
    mmc_status st = mmc_dist_layout_groups(t->world, &lay, &t->groups);
    if (st) return st;
    t->have_groups = true;
    t->dpc = t->groups.dp;
    t->dp_rank = t->groups.dp_rank;
    t->pp_rank = t->groups.pp_rank;
    if (TP > 1) t->tpc = t->groups.tp;
    const int64_t M = c->training.gradient_accumulation / t->dp_size, v = c->parallel.pipeline_virtual;
    t->pp_v = (int)v;
    if (v > 1 && M % P)
        return mmc_error(MMC_ERR_INVALID, "%s: interleaved 1F1B (parallel.pipeline_virtual %lld) sends micro-batches "
                         "through the stages in groups of pipeline_parallel %d, but a step has %lld per data-parallel "
                         "rank (data.batch_size / micro_batch_size / data_parallel): use a multiple of %d", c->file,
                         (long long)v, P, (long long)M, P);
    if (c->parallel.pipeline_schedule == MMC_PP_SCHED_DUALPIPEV) {
        t->pp_v = 2;   /* the V's two chunks */
        if (M < 2 * P)
            return mmc_error(MMC_ERR_INVALID, "%s: pipeline_schedule dualpipev over pipeline_parallel %d needs at least "
                             "%d micro-batches per step and data-parallel rank (2 x stages: rank 0 feeds 2P-1 into the "
                             "V before the first comes back), but a step has %lld (data.batch_size / "
                             "micro_batch_size / data_parallel); raise data.batch_size to %lld or use "
                             "pipeline_schedule 1f1b", c->file, P, 2 * P, (long long)M,
                             (long long)(2 * P * c->data.micro_batch_size * t->dp_size));
    } else if (t->rank == 0 && M < P)
        fprintf(stderr, "mmc train: warning: %lld micro-batch%s per step and data-parallel rank (data.batch_size / "
                "micro_batch_size / data_parallel) is fewer than the %d pipeline stages: 1F1B keeps stages idle "
                "%.0f%% of each step ((P-1)/(M+P-1)); use at least %d micro-batches, better 4 x %d\n", (long long)M,
                M == 1 ? "" : "es", P, 100.0 * mmc_pp_bubble_fraction(P, (int)M), P, P);
    /* expert parallelism inside the pipeline: each stage's dp group carved into ep groups (the
     * stage's MoE layers exchange their routed rows within it) */
    if (c->parallel.expert_parallel > 1) {
        if ((st = mmc_ep_trainer_groups(t))) return st;
        if (t->rank == 0)
            fprintf(stderr, "mmc train: expert parallelism %lld inside each pipeline stage: a stage's MoE layers spread "
                    "their experts over groups of %lld of its %d data-parallel ranks (all-to-all), each expert's "
                    "gradient summed over the %lld ranks holding it\n", (long long)c->parallel.expert_parallel,
                    (long long)c->parallel.expert_parallel, t->dp_size,
                    (long long)(t->dp_size / c->parallel.expert_parallel));
    }
    return MMC_OK;
}

/* peak RSS since the last reset (VmHWM), MiB */
static double peak_rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024.0;
}

/* LLaVA / InternVL: the first stage's input embeddings (the tower and projector run there only; the
 * other stages leave them out of their parameters, mmc_trainer_pp_keep) */
static mmc_status vlm_stage_embeds(void *arg, mmc_ctx *ctx, const mmc_batch *b, mmc_tensor **x) {
    mmc_trainer *t = arg;
    return t->internvl ? mmc_internvl_batch_embeds(ctx, t->internvl, b, NULL, x)
                       : mmc_llava_batch_embeds(ctx, t->llava, b, NULL, x);
}

bool mmc_trainer_pp_keep(const mmc_trainer *t, const char *name) {
    if (!t->pp || t->pp_rank == 0 || (!t->llava && !t->internvl)) return true;
    return !strncmp(name, "language_model.", 15);   /* (the decoder's own tensors are trimmed already) */
}

/* parallel.pipeline_layers: auto (the default): world rank 0 measures the layers' costs at the run's
 * shapes with the planner's calibration (mmc_plan_pp_measure: its cache, its timers), cuts the
 * stages and broadcasts the bounds and the stages' modelled times, so every rank runs the same split
 * (the measurement is noisy; one rank's draw decides). bounds[0 .. nst]; cost[nst] seconds. */
static mmc_status pp_auto_bounds(mmc_trainer *t, int P, int v, bool dpv, bool tower, int64_t *bounds, double *cost,
                                 bool *even, double *took) {
    const mmc_run_config *c = t->cfg;
    const int nst = P * v;
    int64_t msg[258];   /* bounds, then `even`; msg[0] = -1: rank 0 failed */
    double ms[256];
    char why[400] = "";
    if (t->rank == 0) {
        const mmc_vision_config *vc = t->vl && t->vl->visual ? &t->vl->visual->cfg : NULL;
        mmc_plan_workload w = {.batch = c->data.batch_size, .micro_batch = c->data.micro_batch_size,
                               .seq = c->data.seq_len, .weight_bytes = c->model.dtype == MMC_RUN_BF16 ? 2 : 4,
                               .act_bytes = 4, .freeze_vision = (c->model.freeze_mask & MMC_FREEZE_VISION) != 0};
        /* images: one of data.max_pixels per row (the processor's bound; not set: the tower is not costed) */
        if (vc && c->data.max_pixels > 0) w.vision_patches = c->data.max_pixels / (vc->patch_size * vc->patch_size);
        mmc_plan_layout l = {.dp = t->dp_size, .tp = t->tp_size, .pp = P, .cp = 1, .ep = 1, .vpp = v,
                             .micro_batch = c->data.micro_batch_size, .dualpipev = dpv, .vstage = tower,
                             .hetero = c->parallel.hetero};   /* (hetero: the tower off the first stage) */
        char path[4096];
        mmc_plan_calib_default_path(path, sizeof path);
        bool ev = false;
        const double t0 = mmc_now();
        mmc_status st = mmc_plan_pp_measure(&t->lm->cfg, vc, &w, &l, path, msg, ms, &ev);
        *took = mmc_now() - t0;
        if (st) {
            msg[0] = -1;
            snprintf(why, sizeof why, "%s", mmc_last_error());
        }
        msg[nst + 1] = ev;
    }
    mmc_status st = mmc_broadcast(t->world, msg, nst + 2, MMC_I64, 0);
    if (!st) st = mmc_broadcast(t->world, ms, nst, MMC_F64, 0);
    if (st) return mmc_error_prefix(st, "%s: broadcasting the pipeline split", c->file);
    if (msg[0] < 0)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.pipeline_layers auto: %s%s; give the layer counts in "
                         "parallel.pipeline_layers (or even)", c->file, t->rank == 0 ? "" : "world rank 0 could not "
                         "measure the layers' costs", why);
    memcpy(bounds, msg, (size_t)(nst + 1) * sizeof *bounds);
    memcpy(cost, ms, (size_t)nst * sizeof *cost);
    *even = msg[nst + 1] != 0;
    return MMC_OK;
}

mmc_status mmc_trainer_pp_setup(mmc_trainer *t) {
    const mmc_run_config *c = t->cfg;
    const int P = t->pp_size, s = t->pp_rank;
    if (mmc_trainer_diffusion(t) || !t->lm)
        return mmc_error(MMC_ERR_UNSUPPORTED, "%s: parallel.pipeline_parallel splits a Qwen2, Qwen2-MoE, Qwen2-VL / "
                         "Qwen2.5-VL, LLaVA or InternVL so far; a diffusion model is not split into stages yet: use "
                         "data parallelism for it", c->file);
    const bool dpv = c->parallel.pipeline_schedule == MMC_PP_SCHED_DUALPIPEV;
    const int v = t->pp_v, nv = P * v;   /* virtual stages: chunk c of rank s is c P + s (DualPipeV: s, 2P-1-s) */
    if (nv > 256) return mmc_error(MMC_ERR_INVALID, "%s: more than 256 (virtual) pipeline stages", c->file);
    int64_t sizes[256], bounds[257];
    const int mode = mmc_pp_layers_mode(&c->parallel);
    const int ns = mode == MMC_PP_LAYERS_LIST ? c->parallel.pipeline_layers.n : 0;
    for (int i = 0; i < ns && i < 256; i++) sizes[i] = atoll(c->parallel.pipeline_layers.items[i]);
    const bool tower = c->parallel.pipeline_vision_stage;   /* stage 0: the vision tower alone */
    mmc_status st;
    double scost[256], took = 0;   /* (took: rank 0's measurement, seconds) */
    bool even = false;
    if (tower && !t->vl)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.pipeline_vision_stage puts a vision tower on a stage of "
                         "its own, but the model has none (Qwen2-VL / Qwen2.5-VL only); leave it out", c->file);
    /* auto: from the layers' measured costs (the split is the same on every rank); with fewer layers than
     * stages the even split's checks below say why none exists */
    const bool autos = mode == MMC_PP_LAYERS_AUTO && t->lm->cfg.num_layers >= (tower ? P - 1 : nv);
    if (autos) {
        if ((st = pp_auto_bounds(t, P, v, dpv, tower, bounds, scost, &even, &took))) return st;
    } else if (tower) {   /* (config.c refused interleaving and DualPipeV with it: v = 1 here) */
        if (P < 2 || v != 1) return mmc_error(MMC_ERR_INVALID, "%s: pipeline_vision_stage needs plain 1F1B over 2 or "
                                              "more stages", c->file);
        /* decoder stages 1 .. P-1 get the layers; stage 0 the empty range [0, 0) before them */
        if ((st = mmc_pp_split_layers(t->lm->cfg.num_layers, P - 1, sizes, ns, bounds + 1)))
            return mmc_error_prefix(st, "%s: pipeline_vision_stage: stage 0 holds the vision tower, so the %lld decoder "
                                    "layers split over the %d stages after it", c->file,
                                    (long long)t->lm->cfg.num_layers, P - 1);
        bounds[0] = 0;
    } else {
        st = mmc_pp_split_layers(t->lm->cfg.num_layers, nv, sizes, ns, bounds);
    }
    if (st && dpv) return mmc_error_prefix(st, "%s: DualPipeV's %d stages x 2 chunks = %d virtual stages", c->file, P, nv);
    if (st && v > 1) return mmc_error_prefix(st, "%s: %d stages x %d chunks (pipeline_virtual) = %d virtual stages", c->file, P, v, nv);
    if (st) return mmc_error_prefix(st, "%s", c->file);
    /* tied embeddings: summed between two stages, unless (DualPipeV) rank 0 holds both uses */
    t->pp_tied = t->lm->lm_head == t->lm->embed && !dpv;
    for (int k = 0; k < v; k++) {
        const int j = dpv ? mmc_pp_dualpipev_vstage(P, s, k) : k * P + s;
        t->pp_l0[k] = bounds[j], t->pp_l1[k] = bounds[j + 1];
    }
    const int last = dpv ? 0 : P - 1;   /* the rank with the final norm, lm_head and loss */
    /* (a per-modality plan keeps the vision tower on every stage: trainer_pp_hetero.c) */
    const bool hetero = t->vl && c->parallel.hetero;
    if ((st = t->vl && !hetero ? mmc_pp_trim_qwen2_vl_at(t->vl, s, last, v, t->pp_l0, t->pp_l1)
                               : mmc_pp_trim_qwen2_at(t->lm, s, last, v, t->pp_l0, t->pp_l1)))
        return st;
    if (t->lora && (st = mmc_pp_trim_lora_ex(t->lora, s, last, v, t->pp_l0, t->pp_l1, hetero))) return st;
    if ((st = dpv ? mmc_pp_new_dualpipev(t->groups.pp, t->lm, t->pp_l0, t->pp_l1, &t->pp)
                  : mmc_pp_new_v(t->groups.pp, t->lm, v, t->pp_l0, t->pp_l1, &t->pp)))
        return st;
    if (t->vl) mmc_pp_set_vl(t->pp, t->vl);
    if (t->llava || t->internvl) mmc_pp_set_embeds(t->pp, vlm_stage_embeds, t);   /* tower + projector: stage 0 */
    mmc_pp_set_early_recv(t->pp, t->cfg->parallel.pipeline_early_recv);
    /* the memory figures from here on are the stage's own (the full model was read first) */
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) { fputs("5", f); fclose(f); }
    if (t->rank == 0) {
        const int M = (int)(c->training.gradient_accumulation / t->dp_size);
        char tps[48] = "";
        if (t->tp_size > 1) snprintf(tps, sizeof tps, " x tensor parallelism %d", t->tp_size);
        char vs[64] = "";
        if (v > 1) snprintf(vs, sizeof vs, " interleaved (%d chunks per rank)", v);
        if (dpv) {   /* the simulator's figure (forward : input grad : weight grad = 1 : 1 : 1) against 1F1B's */
            double b_dpv = 0, b_1f1b = 0;
            mmc_pp_simulate_dualpipev(P, M, 1.0, 1.0, 1.0, &b_dpv);
            mmc_pp_simulate(P, M, 1.0, 2.0, &b_1f1b);
            fprintf(stderr, "mmc train: pipeline parallelism %d stages%s x data parallelism %d (%s), DualPipeV (2 chunks "
                    "per rank in a V, split backward) over %d micro-batches per step (simulated bubble %.1f%%, 1F1B "
                    "%.1f%%); virtual stage layers down | up:", P, tps, t->dp_size, mmc_comm_backend_name(t->world), M,
                    100.0 * b_dpv, 100.0 * b_1f1b);
        } else {
            fprintf(stderr, "mmc train: pipeline parallelism %d stages%s x data parallelism %d (%s), 1F1B%s over %d "
                    "micro-batches per step (bubble (P-1)/(%sM+P-1) = %.1f%%); stage layers:", P, tps, t->dp_size,
                    mmc_comm_backend_name(t->world), vs, M, v > 1 ? "v " : "", 100.0 * mmc_pp_bubble_fraction_v(P, v, M));
        }
        for (int k = 0; k < nv; k++)
            if (tower && k == 0) fprintf(stderr, " vision tower + merger + embedding (no decoder layer)");
            else fprintf(stderr, "%s[%lld, %lld)", v > 1 && k % P == 0 ? (k ? " | " : " ") : " ", (long long)bounds[k],
                         (long long)bounds[k + 1]);
        fprintf(stderr, "%s\n", t->pp_tied ? "; tied embeddings: first and last stage sum their gradients" : "");
        if (autos) {   /* the split and each (virtual) stage's modelled time */
            char ls[2048] = "", ts[2048] = "";
            double mx = 0, sum = 0;
            for (int k = 0, a = 0, b = 0; k < nv; k++) {
                if (tower && k == 0) a += snprintf(ls + a, sizeof ls - (size_t)a, "tower");
                else a += snprintf(ls + a, sizeof ls - (size_t)a, "%s%lld", k ? "|" : "", (long long)(bounds[k + 1] - bounds[k]));
                b += snprintf(ts + b, sizeof ts - (size_t)b, "%s%.3g", k ? "|" : "", 1e3 * scost[k]);
                mx = scost[k] > mx ? scost[k] : mx;
                sum += scost[k];
                if (a >= (int)sizeof ls - 16 || b >= (int)sizeof ts - 16) break;
            }
            fprintf(stderr, "mmc train: pipeline: %sstages %s layers (auto, measured%s): %s ms/micro-batch, imbalance "
                    "%.2f (measured in %.0f ms)\n", v > 1 ? "virtual " : "", ls,
                    even ? "; the even split, the best is within 3%" : "", ts, sum > 0 ? mx / (sum / nv) : 1.0, 1e3 * took);
        }
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ one step */
static bool is_tied_copy(const mmc_trainer *t, const mmc_tensor *p) {
    return t->pp_tied && t->pp_size > 1 && t->pp_rank == t->pp_size - 1 && p == t->lm->embed;
}

/* ZeRO-1/2/3: the stage's data-parallel sharding of its trained tensors (after any restore: the
 * full moments it read are cut to this rank's shard) */
mmc_status mmc_trainer_pp_zero(mmc_trainer *t) {
    const int zero = (int)t->cfg->parallel.zero;
    if (zero < 1 || zero > 3)
        return mmc_error(MMC_ERR_INVALID, "%s: parallel.zero %d: the ZeRO stages are 0-3", t->cfg->file, zero);
    mmc_status st = mmc_dp_new(t->dpc, zero, t->opt_model, t->opt, t->n_opt, 0, &t->adamw.o, NULL, &t->dp);
    if (st) return st;
    if (t->tpc) mmc_dp_set_tp(t->dp, t->tpc, t->opt_split);   /* the norm over the tp slices */
    unsigned char *skip = calloc((size_t)t->n_opt + 1, 1);
    if (!skip) return mmc_error(MMC_ERR_OOM, "out of memory");
    for (int i = 0; i < t->n_opt; i++)
        skip[i] = is_tied_copy(t, t->opt_model[i]) || mmc_trainer_pp_hetero_copy(t, t->opt_names[i]);
    mmc_dp_set_norm_group(t->dp, t->groups.pp, skip);   /* ... and over the stages */
    free(skip);
    mmc_dp_scatter_state(t->dp, &t->adamw);   /* this rank keeps only its shard of the AdamW state */
    mmc_adamw_free(&t->adamw);
    if (t->rank == 0)
        fprintf(stderr, "mmc train: ZeRO-%d over each stage's %d data-parallel ranks: AdamW state%s sharded, the "
                "stage's gradients reduce-scattered after the step's last micro-batch%s\n", zero, t->dp_size,
                zero == 3 ? ", gradients (between steps) and parameters" : zero == 2 ? " and (between steps) gradients" : "",
                zero == 3 ? "; the stage's parameters all-gathered for each step's micro-batches" : "");
    return MMC_OK;
}

mmc_status mmc_trainer_pp_step(mmc_trainer *t, const mmc_batch *mbs, int64_t M, double scale, double *loss) {
    mmc_pp_set_dropout(t->pp, t->lora && t->cfg->model.lora.dropout > 0, (uint64_t)t->cfg->training.seed, (uint64_t)t->step);
    mmc_status st = t->dp ? mmc_dp_gather_stage(t->dp) : MMC_OK;   /* ZeRO-3: the stage's parameters for the step */
    if (!st && t->pph) st = mmc_trainer_pp_hetero_forward(t, mbs, M);   /* per-modality: the tower's share first */
    if (!st) st = mmc_pp_run(t->pp, mbs, (int)M, scale, loss);
    if (!st && t->pph) st = mmc_trainer_pp_hetero_backward(t);   /* ... and its backward, summed over the replica */
    if (st) {
        if (t->pph) mmc_trainer_pp_hetero_abort(t);
        if (t->dp) mmc_dp_release_stage(t->dp);
        return mmc_error_prefix(st, "step %lld", (long long)t->step + 1);
    }
    /* every trained tensor has a gradient buffer, so the reductions below match on every rank */
    int64_t total = 0;
    for (int i = 0; i < t->n_opt; i++) total += mmc_numel(mmc_grad(t->ctx, t->opt_model[i]));
    if (t->dp) {   /* ZeRO: the tied embedding summed first, then reduce-scattered within the stage's dp group */
        if (t->pp_tied && (t->pp_rank == 0 || t->pp_rank == t->pp_size - 1) && (t->lm->embed->flags & MMC_REQUIRES_GRAD) &&
            (st = mmc_pp_tied_reduce(t->pp, mmc_grad(t->ctx, t->lm->embed)->data, mmc_numel(t->lm->embed))))
            return st;
        st = mmc_dp_reduce_grads(t->dp);
        if (!st) st = mmc_dp_finish(t->dp, t->ctx);
        mmc_dp_release_stage(t->dp);   /* ZeRO-3: back to this rank's shard until the next step */
        if (st) return st;
    } else if (t->epc) {   /* expert parallelism: dense gradients over the stage's dp group, a routed expert's over
                            * the ranks holding it (edp); the exchange's backward brought it its ep group's tokens */
        for (int i = 0; i < t->n_opt && !st; i++) {
            mmc_tensor *g = t->opt_model[i]->grad;
            mmc_comm *cm = t->ep_split[i] >= 0 ? t->edpc : t->dpc;
            if (mmc_comm_size(cm) > 1) st = mmc_all_reduce(cm, g->data, g->data, mmc_numel(g), MMC_F32, MMC_SUM);
        }
        if (st) return st;
    } else if (t->dp_size > 1) {   /* the stage's replicas: one all-reduce of the packed gradients */
        float *buf = malloc((size_t)total * sizeof(float) + 1);
        if (!buf) return mmc_error(MMC_ERR_OOM, "out of memory packing the gradients");
        int64_t off = 0;
        for (int i = 0; i < t->n_opt; i++) {
            const mmc_tensor *g = t->opt_model[i]->grad;
            memcpy(buf + off, g->data, mmc_nbytes(g));
            off += mmc_numel(g);
        }
        st = mmc_all_reduce(t->dpc, buf, buf, total, MMC_F32, MMC_SUM);
        off = 0;
        for (int i = 0; !st && i < t->n_opt; i++) {
            const mmc_tensor *g = t->opt_model[i]->grad;
            memcpy(g->data, buf + off, mmc_nbytes(g));
            off += mmc_numel(g);
        }
        free(buf);
        if (st) return st;
    }
    if (!t->dp && t->pp_tied && (t->pp_rank == 0 || t->pp_rank == t->pp_size - 1)) {
        mmc_tensor *e = t->lm->embed;
        if (e->flags & MMC_REQUIRES_GRAD) st = mmc_pp_tied_reduce(t->pp, mmc_grad(t->ctx, e)->data, mmc_numel(e));
        if (st) return st;
    }
    /* the loss lives on the last stage of each replica: summed over the world (0 elsewhere; with
     * tp every rank of the last stage has it: counted once) */
    if (t->tpc && t->groups.tp_rank != 0) *loss = 0;
    if ((st = mmc_all_reduce(t->world, loss, loss, 1, MMC_F64, MMC_SUM))) return st;
    if (!isfinite(*loss))
        return mmc_error(MMC_ERR_NUMERIC, "step %lld: the loss is not finite; stopping without updating the "
                         "weights — the last checkpoint is intact; lower optimizer.lr or check the data",
                         (long long)t->step + 1);
    if (t->step + 1 == t->cfg->training.steps) {   /* each rank's memory at the end of the run */
        int64_t bytes;
        double wait;
        mmc_pp_last_stats(t->pp, &bytes, &wait);
        char ls[256] = "";
        for (int k = 0; k < t->pp_v; k++) {
            size_t u = strlen(ls);
            if (t->pp_l0[k] == t->pp_l1[k]) snprintf(ls + u, sizeof ls - u, "%snone: vision tower", k ? " " : "");
            else snprintf(ls + u, sizeof ls - u, "%s[%lld, %lld)", k ? " " : "", (long long)t->pp_l0[k], (long long)t->pp_l1[k]);
        }
        fprintf(stderr, "mmc train: pipeline stage %d/%d (layers %s), data-parallel rank %d: peak RSS %.1f MiB since "
                "set-up; last step sent %.2f MiB point-to-point, %.3f s waiting in receives\n", t->pp_rank,
                t->pp_size, ls, t->dp_rank, peak_rss_mib(), (double)bytes / 1048576.0, wait);
    }
    return MMC_OK;
}

mmc_status mmc_trainer_pp_clip(mmc_trainer *t, double *norm) {
    double sq[3] = {0, 0, 0};   /* tensor-parallel slices (summed over tp), routed experts (over ep and tp, as
                                 * trainer_ep.c's norm), replicated */
    for (int i = 0; i < t->n_opt; i++) {
        const mmc_tensor *g = t->opt[i]->grad;
        if (!g || is_tied_copy(t, t->opt_model[i]) || mmc_trainer_pp_hetero_copy(t, t->opt_names[i]))
            continue;   /* the tied embedding counts once, and so does a data-parallel tower */
        const float *gd = g->data;
        double s = 0;
        for (int64_t k = 0, n = mmc_numel(g); k < n; k++) s += (double)gd[k] * gd[k];
        sq[t->ep_split && t->ep_split[i] >= 0 ? 1 : t->opt_split && t->opt_split[i] >= 0 ? 0 : 2] += s;
    }
    mmc_status st = t->tpc ? mmc_all_reduce(t->tpc, sq, sq, 2, MMC_F64, MMC_SUM) : MMC_OK;
    if (!st && t->epc) st = mmc_all_reduce(t->epc, &sq[1], &sq[1], 1, MMC_F64, MMC_SUM);
    double total = sq[0] + sq[1] + sq[2];
    if (!st) st = mmc_all_reduce(t->groups.pp, &total, &total, 1, MMC_F64, MMC_SUM);
    if (st) return st;
    *norm = sqrt(total);
    const double max_norm = t->cfg->optimizer.grad_clip;
    if (max_norm > 0 && *norm > max_norm) {   /* as clip_grad_norm_ (mmc_clip_grad_norm) */
        const float coef = (float)(max_norm / (*norm + 1e-6));
        for (int i = 0; i < t->n_opt; i++) {
            mmc_tensor *g = t->opt[i]->grad;
            if (g) for (int64_t k = 0, n = mmc_numel(g); k < n; k++) ((float *)g->data)[k] *= coef;
        }
    }
    return MMC_OK;
}

/* ------------------------------------------------------------------ checkpoints
 * A stage's part goes to world rank 0 tensor by tensor, straight from and into the tensors
 * (no packed copy on either side): the count, then per parameter a header, its values (model
 * dtype) and, for a trained one, its AdamW moments and, when distinct, its fp32 master. */
enum { TAG_N = 201, TAG_HDR, TAG_VAL, TAG_M, TAG_V, TAG_MASTER, TAG_EMA };
typedef struct {
    char name[200];
    int32_t dtype, ndim, flags, trained, master, ema;   /* ema: its EMA follows (training.ema_decay) */
    int64_t shape[MMC_MAX_DIMS];
} part_hdr;

static int opt_index(const mmc_trainer *t, const mmc_tensor *p) {
    for (int j = 0; j < t->n_opt; j++)
        if (t->opt_model[j] == p) return j;
    return -1;
}
/* the same by name (expert parallelism's gathered view: copies of the parameters, mmc_ep_trainer_to_full) */
static int opt_index_named(const mmc_trainer *t, const mmc_tensor *p, const char *name) {
    const int j = opt_index(t, p);
    if (j >= 0 || !t->epc) return j;
    for (int k = 0; k < t->n_opt; k++)
        if (!strcmp(t->opt_names[k], name)) return k;
    return -1;
}

static mmc_status send_stage(const mmc_trainer *t) {
    mmc_comm *pp = t->groups.pp;
    int64_t n = 0;
    for (int i = 0; i < t->n_params; i++) n += !is_tied_copy(t, t->params[i]) && !mmc_trainer_pp_hetero_copy(t, t->names[i]);
    mmc_status st = mmc_send(pp, &n, 1, MMC_I64, 0, TAG_N);
    for (int i = 0; i < t->n_params && !st; i++) {
        const mmc_tensor *p = t->params[i];
        /* the first stage writes the embedding, and the tower of a per-modality plan */
        if (is_tied_copy(t, p) || mmc_trainer_pp_hetero_copy(t, t->names[i])) continue;
        const int j = opt_index_named(t, p, t->names[i]);
        part_hdr h = {.dtype = p->dtype, .ndim = p->ndim, .flags = (int32_t)p->flags, .trained = j >= 0,
                      .master = j >= 0 && t->opt[j] != t->opt_model[j], .ema = j >= 0 && t->ema};
        snprintf(h.name, sizeof h.name, "%s", t->names[i]);
        memcpy(h.shape, p->shape, sizeof h.shape);
        const int64_t k = mmc_numel(p);
        st = mmc_send(pp, &h, (int64_t)sizeof h, MMC_U8, 0, TAG_HDR);
        if (!st) st = mmc_send(pp, p->data, (int64_t)mmc_nbytes(p), MMC_U8, 0, TAG_VAL);
        if (!st && j >= 0) st = mmc_send(pp, t->adamw.m[j], k, MMC_F32, 0, TAG_M);
        if (!st && j >= 0) st = mmc_send(pp, t->adamw.v[j], k, MMC_F32, 0, TAG_V);
        if (!st && h.master) st = mmc_send(pp, t->opt[j]->data, k, MMC_F32, 0, TAG_MASTER);
        if (!st && h.ema) st = mmc_send(pp, t->ema[j], k, MMC_F32, 0, TAG_EMA);
    }
    /* then the stage's LoRA adapters (A, B; f32, trained) with their moments */
    int64_t nl = 0;
    for (int i = 0; t->lora && i < t->lora->n_params; i++) nl += !mmc_trainer_pp_hetero_copy(t, t->lora_names[i]);
    if (!st) st = mmc_send(pp, &nl, 1, MMC_I64, 0, TAG_N);
    for (int64_t i = 0; t->lora && i < t->lora->n_params && !st; i++) {
        if (mmc_trainer_pp_hetero_copy(t, t->lora_names[i])) continue;   /* (the first stage's adapters) */
        const mmc_tensor *p = t->lora->params[i];
        const int j = opt_index(t, p);
        part_hdr h = {.dtype = p->dtype, .ndim = p->ndim, .flags = (int32_t)p->flags, .trained = j >= 0,
                      .ema = j >= 0 && t->ema};
        snprintf(h.name, sizeof h.name, "%s", t->lora_names[i]);
        memcpy(h.shape, p->shape, sizeof h.shape);
        st = mmc_send(pp, &h, (int64_t)sizeof h, MMC_U8, 0, TAG_HDR);
        if (!st) st = mmc_send(pp, p->data, (int64_t)mmc_nbytes(p), MMC_U8, 0, TAG_VAL);
        if (!st && j >= 0) st = mmc_send(pp, t->adamw.m[j], mmc_numel(p), MMC_F32, 0, TAG_M);
        if (!st && j >= 0) st = mmc_send(pp, t->adamw.v[j], mmc_numel(p), MMC_F32, 0, TAG_V);
        if (!st && h.ema) st = mmc_send(pp, t->ema[j], mmc_numel(p), MMC_F32, 0, TAG_EMA);
    }
    return st;
}

/* the full run as the single-process trainer holds it, for its saver (world rank 0) */
typedef struct {
    int n_params, n_opt;
    mmc_tensor **params, **opt, **opt_model;
    const char **names, **opt_names;
    float **m, **v;
    float **ema;           /* [opt] the EMA of each trained tensor (training.ema_decay), or NULL */
    char **store;          /* received names */
    mmc_tensor **own;      /* received tensors (params and masters) to free */
    float **own_mv;
    int n_own, n_store, n_own_mv;
    int cap;               /* of params / opt / lora (own and own_mv: 3 cap) */
    mmc_tensor **lora;     /* LoRA adapters of every stage (A, B, ...) and their names */
    char **lora_names;
    int n_lora;
} full_view;

static void view_free(full_view *v) {
    for (int i = 0; i < v->n_own; i++) mmc_tensor_free(v->own[i]);
    for (int i = 0; i < v->n_store; i++) free(v->store[i]);
    for (int i = 0; i < v->n_own_mv; i++) free(v->own_mv[i]);
    free(v->params); free(v->opt); free(v->opt_model); free(v->names); free(v->opt_names);
    free(v->m); free(v->v); free(v->ema); free(v->store); free(v->own); free(v->own_mv);
    free(v->lora); free(v->lora_names);
}

/* one tensor of a stage's part: header, values and, when trained, moments (+ master) */
static mmc_status recv_tensor(mmc_comm *pp, int s, full_view *v, bool lora) {
    part_hdr h;
    mmc_status st = mmc_recv(pp, &h, (int64_t)sizeof h, MMC_U8, s, TAG_HDR);
    if (st) return st;
    h.name[sizeof h.name - 1] = 0;
    if (v->n_params >= v->cap || v->n_lora >= v->cap || h.ndim < 0 || h.ndim > MMC_MAX_DIMS ||
        (h.dtype != MMC_F32 && h.dtype != MMC_BF16 && h.dtype != MMC_F16) || (lora && (h.master || h.dtype != MMC_F32)))
        return mmc_error(MMC_ERR_INVALID, "tensor '%s': bad header", h.name);
    mmc_tensor *p = mmc_tensor_new((mmc_dtype)h.dtype, h.ndim, h.shape);
    char *nm = strdup(h.name);
    if (!p || !nm) { mmc_tensor_free(p); free(nm); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    v->own[v->n_own++] = p;
    v->store[v->n_store++] = nm;
    p->flags |= (uint32_t)h.flags & (MMC_PARAM | MMC_REQUIRES_GRAD);
    snprintf(p->name, sizeof p->name, "%.*s", (int)sizeof p->name - 1, nm);
    if (lora) v->lora[v->n_lora] = p, v->lora_names[v->n_lora++] = nm;
    else v->params[v->n_params] = p, v->names[v->n_params++] = nm;
    if ((st = mmc_recv(pp, p->data, (int64_t)mmc_nbytes(p), MMC_U8, s, TAG_VAL)) || !h.trained) return st;
    const int64_t k = mmc_numel(p);
    float *m = malloc((size_t)k * 4 + 1), *vv = malloc((size_t)k * 4 + 1), *ema = h.ema ? malloc((size_t)k * 4 + 1) : NULL;
    if (!m || !vv || (h.ema && !ema)) { free(m); free(vv); free(ema); return mmc_error(MMC_ERR_OOM, "out of memory"); }
    if (h.ema != (v->ema != NULL)) { free(m); free(vv); free(ema); return mmc_error(MMC_ERR_INVALID, "tensor '%s': EMA on one stage only", h.name); }
    v->own_mv[v->n_own_mv++] = m;
    v->own_mv[v->n_own_mv++] = vv;
    if (ema) v->own_mv[v->n_own_mv++] = ema;
    if ((st = mmc_recv(pp, m, k, MMC_F32, s, TAG_M)) || (st = mmc_recv(pp, vv, k, MMC_F32, s, TAG_V))) return st;
    mmc_tensor *master = p;
    if (h.master) {
        if (!(master = mmc_tensor_new(MMC_F32, h.ndim, h.shape))) return mmc_error(MMC_ERR_OOM, "out of memory");
        v->own[v->n_own++] = master;
        snprintf(master->name, sizeof master->name, "%s", p->name);
        if ((st = mmc_recv(pp, master->data, k, MMC_F32, s, TAG_MASTER))) return st;
    }
    if (ema && (st = mmc_recv(pp, ema, k, MMC_F32, s, TAG_EMA))) return st;
    if (v->ema) v->ema[v->n_opt] = ema;
    v->opt[v->n_opt] = master;
    v->opt_model[v->n_opt] = p;
    v->opt_names[v->n_opt] = nm;
    v->m[v->n_opt] = m;
    v->v[v->n_opt++] = vv;
    return MMC_OK;
}

static mmc_status recv_stage(mmc_comm *pp, int s, full_view *v) {
    int64_t n = 0, nl = 0;
    mmc_status st = mmc_recv(pp, &n, 1, MMC_I64, s, TAG_N);
    for (int64_t i = 0; i < n && !st; i++) st = recv_tensor(pp, s, v, false);
    if (!st) st = mmc_recv(pp, &nl, 1, MMC_I64, s, TAG_N);   /* the stage's LoRA adapters */
    for (int64_t i = 0; i < nl && !st; i++) st = recv_tensor(pp, s, v, true);
    return st;
}

#define SWAP(a, b) do { __typeof__(a) tmp_ = (a); (a) = (b); (b) = tmp_; } while (0)

static mmc_status save_on_rank0(mmc_trainer *t) {
    full_view v = {0};
    mmc_status st = MMC_OK;
    const int cap = 64 + 32 * (int)(t->lm->cfg.num_layers + 4) + t->n_params;   /* parameters of the whole model */
    v.params = calloc((size_t)cap, sizeof *v.params);
    v.names = calloc((size_t)cap, sizeof *v.names);
    v.opt = calloc((size_t)cap, sizeof *v.opt);
    v.opt_model = calloc((size_t)cap, sizeof *v.opt_model);
    v.opt_names = calloc((size_t)cap, sizeof *v.opt_names);
    v.m = calloc((size_t)cap, sizeof *v.m);
    v.v = calloc((size_t)cap, sizeof *v.v);
    v.store = calloc((size_t)cap, sizeof *v.store);
    v.own = calloc((size_t)(3 * cap), sizeof *v.own);
    v.own_mv = calloc((size_t)(4 * cap), sizeof *v.own_mv);
    if (t->ema) v.ema = calloc((size_t)cap, sizeof *v.ema);
    v.lora = calloc((size_t)cap, sizeof *v.lora);
    v.lora_names = calloc((size_t)cap, sizeof *v.lora_names);
    v.cap = cap;
    mmc_lora_set lv = {0};   /* every stage's adapters, for the saver (mmc_lora_save reads names and adapters) */
    if (!v.params || !v.names || !v.opt || !v.opt_model || !v.opt_names || !v.m || !v.v || !v.store || !v.own ||
        !v.own_mv || !v.lora || !v.lora_names || (t->ema && !v.ema)) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
    for (int i = 0; i < t->n_params; i++) v.params[v.n_params] = t->params[i], v.names[v.n_params++] = t->names[i];
    for (int j = 0; j < t->n_opt; j++) {
        v.opt[v.n_opt] = t->opt[j], v.opt_model[v.n_opt] = t->opt_model[j], v.opt_names[v.n_opt] = t->opt_names[j];
        if (v.ema) v.ema[v.n_opt] = t->ema[j];
        v.m[v.n_opt] = t->adamw.m[j], v.v[v.n_opt++] = t->adamw.v[j];
    }
    for (int i = 0; t->lora && i < t->lora->n_params; i++)
        v.lora[v.n_lora] = t->lora->params[i], v.lora_names[v.n_lora++] = t->lora_names[i];
    for (int s = 1; s < t->pp_size && !st; s++)   /* stage order = the model's parameter order */
        if ((st = recv_stage(t->groups.pp, s, &v))) mmc_error_prefix(st, "pipeline stage %d's part of the checkpoint", s);
    if (st) goto done;
    mmc_lora_set *own_lora = t->lora;
    if (t->lora) {   /* module names: the tensor names less ".lora_A.weight" (A and B alternate in every part) */
        lv = *t->lora;
        lv.n = v.n_lora / 2, lv.n_params = v.n_lora, lv.params = v.lora, lv.mods = NULL;
        lv.names = calloc((size_t)lv.n + 1, sizeof *lv.names);
        lv.adapters = calloc((size_t)lv.n + 1, sizeof *lv.adapters);
        if (!lv.names || !lv.adapters) { st = mmc_error(MMC_ERR_OOM, "out of memory"); goto done; }
        for (int i = 0; i < lv.n; i++) {
            const char *a = v.lora_names[2 * i];
            const size_t len = strlen(a) > 14 ? strlen(a) - 14 : 0;   /* ".lora_A.weight" */
            snprintf(lv.names[i], sizeof lv.names[i], "%.*s", (int)len, a);
            lv.adapters[i] = (mmc_lora){.A = v.lora[2 * i], .B = v.lora[2 * i + 1]};   /* (what mmc_lora_save reads) */
        }
        t->lora = &lv;
    }
    /* the single-process saver over the whole model */
    SWAP(t->params, v.params); SWAP(t->names, v.names); SWAP(t->n_params, v.n_params);
    SWAP(t->opt, v.opt); SWAP(t->opt_model, v.opt_model); SWAP(t->opt_names, v.opt_names); SWAP(t->n_opt, v.n_opt);
    SWAP(t->adamw.m, v.m); SWAP(t->adamw.v, v.v);
    SWAP(t->lora_names, v.lora_names);
    SWAP(t->ema, v.ema);
    st = mmc_trainer_save(t);
    SWAP(t->params, v.params); SWAP(t->names, v.names); SWAP(t->n_params, v.n_params);
    SWAP(t->opt, v.opt); SWAP(t->opt_model, v.opt_model); SWAP(t->opt_names, v.opt_names); SWAP(t->n_opt, v.n_opt);
    SWAP(t->adamw.m, v.m); SWAP(t->adamw.v, v.v);
    SWAP(t->lora_names, v.lora_names);
    SWAP(t->ema, v.ema);
    t->lora = own_lora;
done:
    free(lv.names);
    free(lv.adapters);
    view_free(&v);
    return st;
}

mmc_status mmc_trainer_pp_save(mmc_trainer *t) {
    mmc_status st = MMC_OK;
    if (t->epc && !t->pp_ep_full) {   /* expert parallelism: the stage's experts of every ep rank first (collective) */
        mmc_ep_swap sw;
        if ((st = mmc_ep_trainer_to_full(t, &sw))) return st;
        t->pp_ep_full = true;
        st = mmc_trainer_pp_save(t);
        t->pp_ep_full = false;
        mmc_ep_trainer_to_local(t, &sw);
        return st;
    }
    if (t->dp && t->cfg->parallel.zero >= 1 && !t->adamw.m) {   /* ZeRO: the stage's moments gathered over dp */
        mmc_adamw keep = t->adamw, full = {0};
        st = mmc_adamw_init(&full, &keep.o, t->opt, t->n_opt);
        if (!st) st = mmc_dp_gather_state(t->dp, &full);
        /* ZeRO-3: and the parameters and fp32 masters (collective), freed after */
        if (!st) st = mmc_dp_gather_stage(t->dp);
        if (!st) st = mmc_dp_gather_masters(t->dp);
        t->adamw = full;
        if (!st) st = mmc_trainer_pp_save(t);
        mmc_dp_release_masters(t->dp);
        mmc_dp_release_stage(t->dp);
        mmc_adamw_free(&t->adamw);
        t->adamw = keep;
        return st;
    }
    /* replicas hold the same weights: the first one's stages gather (with tp: its first tp rank's,
     * which holds the full tensors the caller gathered) */
    if (t->dp_rank == 0 && (!t->tpc || t->groups.tp_rank == 0))
        st = t->pp_rank == 0 ? save_on_rank0(t) : send_stage(t);
    int64_t bad = st != MMC_OK;
    mmc_status s2 = mmc_all_reduce(t->world, &bad, &bad, 1, MMC_I64, MMC_MAX);
    if (s2) return s2;
    if (bad && !st)
        st = mmc_error(MMC_ERR_IO, "checkpoint at step %lld: gathering the pipeline stages or rank 0's save failed "
                       "on another rank (see its message)", (long long)t->step);
    return st;
}
