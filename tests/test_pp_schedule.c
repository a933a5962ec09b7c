/* test_pp_schedule.c — pipeline parallelism (mmc_pp.h) without MPI: the 1F1B order for P = 2 and 4
 * against the expected sequences (and its invariants for P <= 8, M <= 16), the schedule run
 * in simulated time (no deadlock; bubble share (P-1)/(M+P-1), to 1e-12, for equal and for
 * 1:2 forward:backward costs), the layer split and its errors, the automatic split from per-layer
 * costs (mmc_pp_partition: exact minimax against brute force, no empty stage; mmc_pp_auto_split's
 * interleaved, DualPipeV and vision-stage layouts, the even split kept within its margin), trimming a Qwen2 to a stage,
 * and the runtime on one stage (P = 1, the single-process communicator): its loss and every
 * gradient equal the plain forward/backward with gradient accumulation exactly.
 *
 * DualPipeV: the order of P = 2 against the expected sequence, its invariants for P <= 8 and
 * 2P <= M <= 24 (every F, B and W once, each chunk's backwards and W's in micro-batch order, a W
 * after its B), no deadlock in simulated time and a bubble below 1F1B's for the same P and M;
 * the autograd's split backward (input halves, then the queued weight halves) against the
 * plain backward of the tiny Qwen2: bit-identical gradients.
 *
 *   test_pp_schedule                the unit tests above
 *   test_pp_schedule compare A B ...    (for test_pp.sh) two `mmc train` output directories: losses
 *                                   of metrics.jsonl, the last checkpoint's model.safetensors and
 *                                   optimizer.safetensors; tolerances LOSS_REL W_ABS W_MEAN MOM_REL
 *                                   (0 0 0 0 = bit-identical); prints the measured figures.
 *   test_pp_schedule bubble P M     (for bench/bench_pp.sh) the simulated bubble of DualPipeV and
 *                                   of 1F1B over P stages and M micro-batches, F:B:W = 1:1:1. */
#include "test_util.h"
#include "mmc_pp.h"
#include "mmc_models.h"
#include "mmc_trainer.h"
#include "mmc_io.h"
#include "mmc_wgrad.h"
#include "run_dir.h"

#include <dirent.h>
#include <math.h>
#include <unistd.h>

static void seq_str(int P, int s, int M, char *buf, size_t cap) {
    mmc_pp_op ops[64];
    int n = mmc_pp_schedule_1f1b(P, s, M, ops);
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%c%d", i ? " " : "", ops[i].kind == MMC_PP_FORWARD ? 'F' : 'B', ops[i].mb);
    }
}

static void test_schedule(void) {
    static const struct { int P, s, M; const char *want; } cases[] = {
        {2, 0, 4, "F0 F1 B0 F2 B1 F3 B2 B3"},
        {2, 1, 4, "F0 B0 F1 B1 F2 B2 F3 B3"},
        {4, 0, 4, "F0 F1 F2 F3 B0 B1 B2 B3"},
        {4, 1, 4, "F0 F1 F2 B0 F3 B1 B2 B3"},
        {4, 2, 4, "F0 F1 B0 F2 B1 F3 B2 B3"},
        {4, 3, 4, "F0 B0 F1 B1 F2 B2 F3 B3"},
        {4, 0, 8, "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"},
        {4, 0, 2, "F0 F1 B0 B1"},   /* fewer micro-batches than stages: warm-up is cut short */
        {4, 3, 2, "F0 B0 F1 B1"},
    };
    char buf[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        seq_str(cases[i].P, cases[i].s, cases[i].M, buf, sizeof buf);
        CHECKF(!strcmp(buf, cases[i].want), "P=%d stage %d M=%d: %s, expected %s", cases[i].P, cases[i].s,
               cases[i].M, buf, cases[i].want);
    }
    /* invariants: each micro-batch forward once, backward once after it, backwards in order, at
     * most P - s in flight (the stage's contexts), as mmc_pp_max_in_flight says */
    mmc_pp_op ops[64];
    int bad = 0;
    for (int P = 1; P <= 8; P++)
        for (int M = 1; M <= 16; M++)
            for (int s = 0; s < P; s++) {
                int n = mmc_pp_schedule_1f1b(P, s, M, ops), fdone = 0, bdone = 0, fly = 0, maxfly = 0;
                bool ok = n == 2 * M;
                for (int i = 0; ok && i < n; i++) {
                    if (ops[i].kind == MMC_PP_FORWARD) ok = ops[i].mb == fdone++, fly++;
                    else ok = ops[i].mb == bdone++ && bdone <= fdone, fly--;
                    maxfly = fly > maxfly ? fly : maxfly;
                }
                ok = ok && fdone == M && bdone == M && maxfly <= P - s && maxfly == mmc_pp_max_in_flight(P, s, M);
                if (!ok && bad++ < 3) fprintf(stderr, "1F1B invariant broken at P=%d stage %d M=%d\n", P, s, M);
            }
    CHECK(bad == 0);
    CHECK(mmc_pp_schedule_1f1b(2, 2, 4, ops) == -1);   /* no stage 2 of 2 */
    CHECK(mmc_pp_schedule_1f1b(2, 0, 0, ops) == -1);
}

