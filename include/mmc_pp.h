/* mmc_pp.h — pipeline parallelism (GPipe's stages, Huang et al. 2019, with the 1F1B schedule of
 * PipeDream-Flush / Megatron-LM, Narayanan et al. 2021) for the Qwen2 decoder (text, and the
 * language model of Qwen2-VL / Qwen2.5-VL); a stage's model may itself be tensor-parallel
 * (mmc_tp.h: the residual stream between stages is then replicated over the tp group, and each
 * tp rank talks to its peer of the neighbouring stage).
 *
 * The decoder layers are cut into P contiguous ranges, one per stage (pipeline rank): the token
 * embedding sits on the first stage, the final norm, lm_head and the loss on the last. A stage
 * receives the residual stream [B, T, C] of a micro-batch from the stage before it, runs its
 * layers and sends the result on; in backward the gradient of that tensor travels the other way.
 * All transfers are point-to-point through the communicator (mmc_send_start / mmc_recv), never
 * MPI directly, so a GPU backend takes the same path.
 *
 * 1F1B: stage s of P runs min(P-1-s, M) warm-up forwards, then alternates one forward and one
 * backward until its M forwards are done, then the remaining backwards (cool-down). At most P-s
 * micro-batches are in flight on stage s (activation memory of P-s micro-batches instead of
 * GPipe's M), and with equal forward and backward times per stage the idle ("bubble") share of
 * a step is (P-1)/(M+P-1). Backwards run in micro-batch order, so each parameter's gradient is
 * accumulated in the same order as one process with gradient accumulation: the stage's
 * gradients equal the single-process ones bit for bit (tied embeddings aside, whose two halves
 * are summed once at the end, as Megatron all-reduces the embedding group).
 *
 * DualPipeV (mmc_pp_schedule_dualpipev, parallel.pipeline_schedule: dualpipev): two chunks per
 * rank in a V, some backwards split into input- and weight-gradient halves; each chunk's halves
 * still accumulate in micro-batch order, so it too reproduces one process bit for bit.
 *
 * Qwen2-VL / Qwen2.5-VL: the vision tower and merger sit on the first stage with the embedding.
 *
 * Tied embeddings (tie_word_embeddings): the first stage holds embed_tokens, the last stage a
 * copy used as lm_head; after the micro-batches the two gradients are summed between the two
 * stages, so both copies take the same AdamW step and stay equal. */
#ifndef MMC_PP_H
#define MMC_PP_H

#include "mmc.h"
#include "mmc_lora.h"
#include "mmc_models.h"
#include "mmc_data.h"
#include "mmc_parallel.h"
#include "mmc_vl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- schedule */
typedef enum {
    MMC_PP_FORWARD = 0,
    MMC_PP_BACKWARD = 1,         /* the whole backward (input and weight gradients) */
    MMC_PP_BACKWARD_INPUT = 2,   /* DualPipeV "B": the input gradient only; the weight half is queued */
    MMC_PP_WEIGHT = 3,           /* DualPipeV "W": the queued weight half of (chunk, mb) */
} mmc_pp_kind;
typedef struct {
    int kind;   /* mmc_pp_kind */
    int mb;     /* micro-batch, 0-based */
    int chunk;  /* interleaved: the rank's model chunk (virtual stage chunk P + stage); DualPipeV:
                 * 0 (virtual stage `stage`) or 1 (virtual stage 2 P - 1 - stage); else 0 */
} mmc_pp_op;

/* The 1F1B order of stage `stage` (0-based) of P over M micro-batches: 2 M operations written
 * to ops (capacity 2 M); returns how many (2 M), or -1 on bad arguments. */
int mmc_pp_schedule_1f1b(int P, int stage, int M, mmc_pp_op *ops);
/* The same with v model chunks per rank (interleaved 1F1B, Narayanan et al. 2021 sec. 2.2, as
 * Megatron's forward_backward_pipelining_with_interleaving orders it: chunk c of rank s is
 * virtual stage c P + s; groups of P micro-batches go through chunk 0, then chunk 1, ...):
 * 2 M v operations; v = 1 is plain 1F1B. Interleaving needs P >= 2 and M a multiple of P
 * (else -1). */
