/* dist_mpi_worker.c — the program tests/test_dist_mpi.sh starts under mpirun: checks every
 * collective of the MPI backend against its serial definition (each rank recomputes what
 * every rank contributed), non-blocking overlap (an operation completes while the caller
 * computes without calling into the communicator), many operations in flight, groups from
 * splits and from the parallel layout. `hang R T`: rank R stops participating, the others
 * must abort within the T-second timeout naming rank R. */
#include "test_util.h"
#include "mmc_parallel.h"

#include <unistd.h>

static int R, W;

/* values chosen so sums are exact in f32 */
static float val(int r, int64_t i) { return (float)(r + 1) + (float)(i % 64) * 0.125f; }

static void collectives(mmc_comm *w) {
    enum { N = 1000 };
    float *a = malloc(sizeof(float) * N * W), *b = malloc(sizeof(float) * N * W), *e = malloc(sizeof(float) * N * W);
    for (int64_t i = 0; i < N * W; i++) a[i] = val(R, i);
    /* all-reduce: sum, avg, max; out of place and in place */
    CHECK_OK(mmc_all_reduce(w, a, b, N, MMC_F32, MMC_SUM));
    int bad = 0;
    for (int64_t i = 0; i < N; i++) {
        float s = 0, m = -1e30f;
        for (int r = 0; r < W; r++) { s += val(r, i); m = fmaxf(m, val(r, i)); }
        e[i] = s;
        bad += b[i] != s;
    }
    CHECK(bad == 0);
    memcpy(b, a, sizeof(float) * N);
    CHECK_OK(mmc_all_reduce(w, b, b, N, MMC_F32, MMC_AVG));
    bad = 0;
    for (int64_t i = 0; i < N; i++) bad += fabsf(b[i] - e[i] / W) > 1e-6f * fabsf(e[i]);   /* one rounding */
    CHECK(bad == 0);
    CHECK_OK(mmc_all_reduce(w, a, b, N, MMC_F32, MMC_MAX));
    bad = 0;
    for (int64_t i = 0; i < N; i++) bad += b[i] != val(W - 1, i);
    CHECK(bad == 0);
    int64_t cnt = R + 1, tot = 0;
    CHECK_OK(mmc_all_reduce(w, &cnt, &tot, 1, MMC_I64, MMC_SUM));
    CHECK(tot == (int64_t)W * (W + 1) / 2);
    double dv = 0.5 * R, ds;
    CHECK_OK(mmc_all_reduce(w, &dv, &ds, 1, MMC_F64, MMC_AVG));
    CHECK_NEAR(ds, 0.25 * (W - 1), 1e-12);

    /* reduce-scatter: a holds W blocks of N; this rank gets the sum of block R */
    CHECK_OK(mmc_reduce_scatter(w, a, b, N, MMC_F32, MMC_SUM));
    bad = 0;
    for (int64_t i = 0; i < N; i++) {
        float s = 0;
        for (int r = 0; r < W; r++) s += val(r, (int64_t)R * N + i);
        bad += b[i] != s;
    }
    CHECK(bad == 0);
    CHECK_OK(mmc_reduce_scatter(w, a, b, N, MMC_F32, MMC_AVG));
    {
        double s3 = 0;
        for (int r = 0; r < W; r++) s3 += val(r, (int64_t)R * N + 3);
        CHECK_NEAR(b[3], s3 / W, 1e-5);
    }

    /* all-gather: out of place, then in place (this rank's block already in position) */
    CHECK_OK(mmc_all_gather(w, a, b, N, MMC_F32));
    bad = 0;
    for (int r = 0; r < W; r++) for (int64_t i = 0; i < N; i++) bad += b[(int64_t)r * N + i] != val(r, i);
    CHECK(bad == 0);
    memset(b, 0, sizeof(float) * N * W);
    for (int64_t i = 0; i < N; i++) b[(int64_t)R * N + i] = val(R, i);
    CHECK_OK(mmc_all_gather(w, b + (int64_t)R * N, b, N, MMC_F32));
    bad = 0;
    for (int r = 0; r < W; r++) for (int64_t i = 0; i < N; i++) bad += b[(int64_t)r * N + i] != val(r, i);
    CHECK(bad == 0);
    /* raw bytes */
    char name[8] = {0}, names[8 * 8] = {0};
    snprintf(name, sizeof name, "r%d", R % 100);
    CHECK_OK(mmc_all_gather(w, name, names, 8, MMC_U8));
    for (int r = 0; r < W; r++) { char want[8]; snprintf(want, sizeof want, "r%d", r % 100); CHECK(strcmp(names + 8 * r, want) == 0); }

    /* broadcast from the last rank */
    for (int64_t i = 0; i < N; i++) b[i] = R == W - 1 ? val(77, i) : -1;
    CHECK_OK(mmc_broadcast(w, b, N, MMC_F32, W - 1));
    bad = 0;
    for (int64_t i = 0; i < N; i++) bad += b[i] != val(77, i);
    CHECK(bad == 0);

    /* all-to-all: block k of rank r is (r, k, i) */
    enum { K = 5 };
    int32_t s2[8 * K], r2[8 * K];
    for (int k = 0; k < W; k++) for (int i = 0; i < K; i++) s2[k * K + i] = R * 1000 + k * 10 + i;
    CHECK_OK(mmc_all_to_all(w, s2, r2, K, MMC_I32));
    bad = 0;
    for (int k = 0; k < W; k++) for (int i = 0; i < K; i++) bad += r2[k * K + i] != k * 1000 + R * 10 + i;
    CHECK(bad == 0);

    /* ring send/recv, non-blocking both ways (would deadlock if sends had to finish first) */
    float big_s[4096], big_r[4096];
    for (int i = 0; i < 4096; i++) big_s[i] = val(R, i);
    mmc_dist_req *q[2];
    CHECK_OK(mmc_recv_start(w, big_r, 4096, MMC_F32, (R + W - 1) % W, 5, &q[0]));
    CHECK_OK(mmc_send_start(w, big_s, 4096, MMC_F32, (R + 1) % W, 5, &q[1]));
    CHECK_OK(mmc_dist_wait_all(q, 2));
    bad = 0;
    for (int i = 0; i < 4096; i++) bad += big_r[i] != val((R + W - 1) % W, i);
    CHECK(bad == 0);
    /* blocking pair: even ranks send first */
    float x = (float)R, y = -1;
    int peer = R ^ 1;
    if (peer < W) {
        if (R % 2 == 0) { CHECK_OK(mmc_send(w, &x, 1, MMC_F32, peer, 1)); CHECK_OK(mmc_recv(w, &y, 1, MMC_F32, peer, 2)); }
        else { CHECK_OK(mmc_recv(w, &y, 1, MMC_F32, peer, 1)); CHECK_OK(mmc_send(w, &x, 1, MMC_F32, peer, 2)); }
        CHECK(y == (float)peer);
    }
    CHECK_OK(mmc_barrier(w));
    free(a); free(b); free(e);
}