static void seq_str_v(int P, int v, int s, int M, char *buf, size_t cap) {
    mmc_pp_op ops[128];
    int n = mmc_pp_schedule(P, v, s, M, ops);
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%c%dc%d", i ? " " : "", ops[i].kind == MMC_PP_FORWARD ? 'F' : 'B', ops[i].mb,
                 ops[i].chunk);
    }
}

/* interleaved 1F1B (v chunks per rank): the order Megatron's schedule gives for P = 2, v = 2,
 * M = 4 ("F<mb>c<chunk>"), and the invariants: every (micro-batch, chunk) forward once then
 * backward once, each chunk's micro-batches in order */
static void test_schedule_interleaved(void) {
    char buf[512];
    seq_str_v(2, 2, 0, 4, buf, sizeof buf);
    CHECKF(!strcmp(buf, "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0"), "rank 0: %s",
           buf);
    seq_str_v(2, 2, 1, 4, buf, sizeof buf);
    CHECKF(!strcmp(buf, "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0"), "rank 1: %s",
           buf);
    seq_str_v(3, 1, 0, 4, buf, sizeof buf);
    CHECK(!strcmp(buf, "F0c0 F1c0 F2c0 B0c0 F3c0 B1c0 B2c0 B3c0"));   /* v = 1: plain 1F1B */
    mmc_pp_op ops[2 * 16 * 4];
    CHECK(mmc_pp_schedule(2, 2, 0, 3, ops) == -1);   /* M not a multiple of P */
    CHECK(mmc_pp_schedule(1, 2, 0, 4, ops) == -1);   /* one stage cannot interleave */
    int bad = 0;
    for (int P = 2; P <= 4; P++)
        for (int v = 2; v <= 4; v++)
            for (int M = P; M <= 16; M += P)
                for (int s = 0; s < P; s++) {
                    int n = mmc_pp_schedule(P, v, s, M, ops), fnext[4] = {0}, bnext[4] = {0};
                    bool ok = n == 2 * M * v;
                    for (int i = 0; ok && i < n; i++) {
                        const int c = ops[i].chunk;
                        ok = c >= 0 && c < v;
                        if (ok && ops[i].kind == MMC_PP_FORWARD) ok = ops[i].mb == fnext[c]++;
                        else if (ok) ok = ops[i].mb == bnext[c]++ && bnext[c] <= fnext[c];
                    }
                    for (int c = 0; ok && c < v; c++) ok = fnext[c] == M && bnext[c] == M;
                    if (!ok && bad++ < 3) fprintf(stderr, "interleaved invariant broken at P=%d v=%d M=%d rank %d\n", P, v, M, s);
                }
    CHECK(bad == 0);
}

static void seq_str_dpv(int P, int s, int M, char *buf, size_t cap) {
    mmc_pp_op ops[6 * 24];
    int n = mmc_pp_schedule_dualpipev(P, s, M, ops);
    size_t u = 0;
    buf[0] = 0;
    for (int i = 0; i < n && u + 8 < cap; i++)
        u += (size_t)snprintf(buf + u, cap - u, "%s%c%d.%d", i ? " " : "", "FBbW"[ops[i].kind], ops[i].chunk, ops[i].mb);
}