int mmc_pp_schedule(int P, int v, int stage, int M, mmc_pp_op *ops);
/* DualPipeV (DeepSeek-V3's DualPipe in its "V" form, with zero-bubble's split backward): the
 * 2 P virtual stages fold into a V over the P ranks: rank r holds chunk 0 = virtual stage r and
 * chunk 1 = virtual stage 2 P - 1 - r, so micro-batches enter at rank 0, go down the ranks through
 * the chunks 0, turn on rank P - 1 (a local hand-off) and come back up through the chunks 1 to the
 * loss on rank 0. A rank's order (pp.c has the eight phases) runs a forward of one chunk next to
 * a backward of the other in the steady state, and splits some backwards into the input gradient
 * (MMC_PP_BACKWARD_INPUT, what the previous stage waits for) and the weight gradient
 * (MMC_PP_WEIGHT, run later to fill an idle slot). Writes at most 6 M operations (4 M forwards and
 * backwards plus one W per split backward); returns how many, or -1 if P < 2 or M < 2 P (the
 * schedule's warm-up alone needs 2 P micro-batches). Each chunk's backwards and W's keep
 * micro-batch order. */
int mmc_pp_schedule_dualpipev(int P, int stage, int M, mmc_pp_op *ops);
/* The virtual stage of chunk 0 / 1 of that rank: stage, 2 P - 1 - stage. */
int mmc_pp_dualpipev_vstage(int P, int stage, int chunk);
/* DualPipeV in simulated time. tf, tb, tw: a rank's forward, input-gradient and weight-gradient
 * time per micro-batch over all its layers (each chunk takes half), so the same model at the
 * same P runs 1F1B as mmc_pp_simulate(P, M, tf, tb + tw). Transfers are free and a forward next
 * to a backward runs one after the other (no overlap credit). Returns the makespan and, in
 * *bubble, the idle share 1 - busy / (P makespan); -1 on bad arguments or deadlock. */
double mmc_pp_simulate_dualpipev(int P, int M, double tf, double tb, double tw, double *bubble);
/* Largest number of micro-batches in flight (forward done, backward not) on that stage. */
int mmc_pp_max_in_flight(int P, int stage, int M);
/* The analytic bubble share of a 1F1B (or GPipe) step with equal stage times: (P-1)/(M+P-1). */
double mmc_pp_bubble_fraction(int P, int M);
/* Interleaved: each chunk's share of a micro-batch's time is 1/v, so (P-1)/(v M + P - 1). */
double mmc_pp_bubble_fraction_v(int P, int v, int M);
/* Run the P stages' schedules against each other in simulated time (forward tf, backward tb per
 * micro-batch per stage, transfers free): each operation starts when its stage is free and its
 * input has arrived. Returns the step's makespan and, in *bubble, the idle share of the stages'
 * time (1 - busy / (P * makespan)); -1 if the schedules deadlock. */
double mmc_pp_simulate(int P, int M, double tf, double tb, double *bubble);
/* The same for v chunks per rank (tf, tb: a rank's whole forward / backward of a micro-batch;
 * a chunk takes 1/v of it). */
double mmc_pp_simulate_v(int P, int v, int M, double tf, double tb, double *bubble);

/* ---------------------------------------------------------------- stages */
/* Cut n_layers decoder layers into P stages: bounds[0 .. P] with stage s holding layers
 * [bounds[s], bounds[s+1]). sizes (n_sizes == P) gives each stage's count explicitly
 * (parallel.pipeline_layers); without it the layers are split evenly, which needs P to divide
 * n_layers. Errors name the sizes and say what would do (no stage may be empty). */