static void overlap(mmc_comm *w) {
    /* 16 all-reduces in flight at once, waited in reverse order */
    enum { M = 16, N = 20000 };
    float *buf = malloc(sizeof(float) * M * N);
    mmc_dist_req *q[M];
    for (int j = 0; j < M; j++) {
        for (int i = 0; i < N; i++) buf[j * N + i] = val(R, i + j);
        CHECK_OK(mmc_all_reduce_start(w, buf + j * N, buf + j * N, N, MMC_F32, MMC_SUM, &q[j]));
    }
    for (int j = M - 1; j >= 0; j--) CHECK_OK(mmc_dist_wait(q[j]));
    int bad = 0;
    for (int j = 0; j < M; j++) for (int i = 0; i < N; i++) {
        float s = 0;
        for (int r = 0; r < W; r++) s += val(r, i + j);
        bad += buf[j * N + i] != s;
    }
    CHECK(bad == 0);
    /* a 4 MB all-reduce finishes while this thread computes and never calls the communicator */
    enum { B = 1 << 20 };
    float *g = malloc(sizeof(float) * B);
    for (int i = 0; i < B; i++) g[i] = 1.0f;
    mmc_dist_req *r;
    double t0 = mmc_now();
    CHECK_OK(mmc_all_reduce_start(w, g, g, B, MMC_F32, MMC_SUM, &r));
    volatile double acc = 0;
    bool done = false;
    while (mmc_now() - t0 < 10 && !(done = mmc_dist_test(r)))
        for (int k = 0; k < 100000; k++) acc += k * 1e-9;   /* "backward" */
    double t_done = mmc_now() - t0;
    CHECKF(done, "all-reduce did not progress while the caller computed");
    CHECK_OK(mmc_dist_wait(r));
    CHECK(g[0] == (float)W && g[B - 1] == (float)W);
    if (R == 0) printf("overlap: 4 MiB all-reduce completed during compute after %.1f ms\n", t_done * 1e3);
    free(g); free(buf);
}