static void test_schedule_dualpipev(void) {
    char got[2048];
    /* P = 2, M = 4: F chunk.mb, B full backward, b input half only, W its weight half */
    seq_str_dpv(2, 0, 4, got, sizeof got);
    CHECKF(!strcmp(got, "F0.0 F0.1 F0.2 F1.0 b1.0 W1.0 F1.1 F0.3 B1.1 F1.2 B0.0 B1.2 F1.3 B0.1 B1.3 b0.2 W0.2 b0.3 "
                        "W0.3"), "rank 0: %s", got);
    seq_str_dpv(2, 1, 4, got, sizeof got);
    CHECKF(!strcmp(got, "F0.0 F1.0 F0.1 F1.1 F0.2 B1.0 F1.2 B0.0 F0.3 B1.1 F1.3 B0.1 B1.2 B0.2 b1.3 b0.3 W1.3 W0.3"),
           "rank 1: %s", got);
    mmc_pp_op ops[6 * 24];
    CHECK(mmc_pp_schedule_dualpipev(2, 0, 3, ops) == -1);   /* fewer than 2 P micro-batches */
    CHECK(mmc_pp_schedule_dualpipev(1, 0, 4, ops) == -1);   /* one rank: no V */
    int bad = 0;
    for (int P = 2; P <= 8; P++)
        for (int M = 2 * P; M <= 24; M++)
            for (int s = 0; s < P; s++) {
                const int n = mmc_pp_schedule_dualpipev(P, s, M, ops);
                int f[2] = {0}, b[2] = {0}, w[2] = {0}, split[2][24] = {{0}}, nsplit = 0;
                bool ok = n >= 4 * M && n <= 6 * M;
                for (int i = 0; ok && i < n; i++) {
                    const mmc_pp_op o = ops[i];
                    const int c = o.chunk;
                    ok = c == 0 || c == 1;
                    if (ok && o.kind == MMC_PP_FORWARD) ok = o.mb == f[c]++;
                    else if (ok && o.kind == MMC_PP_WEIGHT) ok = split[c][o.mb] == 1 && (split[c][o.mb] = 2) && o.mb >= w[c] && (w[c] = o.mb + 1);
                    else if (ok) {
                        ok = o.mb == b[c]++ && b[c] <= f[c];
                        if (ok && o.kind == MMC_PP_BACKWARD_INPUT) split[c][o.mb] = 1, nsplit++;
                        /* a full backward never overtakes a queued weight half of its chunk */
                        for (int k = 0; ok && o.kind == MMC_PP_BACKWARD && k < o.mb; k++) ok = split[c][k] != 1;
                    }
                }
                for (int c = 0; ok && c < 2; c++) {
                    ok = f[c] == M && b[c] == M;
                    for (int k = 0; ok && k < M; k++) ok = split[c][k] != 1;   /* every queued half ran */
                }
                ok = ok && n == 4 * M + nsplit;
                if (!ok && bad++ < 3) fprintf(stderr, "DualPipeV invariant broken at P=%d M=%d rank %d\n", P, M, s);
            }
    CHECK(bad == 0);
    CHECK(mmc_pp_dualpipev_vstage(4, 1, 0) == 1 && mmc_pp_dualpipev_vstage(4, 1, 1) == 6);
}

static void test_simulate(void) {
    printf("1F1B bubble (simulated, forward:backward 1:2 | analytic (P-1)/(M+P-1)):");
    for (int P = 2; P <= 4; P += 2)
        for (int M = 1; M <= 16; M *= 2) {
            for (int r = 1; r <= 2; r++) {
                double bubble, span = mmc_pp_simulate(P, M, 1.0, (double)r, &bubble);
                CHECKF(span > 0, "P=%d M=%d deadlocks", P, M);
                CHECK_NEAR(span, (double)(M + P - 1) * (1.0 + r), 1e-12);
                CHECK_NEAR(bubble, mmc_pp_bubble_fraction(P, M), 1e-12);
                if (r == 2 && (M == 4 || M == 8 || M == 16)) printf(" P=%d M=%d %.1f%% | %.1f%%;", P, M, 100 * bubble,
                                                                    100 * mmc_pp_bubble_fraction(P, M));
            }
        }
    printf("\n");
    CHECK_NEAR(mmc_pp_bubble_fraction(4, 8), 3.0 / 11.0, 1e-15);
    /* interleaved: no deadlock, and the bubble shrinks by v (to (P-1)/(v M + P - 1)) */
    printf("interleaved 1F1B bubble (simulated, 1:2 | analytic (P-1)/(vM+P-1)):");
    for (int P = 2; P <= 4; P += 2)
        for (int v = 2; v <= 4; v += 2)
            for (int M = P; M <= 16; M *= 2) {
                double bubble, span = mmc_pp_simulate_v(P, v, M, 1.0, 2.0, &bubble);
                CHECKF(span > 0, "interleaved P=%d v=%d M=%d deadlocks", P, v, M);
                CHECKF(fabs(bubble - mmc_pp_bubble_fraction_v(P, v, M)) < 1e-12, "P=%d v=%d M=%d: bubble %.6f, "
                       "expected %.6f", P, v, M, bubble, mmc_pp_bubble_fraction_v(P, v, M));
                if (M == 8) printf(" P=%d v=%d M=%d %.1f%% | %.1f%%;", P, v, M, 100 * bubble,
                                   100 * mmc_pp_bubble_fraction_v(P, v, M));
            }
    printf("\n");
    /* DualPipeV: no deadlock and a smaller bubble than 1F1B's over the same P and M (forward,
     * input and weight gradient 1 : 1 : 1, so 1F1B's backward is 2) */
    printf("DualPipeV bubble (simulated, F:B:W 1:1:1 | 1F1B):");
    for (int P = 2; P <= 8; P *= 2)
        for (int M = 2 * P; M <= 32; M *= 2) {
            double bd, b1;
            const double span = mmc_pp_simulate_dualpipev(P, M, 1.0, 1.0, 1.0, &bd);
            CHECKF(span > 0, "DualPipeV P=%d M=%d deadlocks", P, M);
            CHECK(mmc_pp_simulate(P, M, 1.0, 2.0, &b1) > 0);
            CHECKF(bd >= 0 && bd < b1, "P=%d M=%d: DualPipeV bubble %.4f not below 1F1B's %.4f", P, M, bd, b1);
            CHECK(span >= M * 3.0 - 1e-9);   /* never shorter than a rank's own work */
            printf(" P=%d M=%d %.1f%% | %.1f%%;", P, M, 100 * bd, 100 * b1);
        }
    printf("\n");
    double b;
    CHECK(mmc_pp_simulate_dualpipev(4, 7, 1, 1, 1, &b) == -1);   /* M < 2 P */
    CHECK(mmc_pp_simulate(1, 3, 1, 2, &b) > 0 && b == 0);   /* one stage: no bubble */
}