mmc_status mmc_pp_split_layers(int64_t n_layers, int P, const int64_t *sizes, int n_sizes, int64_t *bounds);
/* Contiguous stages from measured costs (parallel.pipeline_layers: auto): cut n layers (cost[i]:
 * layer i's forward + backward seconds) into ns ranges of at least one layer each, stage k costing
 * its layers plus extra[k] (NULL: none; the embedding, vision tower, lm_head and loss), so that the
 * slowest stage is as fast as it can be (exact: a dynamic program over the prefix sums); among the
 * splits that reach it, the one with the smallest sum of squared stage costs (the most even); ties
 * give the later stages the extra layers (5 equal layers in 2 stages: 2 | 3). Equal costs without
 * extras give the even
 * split when ns divides n. bounds[0 .. ns]: stage k holds [bounds[k], bounds[k+1]); stage_cost[ns]
 * (NULL: not wanted). Errors: ns > n (a stage would be empty), a negative or non-finite cost. */
mmc_status mmc_pp_partition(const double *cost, int64_t n, int ns, const double *extra, int64_t *bounds,
                            double *stage_cost);
/* The trainer's and the planner's automatic split of a layout (mmc_pp_partition over its virtual
 * stages): P ranks, v chunks per rank (interleaved: chunk c of rank s is virtual stage c P + s),
 * dualpipev (2 chunks, virtual stages s and 2P-1-s on rank s), vision_stage (stage 0 holds the
 * vision tower, merger and embedding alone: the layers split over stages 1 .. P-1). `first` is
 * what the first virtual stage runs besides its layers (embedding; the tower when it is not a
 * stage of its own), `last` the last one's (final norm, lm_head, loss), `vision` the tower's cost
 * on a stage of its own. Writes bounds[0 .. nst] (nst = P v, 2P with dualpipev; with vision_stage
 * bounds[0] = bounds[1] = 0) and each virtual stage's modelled seconds stage_cost[nst]. When an
 * even split exists and its slowest stage is within `keep_even` (e.g. 0.03: 3 %) of the best
 * split's, the even split is kept (*even = true): a difference that small is measurement noise. */
mmc_status mmc_pp_auto_split(const double *cost, int64_t n, int P, int v, bool dualpipev, bool vision_stage,
                             double first, double last, double vision, double keep_even, int64_t *bounds,
                             double *stage_cost, bool *even);
/* Keep only stage `stage`'s part of a text Qwen2 (layers [l0, l1), embed_tokens on the first
 * stage, norm and lm_head on the last, and with tied embeddings the embedding on the last stage
 * too, as its lm_head): every other parameter is freed and leaves m->params. */
mmc_status mmc_pp_trim_qwen2(mmc_qwen2 *m, int stage, int P, int64_t l0, int64_t l1);
/* The same for a rank holding nc chunks of layers [l0[c], l1[c]) (interleaved stages). */
mmc_status mmc_pp_trim_qwen2_chunks(mmc_qwen2 *m, int stage, int P, int nc, const int64_t *l0, const int64_t *l1);
/* Qwen2-VL: the language model as above, the vision tower (and merger) on the first stage only. */
mmc_status mmc_pp_trim_qwen2_vl(mmc_qwen2_vl *m, int stage, int P, int nc, const int64_t *l0, const int64_t *l1);
/* The same two with the final norm and lm_head (and the tied embedding's copy) on rank
 * `last_rank` instead of P - 1 (DualPipeV: rank 0 holds the last virtual stage). */
mmc_status mmc_pp_trim_qwen2_at(mmc_qwen2 *m, int stage, int last_rank, int nc, const int64_t *l0, const int64_t *l1);
mmc_status mmc_pp_trim_qwen2_vl_at(mmc_qwen2_vl *m, int stage, int last_rank, int nc, const int64_t *l0,
                                   const int64_t *l1);
/* LoRA adapters attached to the whole model before it was trimmed: keep this stage's (its decoder
 * layers' by the module names' "layers.N."; the vision tower's on the first stage; any other,
 * e.g. lm_head, on last_rank). Their initial values and dropout streams are the whole model's. */
mmc_status mmc_pp_trim_lora(mmc_lora_set *s, int stage, int last_rank, int nc, const int64_t *l0, const int64_t *l1);
/* The same, with tower_everywhere: Qwen2-VL's tower adapters ("visual.") kept on every stage (the
 * per-modality plan under pp: the tower data-parallel over all ranks, trainer_pp_hetero.c). */