static void groups(mmc_comm *w) {
    mmc_comm *g = NULL;
    CHECK_OK(mmc_comm_split(w, R % 2, -R, "parity", &g));   /* key -R: reversed order */
    CHECK(g != NULL);
    int gs = (W - R % 2 + 1) / 2;
    CHECK(mmc_comm_size(g) == gs);
    int64_t v = R, s = 0;
    CHECK_OK(mmc_all_reduce(g, &v, &s, 1, MMC_I64, MMC_SUM));
    int64_t want = 0;
    for (int r = R % 2; r < W; r += 2) want += r;
    CHECK(s == want);
    CHECK(mmc_comm_world_rank(g, 0) == (W - 1) - ((W - 1 - R % 2) % 2));   /* highest rank of this parity first */
    mmc_comm_free(g);
    mmc_comm *none = NULL;
    CHECK_OK(mmc_comm_split(w, R == 0 ? -1 : 1, 0, "rest", &none));
    CHECK((R == 0) == (none == NULL));
    if (none) { CHECK(mmc_comm_size(none) == W - 1); CHECK_OK(mmc_barrier(none)); mmc_comm_free(none); }

    mmc_dist_layout l = {.tensor = W >= 4 ? 2 : 1, .data = W >= 4 ? W / 2 : W};
    mmc_dist_groups gr;
    CHECK_OK(mmc_dist_layout_groups(w, &l, &gr));
    CHECK(mmc_comm_size(gr.dp) == l.data && mmc_comm_size(gr.tp) == l.tensor);
    CHECK(gr.dp_rank == R / l.tensor && gr.tp_rank == R % l.tensor);
    /* dp group members share the tensor coordinate */
    for (int m = 0; m < mmc_comm_size(gr.dp); m++) CHECK(mmc_comm_world_rank(gr.dp, m) % l.tensor == R % l.tensor);
    float one = 1, n = 0;
    CHECK_OK(mmc_all_reduce(gr.dp, &one, &n, 1, MMC_F32, MMC_SUM));
    CHECK(n == (float)l.data);
    mmc_dist_groups_free(&gr);
    mmc_dist_layout badl = {.data = W + 1};
    CHECK_ERR(mmc_dist_layout_groups(w, &badl, &gr), MMC_ERR_INVALID);
}

int main(int argc, char **argv) {
    bool hang = argc >= 2 && strcmp(argv[1], "hang") == 0;
    /* the hang test's short timeout applies from its second collective on: start-up (MPI_Init
     * of ASan-instrumented processes on a loaded machine) can skew the ranks by seconds, and a
     * first collective timing out would name the wrong rank */
    mmc_dist_opts o = {.backend = MMC_DIST_MPI, .timeout_s = 120};
    mmc_comm *w = NULL;
    mmc_status st = mmc_dist_init(&o, &w);
    if (st) { fprintf(stderr, "init: %s\n", mmc_last_error()); return 1; }
    R = mmc_comm_rank(w);
    W = mmc_comm_size(w);
    if (W > 8) { fprintf(stderr, "at most 8 ranks\n"); return 1; }
    if (hang) {
        int stuck = argc >= 3 ? atoi(argv[2]) : W - 1;
        float v = 1, s;
        CHECK_OK(mmc_all_reduce(w, &v, &s, 1, MMC_F32, MMC_SUM));
        mmc_dist_set_timeout(argc >= 4 ? atof(argv[3]) : 60);
        if (R == stuck) {
            sleep(60);   /* "stops participating": alive, but never joins the next collective */
        } else {
            float big[256] = {0};
            mmc_all_reduce(w, big, big, 256, MMC_F32, MMC_SUM);
        }
        fprintf(stderr, "rank %d: the hang was not detected\n", R);
        return 1;
    }
    collectives(w);
    overlap(w);
    groups(w);
    char nm[32];
    snprintf(nm, sizeof nm, "dist_mpi_worker rank %d/%d", R, W);
    int rc = test_done(nm);
    int64_t f = rc, tf = 0;
    mmc_all_reduce(w, &f, &tf, 1, MMC_I64, MMC_SUM);
    mmc_dist_finalize();
    return tf ? 1 : 0;
}