static void test_split(void) {
    int64_t bd[9];
    CHECK_OK(mmc_pp_split_layers(8, 4, NULL, 0, bd));
    CHECK(bd[0] == 0 && bd[1] == 2 && bd[2] == 4 && bd[3] == 6 && bd[4] == 8);
    CHECK_OK(mmc_pp_split_layers(8, 2, (const int64_t[]){3, 5}, 2, bd));
    CHECK(bd[0] == 0 && bd[1] == 3 && bd[2] == 8);
    CHECK_ERR(mmc_pp_split_layers(6, 4, NULL, 0, bd), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "does not divide the model's 6 decoder layers") &&
          strstr(mmc_last_error(), "pipeline_layers"));
    CHECK_ERR(mmc_pp_split_layers(2, 3, NULL, 0, bd), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "a stage would be empty"));
    CHECK_ERR(mmc_pp_split_layers(4, 2, (const int64_t[]){4, 0}, 2, bd), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "stage 1 gets 0 layers"));
    CHECK_ERR(mmc_pp_split_layers(4, 2, (const int64_t[]){1, 2}, 2, bd), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "adds up to 3 layers but the model has 4"));
    CHECK_ERR(mmc_pp_split_layers(4, 2, (const int64_t[]){1, 1, 2}, 3, bd), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "3 entries but pipeline_parallel is 2"));
}

/* the automatic split (parallel.pipeline_layers: auto): exact minimax over contiguous ranges, no empty
 * stage, ties to the most even split and then to the later stages */
static bool bounds_are(const int64_t *bd, int n, const int64_t *want) {
    for (int i = 0; i <= n; i++)
        if (bd[i] != want[i]) return false;
    return true;
}

