/* test_dist.c — the communicator's single-process backend: every collective equals its
 * serial definition for a group of one, non-blocking forms complete through wait/test,
 * send/recv to self match by tag in either order, splits and the parallel layout, and
 * argument errors name the problem. (tests/test_dist_mpi.sh covers 2 and 4 processes.) */
#include "test_util.h"
#include "mmc_parallel.h"

int main(void) {
    mmc_dist_opts o = {.backend = MMC_DIST_SINGLE, .timeout_s = 5};
    mmc_comm *w = NULL;
    CHECK_OK(mmc_dist_init(&o, &w));
    CHECK(w && mmc_comm_rank(w) == 0 && mmc_comm_size(w) == 1);
    CHECK(strcmp(mmc_comm_backend_name(w), "single") == 0);
    CHECK(mmc_dist_world() == w);

    float a[8], b[8];
    for (int i = 0; i < 8; i++) a[i] = (float)i * 0.5f - 1.0f;
    /* all-reduce sum / avg / max over one rank is the identity; out of place and in place */
    CHECK_OK(mmc_all_reduce(w, a, b, 8, MMC_F32, MMC_SUM));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_OK(mmc_all_reduce(w, b, b, 8, MMC_F32, MMC_AVG));
    CHECK(memcmp(a, b, sizeof a) == 0);
    int64_t n64 = 42;
    CHECK_OK(mmc_all_reduce(w, &n64, &n64, 1, MMC_I64, MMC_SUM));
    CHECK(n64 == 42);
    CHECK_ERR(mmc_all_reduce(w, &n64, &n64, 1, MMC_I64, MMC_AVG), MMC_ERR_UNSUPPORTED);
    CHECK_ERR(mmc_all_reduce(w, a, b, 2, MMC_BF16, MMC_SUM), MMC_ERR_UNSUPPORTED);
    CHECK_ERR(mmc_all_reduce(w, a, b, -1, MMC_F32, MMC_SUM), MMC_ERR_INVALID);
    /* reduce-scatter / all-gather / all-to-all: one block */
    memset(b, 0, sizeof b);
    CHECK_OK(mmc_reduce_scatter(w, a, b, 8, MMC_F32, MMC_SUM));
    CHECK(memcmp(a, b, sizeof a) == 0);
    memset(b, 0, sizeof b);
    CHECK_OK(mmc_all_gather(w, a, b, 8, MMC_F32));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_OK(mmc_all_gather(w, b, b, 8, MMC_F32));   /* in place */
    memset(b, 0, sizeof b);
    CHECK_OK(mmc_all_to_all(w, a, b, 8, MMC_F32));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_OK(mmc_broadcast(w, b, 8, MMC_F32, 0));
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_ERR(mmc_broadcast(w, b, 8, MMC_F32, 1), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "root rank 1") != NULL);
    CHECK_OK(mmc_barrier(w));

    /* raw bytes */
    unsigned char s[5] = {1, 2, 3, 4, 5}, d[5] = {0};
    CHECK_OK(mmc_all_gather(w, s, d, 5, MMC_U8));
    CHECK(memcmp(s, d, 5) == 0);

    /* send/recv to self: send first, then receive; and receive posted first */
    float r1[3] = {0}, r2[3] = {0}, m1[3] = {1, 2, 3}, m2[3] = {4, 5, 6};
    CHECK_OK(mmc_send(w, m1, 3, MMC_F32, 0, 7));
    mmc_dist_req *rq = NULL, *sq = NULL;
    CHECK_OK(mmc_recv_start(w, r2, 3, MMC_F32, 0, 9, &rq));
    CHECK(!mmc_dist_test(rq));
    CHECK_OK(mmc_send_start(w, m2, 3, MMC_F32, 0, 9, &sq));
    CHECK(mmc_dist_test(rq));
    CHECK_OK(mmc_dist_wait(rq));
    CHECK_OK(mmc_dist_wait(sq));
    CHECK_OK(mmc_recv(w, r1, 3, MMC_F32, 0, 7));
    CHECK(memcmp(r1, m1, sizeof m1) == 0 && memcmp(r2, m2, sizeof m2) == 0);
    CHECK_ERR(mmc_send(w, m1, 3, MMC_F32, 3, 0), MMC_ERR_INVALID);

    /* non-blocking forms */
    mmc_dist_req *q[4];
    float c[8];
    CHECK_OK(mmc_all_reduce_start(w, a, c, 8, MMC_F32, MMC_SUM, &q[0]));
    CHECK_OK(mmc_all_gather_start(w, a, c, 8, MMC_F32, &q[1]));
    CHECK_OK(mmc_barrier_start(w, &q[2]));
    CHECK_OK(mmc_broadcast_start(w, c, 8, MMC_F32, 0, &q[3]));
    CHECK_OK(mmc_dist_wait_all(q, 4));
    CHECK(memcmp(a, c, sizeof a) == 0);

    /* groups */
    mmc_comm *g = NULL, *none = (mmc_comm *)1;
    CHECK_OK(mmc_comm_split(w, 0, 0, "dp", &g));
    CHECK(g && mmc_comm_size(g) == 1 && strcmp(mmc_comm_name(g), "dp") == 0);
    CHECK_OK(mmc_comm_split(w, -1, 0, "none", &none));
    CHECK(none == NULL);
    CHECK_OK(mmc_all_reduce(g, a, b, 8, MMC_F32, MMC_SUM));
    mmc_comm_free(g);
    mmc_dist_groups gr;
    mmc_dist_layout l = {.data = 1};
    CHECK_OK(mmc_dist_layout_groups(w, &l, &gr));
    CHECK(gr.dp && mmc_comm_size(gr.dp) == 1 && gr.dp_rank == 0 && gr.tp && gr.pp && gr.cp && gr.ep);
    mmc_dist_groups_free(&gr);
    l.data = 2;
    CHECK_ERR(mmc_dist_layout_groups(w, &l, &gr), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "world size") != NULL);

    mmc_dist_stats st;
    mmc_dist_get_stats(&st);
    CHECK(st.ops > 10 && st.bytes > 0);
    mmc_dist_finalize();
    CHECK(mmc_dist_world() == NULL);
    return test_done("test_dist");
}