mmc_status mmc_pp_trim_lora_ex(mmc_lora_set *s, int stage, int last_rank, int nc, const int64_t *l0, const int64_t *l1,
                               bool tower_everywhere);

/* ---------------------------------------------------------------- the runtime */
typedef struct mmc_pp mmc_pp;
/* pp: the pipeline group (its rank is the stage); m: the trimmed stage model. */
mmc_status mmc_pp_new(mmc_comm *pp, mmc_qwen2 *m, int64_t l0, int64_t l1, mmc_pp **out);
/* Interleaved: this rank's v chunks, chunk c holding layers [l0[c], l1[c]) (virtual stage c P + stage). */
mmc_status mmc_pp_new_v(mmc_comm *pp, mmc_qwen2 *m, int v, const int64_t *l0, const int64_t *l1, mmc_pp **out);
/* DualPipeV: chunk c holds layers [l0[c], l1[c]), c = 0, 1 (virtual stages stage, 2 P - 1 - stage);
 * mmc_pp_run then follows mmc_pp_schedule_dualpipev (needs P >= 2 and M >= 2 P). */
mmc_status mmc_pp_new_dualpipev(mmc_comm *pp, mmc_qwen2 *m, const int64_t *l0, const int64_t *l1, mmc_pp **out);
void mmc_pp_free(mmc_pp *p);
/* Run a Qwen2-VL (m of mmc_pp_new is vl->lm): the first stage runs the vision tower and places
 * its features in the embeddings; every stage computes the M-RoPE positions from the batch. */
void mmc_pp_set_vl(mmc_pp *p, mmc_qwen2_vl *vl);
/* LLaVA / InternVL: the first stage's input embeddings [B, T, C] of micro-batch b come from fn (the
 * tower, projector and splice, in ctx), every stage's RoPE from 1-D positions that restart at each
 * packed segment (mmc_embeds_positions, mmc_embeds_attn). */
typedef mmc_status (*mmc_pp_embeds_fn)(void *arg, mmc_ctx *ctx, const mmc_batch *b, mmc_tensor **x);
void mmc_pp_set_embeds(mmc_pp *p, mmc_pp_embeds_fn fn, void *arg);
int mmc_pp_stage(const mmc_pp *p);
int mmc_pp_stages(const mmc_pp *p);
/* One step's forwards and backwards over micro-batches mbs[0 .. M) in 1F1B order; each
 * micro-batch's loss is its summed token loss times scale (the trainer's 1 / label tokens of
 * the global batch), gradients accumulate into the stage's parameters. On the last stage
 * *loss is the sum of the micro-batches' scaled losses, elsewhere 0. Collective over pp. */
mmc_status mmc_pp_run(mmc_pp *p, const mmc_batch *mbs, int M, double scale, double *loss);
/* Forward only (an evaluation): one batch through every stage, no gradients, no dropout; the
 * batch's summed token NLL and its label-token count, the same on every rank of the group. */
mmc_status mmc_pp_eval(mmc_pp *p, const mmc_batch *b, double *nll, int64_t *tokens);
/* With tied embeddings: sum the embedding's gradient between the first and the last stage
 * (g: the stage's copy, NULL on the stages between; count elements). Collective over pp. */
mmc_status mmc_pp_tied_reduce(mmc_pp *p, float *g, int64_t count);
/* Post each receive a few ops before the op that needs it (on, the default) or when the op runs
 * (off: the blocking receives of before; for comparison). The same messages either way. */
void mmc_pp_set_early_recv(mmc_pp *p, bool on);
/* LoRA dropout: the forward of micro-batch k of this step draws its masks from
 * mmc_nn_dropout_seed(seed, step, k), as the single-process trainer's k-th micro-batch does. */
void mmc_pp_set_dropout(mmc_pp *p, bool on, uint64_t seed, uint64_t step);
/* Communication of the last mmc_pp_run: bytes sent and seconds blocked in receives. */
void mmc_pp_last_stats(const mmc_pp *p, int64_t *bytes_sent, double *recv_wait_s);

#ifdef __cplusplus
}
#endif
#endif