static void test_partition(void) {
    int64_t bd[17];
    double sc[16];
    const double one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_OK(mmc_pp_partition(one, 8, 4, NULL, bd, sc));   /* equal costs: the even split */
    CHECK(bounds_are(bd, 4, (const int64_t[]){0, 2, 4, 6, 8}) && sc[0] == 2 && sc[3] == 2);
    CHECK_OK(mmc_pp_partition(one, 8, 8, NULL, bd, NULL));
    CHECK(bounds_are(bd, 8, (const int64_t[]){0, 1, 2, 3, 4, 5, 6, 7, 8}));
    CHECK_OK(mmc_pp_partition(one, 5, 2, NULL, bd, NULL));   /* a tie: the later stage takes the extra layer */
    CHECK(bounds_are(bd, 2, (const int64_t[]){0, 2, 5}));
    /* the last stage's lm_head + loss worth 2.5 layers: 5 | 3 (5 and 5.5; 4 | 4 would be 6.5) */
    CHECK_OK(mmc_pp_partition(one, 8, 2, (const double[]){0, 2.5}, bd, sc));
    CHECK(bounds_are(bd, 2, (const int64_t[]){0, 5, 8}) && sc[0] == 5 && sc[1] == 5.5);
    /* a heavy first stage (the vision tower, 4 layers' worth): one layer there, the rest as even as it goes */
    CHECK_OK(mmc_pp_partition(one, 8, 4, (const double[]){4, 0, 0, 0}, bd, sc));
    CHECK(bounds_are(bd, 4, (const int64_t[]){0, 1, 3, 5, 8}) && sc[0] == 5);
    /* a MoE model whose sparse layers (every second: decoder_sparse_step 2) cost 3x a dense one */
    const double moe[8] = {1, 3, 1, 3, 1, 3, 1, 3};
    CHECK_OK(mmc_pp_partition(moe, 8, 2, NULL, bd, NULL));
    CHECK(bounds_are(bd, 2, (const int64_t[]){0, 4, 8}));
    CHECK_OK(mmc_pp_partition(moe, 8, 2, (const double[]){0, 2}, bd, sc));   /* + the head: 9 | 9 */
    CHECK(bounds_are(bd, 2, (const int64_t[]){0, 5, 8}) && sc[0] == 9 && sc[1] == 9);
    /* a very heavy layer alone on its stage, the others around it */
    CHECK_OK(mmc_pp_partition((const double[]){1, 1, 10, 1, 1, 1}, 6, 3, NULL, bd, sc));
    CHECK(sc[1] == 10 && bd[1] == 2 && bd[2] == 3);
    /* no stage empty; bad costs */
    CHECK_ERR(mmc_pp_partition(one, 3, 4, NULL, bd, NULL), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "a stage would be empty"));
    CHECK_ERR(mmc_pp_partition((const double[]){1, -1}, 2, 2, NULL, bd, NULL), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "layer 1's cost"));
    /* every split of random costs into every stage count: a range each, at least one layer, and no
     * contiguous split with a faster slowest stage (brute force over all cut points for n <= 9) */
    uint32_t seed = 7;
    for (int n = 1; n <= 9; n++)
        for (int ns = 1; ns <= n; ns++) {
            double c[9], ex[9] = {0};
            for (int i = 0; i < n; i++) seed = seed * 1664525u + 1013904223u, c[i] = 0.5 + (seed >> 8) % 100 / 50.0;
            ex[ns - 1] = 1.5;
            CHECK_OK(mmc_pp_partition(c, n, ns, ex, bd, sc));
            double worst = 0;
            for (int k = 0; k < ns; k++) {
                CHECK(bd[k + 1] > bd[k]);
                worst = sc[k] > worst ? sc[k] : worst;
            }
            CHECK(bd[0] == 0 && bd[ns] == n);
            double best = 1e30;   /* brute force: cut masks with ns - 1 cuts among n - 1 places */
            for (uint32_t mask = 0; mask < (1u << (n - 1)); mask++) {
                if (__builtin_popcount(mask) != ns - 1) continue;
                double w = 0, s = 0;
                int k = 0;
                for (int i = 0; i < n; i++) {
                    s += c[i];
                    if (i == n - 1 || (mask >> i & 1)) {
                        s += ex[k++];
                        w = s > w ? s : w;
                        s = 0;
                    }
                }
                best = w < best ? w : best;
            }
            CHECK(fabs(worst - best) < 1e-9);
        }

    /* layouts (mmc_pp_auto_split): interleaved, DualPipeV, the vision stage, the even split kept */
    bool even = true;
    CHECK_OK(mmc_pp_auto_split(one, 8, 2, 2, false, false, 0, 2, 0, 0.03, bd, sc, &even));   /* 4 virtual stages */
    CHECK(bounds_are(bd, 4, (const int64_t[]){0, 2, 4, 7, 8}) && !even && sc[3] == 3);
    CHECK_OK(mmc_pp_auto_split(one, 8, 2, 2, true, false, 0, 2, 0, 0.03, bd, sc, &even));    /* DualPipeV: the same V order */
    CHECK(bounds_are(bd, 4, (const int64_t[]){0, 2, 4, 7, 8}) && !even);
    CHECK_OK(mmc_pp_auto_split(one, 8, 4, 2, true, false, 0, 0, 0, 0.03, bd, sc, &even));    /* 8 virtual stages, 1 each */
    CHECK(bounds_are(bd, 8, (const int64_t[]){0, 1, 2, 3, 4, 5, 6, 7, 8}) && even);
    CHECK_OK(mmc_pp_auto_split(one, 4, 3, 1, false, true, 0.5, 1, 5, 0.03, bd, sc, &even));    /* tower | 2 | 2 */
    CHECK(bounds_are(bd, 3, (const int64_t[]){0, 0, 2, 4}) && sc[0] == 5.5 && sc[2] == 3);
    CHECK_OK(mmc_pp_auto_split(one, 4, 3, 1, false, true, 0, 3, 5, 0.03, bd, sc, &even));      /* tower | 3 | 1 */
    CHECK(bounds_are(bd, 3, (const int64_t[]){0, 0, 3, 4}) && !even);
    /* best 5 | 3 (5, 4.1) against the even 4 | 4 (4, 5.1): 2 % apart, the even split kept; at 1 % not */
    CHECK_OK(mmc_pp_auto_split(one, 8, 2, 1, false, false, 0, 1.1, 0, 0.03, bd, sc, &even));
    CHECK(bounds_are(bd, 2, (const int64_t[]){0, 4, 8}) && even && fabs(sc[1] - 5.1) < 1e-12);
    CHECK_OK(mmc_pp_auto_split(one, 8, 2, 1, false, false, 0, 1.1, 0, 0.01, bd, sc, &even));
    CHECK(bounds_are(bd, 2, (const int64_t[]){0, 5, 8}) && !even);
    CHECK_OK(mmc_pp_auto_split(one, 7, 2, 1, false, false, 0, 0, 0, 0.03, bd, sc, &even));   /* 7 layers: no even split */
    CHECK(bounds_are(bd, 2, (const int64_t[]){0, 3, 7}) && !even);
    CHECK_ERR(mmc_pp_auto_split(one, 3, 2, 2, false, false, 0, 0, 0, 0.03, bd, sc, &even), MMC_ERR_INVALID);
}

static mmc_qwen2_config tiny_cfg(int layers, bool tied) {
    mmc_qwen2_config c = {.vocab_size = 64, .hidden_size = 32, .intermediate_size = 48, .num_layers = layers,
                          .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .max_position_embeddings = 128,
                          .rms_norm_eps = 1e-6, .rope_theta = 10000, .tie_word_embeddings = tied, .qkv_bias = true,
                          .dtype = MMC_F32};
    return c;
}

static bool has_param(const mmc_qwen2 *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->param_names[i], name)) return true;
    return false;
}

static void test_trim(void) {
    for (int tied = 0; tied < 2; tied++) {
        mmc_qwen2_config c = tiny_cfg(4, tied);
        mmc_qwen2 *full = NULL, *m0 = NULL, *m1 = NULL;
        CHECK_OK(mmc_qwen2_new(&c, 1, &full));
        CHECK_OK(mmc_qwen2_new(&c, 1, &m0));
        CHECK_OK(mmc_qwen2_new(&c, 1, &m1));
        if (!full || !m0 || !m1) return;
        const int per_layer = 12;   /* 2 norms, q/k/v weights and biases, o, gate, up, down */
        CHECK(full->n_params == 1 + 4 * per_layer + 1 + !tied);
        CHECK_OK(mmc_pp_trim_qwen2(m0, 0, 2, 0, 1));
        CHECK_OK(mmc_pp_trim_qwen2(m1, 1, 2, 1, 4));
        CHECK(m0->n_params == 1 + per_layer && has_param(m0, "embed_tokens.weight") &&
              has_param(m0, "layers.0.mlp.down_proj.weight") && !has_param(m0, "layers.1.mlp.down_proj.weight") &&
              !has_param(m0, "norm.weight") && !m0->norm);
        CHECK(m1->n_params == 3 * per_layer + 1 + 1 && has_param(m1, "layers.3.input_layernorm.weight") &&
              !has_param(m1, "layers.0.input_layernorm.weight") && has_param(m1, "norm.weight") && m1->lm_head);
        /* tied: the last stage keeps the embedding as its lm_head, under the embedding's name */
        CHECK(has_param(m1, tied ? "embed_tokens.weight" : "lm_head.weight") &&
              !has_param(m1, tied ? "lm_head.weight" : "embed_tokens.weight"));
        CHECK(!m1->layers[0].q.w && m1->layers[1].q.w && !m0->layers[3].down.w);
        mmc_qwen2_free(full);
        mmc_qwen2_free(m0);
        mmc_qwen2_free(m1);
    }
}

/* P = 1 through the runtime against mmc_qwen2_lm_loss + mmc_backward per micro-batch */
static void test_runtime_single(void) {
    mmc_comm *world = NULL;
    mmc_dist_opts o = {.backend = MMC_DIST_SINGLE};
    CHECK_OK(mmc_dist_init(&o, &world));
    if (!world) return;
    enum { M = 3, B = 2, T = 7 };
    for (int tied = 0; tied < 2; tied++) {
        mmc_qwen2_config c = tiny_cfg(2, tied);
        mmc_qwen2 *a = NULL, *b = NULL;
        CHECK_OK(mmc_qwen2_new(&c, 3, &a));
        CHECK_OK(mmc_qwen2_new(&c, 3, &b));
        if (!a || !b) return;
        int32_t ids[M][B * T], lab[M][B * T];
        int64_t pos[M][3 * B * T];
        mmc_batch mbs[M];
        uint32_t x = 12345;
        for (int k = 0; k < M; k++) {
            for (int i = 0; i < B * T; i++) {
                x = x * 1664525u + 1013904223u;
                ids[k][i] = (int32_t)((x >> 8) % 64);
                lab[k][i] = i % T == 0 ? MMC_IGNORE_INDEX : ids[k][i];
            }
            for (int i = 0; i < 3 * B * T; i++) pos[k][i] = i % T;
            mbs[k] = (mmc_batch){.B = B, .T = T, .input_ids = ids[k], .labels = lab[k], .position_ids = pos[k],
                                 .n_seqs = B};
        }
        const double scale = 1.0 / 30.0;
        mmc_ctx *ctx = mmc_ctx_new();
        double ref = 0;
        for (int k = 0; k < M; k++) {
            int64_t n;
            mmc_tensor *l = mmc_qwen2_lm_loss(ctx, a, &mbs[k], scale, &n);
            ref += *(float *)l->data;
            mmc_backward(ctx, l);
            mmc_ctx_reset(ctx);
        }
        mmc_pp *pp = NULL;
        double got = -1;
        CHECK_OK(mmc_pp_new(world, b, 0, 2, &pp));
        if (pp) CHECK_OK(mmc_pp_run(pp, mbs, M, scale, &got));
        CHECK(got == ref);
        int same = 0;
        for (int i = 0; i < a->n_params; i++) {
            const mmc_tensor *ga = a->params[i]->grad, *gb = b->params[i]->grad;
            same += ga && gb && !memcmp(ga->data, gb->data, mmc_nbytes(ga));
        }
        CHECKF(same == a->n_params, "%d of %d gradients bit-identical (tied %d)", same, a->n_params, tied);
        mmc_pp_free(pp);
        mmc_ctx_free(ctx);
        mmc_qwen2_free(a);
        mmc_qwen2_free(b);
    }
    mmc_dist_finalize();
}

/* the split backward: input halves of every micro-batch, then the queued weight halves, against
 * one plain backward per micro-batch; the gradients must match bit for bit (the same GEMMs
 * accumulate into each dW in the same order), also through a checkpointed (recomputed) model */
static void test_split_backward(void) {
    enum { M = 2, B = 2, T = 5 };
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        mmc_qwen2_config c = tiny_cfg(2, false);
        mmc_qwen2 *a = NULL, *b = NULL;
        CHECK_OK(mmc_qwen2_new(&c, 5, &a));
        CHECK_OK(mmc_qwen2_new(&c, 5, &b));
        if (!a || !b) return;
        b->recompute = a->recompute = ckpt;
        int32_t ids[B * T], lab[B * T];
        int64_t pos[3 * B * T];
        for (int i = 0; i < B * T; i++) ids[i] = (i * 7 + 3) % 64, lab[i] = (i * 5 + 1) % 64;
        for (int i = 0; i < 3 * B * T; i++) pos[i] = i % T;
        mmc_batch mb = {.B = B, .T = T, .input_ids = ids, .labels = lab, .position_ids = pos, .n_seqs = B};
        mmc_ctx *ca = mmc_ctx_new(), *cb[M];
        for (int k = 0; k < M; k++) {
            int64_t n;
            mmc_backward(ca, mmc_qwen2_lm_loss(ca, a, &mb, 0.1, &n));
            mmc_ctx_reset(ca);
        }
        int queued = 0, ran = 0;
        for (int k = 0; k < M; k++) {   /* B of both micro-batches first, then their W's */
            int64_t n;
            cb[k] = mmc_ctx_new();
            mmc_set_defer_weight_grads(cb[k], true);
            mmc_backward(cb[k], mmc_qwen2_lm_loss(cb[k], b, &mb, 0.1, &n));
            mmc_set_defer_weight_grads(cb[k], false);
            queued += mmc_deferred_weight_grads(cb[k]);
        }
        if (!ckpt) {   /* before the W's, the projections have no gradient yet */
            const mmc_tensor *g = b->layers[0].q.w->grad;
            float mx = 0;
            for (int64_t i = 0; g && i < mmc_numel(g); i++) mx = fmaxf(mx, fabsf(((float *)g->data)[i]));
            CHECKF(mx == 0, "q_proj's gradient %.3g before its W", mx);
        }
        for (int k = 0; k < M; k++) ran += mmc_backward_weights(cb[k]), mmc_ctx_free(cb[k]);
        /* a layer: q k v o gate up down, and lm_head; recomputed blocks run theirs at once */
        CHECKF(ran == queued && queued == M * (ckpt ? 1 : 2 * 7 + 1), "ckpt %d: %d queued, %d ran", ckpt, queued, ran);
        int same = 0;
        for (int i = 0; i < a->n_params; i++) {
            const mmc_tensor *ga = a->params[i]->grad, *gb = b->params[i]->grad;
            same += ga && gb && !memcmp(ga->data, gb->data, mmc_nbytes(ga));
        }
        CHECKF(same == a->n_params, "split backward (recompute %d): %d of %d gradients bit-identical", ckpt, same,
               a->n_params);
        mmc_ctx_free(ca);
        mmc_qwen2_free(a);
        mmc_qwen2_free(b);
    }
}

/* ------------------------------------------------------------------ compare mode */
/* max |diff| (moments: relative to the tensor's max |value|) and the summed |diff| / count */
static double cmp_file(const char *a, const char *b, const char *file, bool rel, int *nt, double *sum, double *cnt) {
    char pa[4096], pb[4096];
    snprintf(pa, sizeof pa, "%s/%s", a, file);
    snprintf(pb, sizeof pb, "%s/%s", b, file);
    mmc_st *sa = NULL, *sb = NULL;
    CHECK_OK(mmc_st_open(pa, &sa));
    CHECK_OK(mmc_st_open(pb, &sb));
    double worst = 0;
    if (!sa || !sb) { mmc_st_close(sa); mmc_st_close(sb); return 1e9; }
    CHECKF(mmc_st_count(sa) == mmc_st_count(sb), "%s: %d tensors vs %d", file, mmc_st_count(sa), mmc_st_count(sb));
    for (int i = 0; i < mmc_st_count(sa); i++) {
        const char *nm = mmc_st_at(sa, i)->name;
        mmc_tensor *ta = mmc_st_tensor(sa, nm), *tb = mmc_st_find(sb, nm) ? mmc_st_tensor(sb, nm) : NULL;
        CHECKF(tb && mmc_same_shape(ta, tb), "%s: %s missing or of another shape in %s", file, nm, b);
        if (tb && mmc_same_shape(ta, tb)) {
            double d = 0, mx = 0;
            for (int64_t e = 0; e < mmc_numel(ta); e++) {
                double de = fabs(mmc_get_flat(ta, e) - mmc_get_flat(tb, e));
                d = fmax(d, de);
                *sum += de, *cnt += 1;
                mx = fmax(mx, fabs(mmc_get_flat(ta, e)));
            }
            if (rel && mx > 0) d /= mx;
            worst = fmax(worst, d);
            (*nt)++;
        }
        mmc_tensor_free(ta);
        mmc_tensor_free(tb);
    }
    mmc_st_close(sa);
    mmc_st_close(sb);
    return worst;
}

static int compare(const char *a, const char *b, double tl, double tw, double tm, double to) {
    double la[64], lb[64];
    int na = read_losses(a, la, 64), nb = read_losses(b, lb, 64);
    CHECKF(na > 0 && na == nb, "losses: %d in %s, %d in %s", na, a, nb, b);
    double lrel = 0;
    for (int i = 0; i < na && i < nb; i++) lrel = fmax(lrel, fabs(la[i] - lb[i]) / fabs(la[i]));
    char ca[2048], cb[2048];
    last_ckpt(a, ca, sizeof ca);
    last_ckpt(b, cb, sizeof cb);
    int nw = 0, no = 0;
    double ws = 0, wc = 0, os = 0, oc = 0;
    /* the trained weights: the model, or a LoRA run's adapters (PEFT layout) */
    char probe[2100];
    snprintf(probe, sizeof probe, "%s/adapter_model.safetensors", ca);
    const bool lora = access(probe, R_OK) == 0;
    double wd = cmp_file(ca, cb, lora ? "adapter_model.safetensors" : "model.safetensors", false, &nw, &ws, &wc);
    double od = cmp_file(ca, cb, "optimizer.safetensors", true, &no, &os, &oc);
    const double wmean = ws / (wc > 0 ? wc : 1);
    printf("%d steps: loss max rel diff %.2e (tol %.0e); %d %s max abs diff %.2e (tol %.0e), mean %.2e (tol "
           "%.0e); %d optimizer tensors max diff %.2e of scale (tol %.0e)", na, lrel, tl, nw, lora ? "adapters" : "weights",
           wd, tw, wmean, tm, no,
           od, to);
    /* training.ema_decay: the EMA (ema.safetensors, in the reference's checkpoint) within the weights' tolerances */
    snprintf(probe, sizeof probe, "%s/ema.safetensors", ca);
    if (access(probe, R_OK) == 0) {
        int ne = 0;
        double es = 0, ec = 0;
        const double ed = cmp_file(ca, cb, "ema.safetensors", false, &ne, &es, &ec), emean = es / (ec > 0 ? ec : 1);
        printf("; %d EMA tensors max abs diff %.2e, mean %.2e", ne, ed, emean);
        CHECK(ne > 0 && ed <= tw);
        CHECK(emean <= tm);
    }
    printf("\n");
    CHECK(lrel <= tl);
    CHECK(wd <= tw);
    CHECK(wmean <= tm);
    CHECK(od <= to);
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "bubble")) {
        const int P = atoi(argv[2]), M = atoi(argv[3]);
        double bd = -1, b1 = -1;
        if (mmc_pp_simulate_dualpipev(P, M, 1.0, 1.0, 1.0, &bd) < 0 || mmc_pp_simulate(P, M, 1.0, 2.0, &b1) < 0) {
            fprintf(stderr, "test_pp_schedule bubble: no DualPipeV schedule for P %d, M %d (needs P >= 2, M >= 2P)\n", P, M);
            return 1;
        }
        printf("bubble P %d M %d: dualpipev %.6f 1f1b %.6f\n", P, M, bd, b1);
        return 0;
    }
    if (argc == 8 && !strcmp(argv[1], "compare"))
        return compare(argv[2], argv[3], atof(argv[4]), atof(argv[5]), atof(argv[6]), atof(argv[7]));
    test_schedule();
    test_schedule_interleaved();
    test_schedule_dualpipev();
    test_simulate();
    test_split();
    test_partition();
    test_trim();
    test_runtime_single();
    test_split_backward();
    return test_done("test_pp_schedule");
}
