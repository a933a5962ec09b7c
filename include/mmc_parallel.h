/* mmc_parallel.h — the communicator: collectives, point-to-point and process groups behind one
 * interface, so layers and the trainer never call MPI (or, later, NCCL) directly.
 *
 * Backends (a small vtable in src/parallel/parallel_internal.h, like ggml's backends):
 *   - single: one process; every collective is the identity (or a copy).
 *   - mpi:    OpenMPI/MPICH over CPU buffers, when built with MPI (MMC_HAVE_MPI). One
 *             communication thread per process issues every MPI call in program order and
 *             drives progress, so non-blocking operations really overlap with compute
 *             (OpenMPI has no asynchronous progress of its own for collectives). The same
 *             thread is the watchdog: an operation that does not complete within the timeout
 *             makes the rank ask its peers where they are, print which rank it waits on, and
 *             MPI_Abort the job.
 *   - nccl:   (to follow) the same calls on device buffers, bootstrapped over MPI; requests map
 *             to CUDA events, which is why every operation takes explicit buffers and counts.
 *
 * Semantics mirror MPI / torch.distributed: collectives must be called by every member of
 * the group in the same order; buffers are contiguous; `count` is in elements of `dt`.
 * Reductions accept F32, F64, I32, I64 (MMC_AVG only for floating types); the byte-moving
 * operations accept any dtype of fixed size (use MMC_U8 for raw bytes). Send and receive
 * buffers may be the same pointer where noted (in place). A non-blocking call returns a
 * request; its buffers must stay untouched until mmc_dist_wait() returns on it.
 *
 * Groups: the world group is created by mmc_dist_init(); further groups come from
 * mmc_comm_split() (collective over the parent) or mmc_dist_layout_groups(), which cuts the
 * world into data/tensor/pipeline/context/expert groups (Megatron's rank order: tensor
 * fastest, then context, then data, then pipeline).
 */
#ifndef MMC_PARALLEL_H
#define MMC_PARALLEL_H

#include "mmc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_comm mmc_comm;          /* a process group */
typedef struct mmc_dist_req mmc_dist_req;  /* a non-blocking operation in flight */

typedef enum { MMC_SUM = 0, MMC_AVG = 1, MMC_MAX = 2 } mmc_reduce_op;
typedef enum { MMC_DIST_AUTO = 0, MMC_DIST_SINGLE = 1, MMC_DIST_MPI = 2 } mmc_dist_backend;

typedef struct {
    mmc_dist_backend backend;  /* AUTO: MPI when launched by mpirun/srun and built with MPI */
    double timeout_s;          /* watchdog: a pending operation older than this aborts the job
                                * (0 = the default: env MMC_DIST_TIMEOUT, else 600 s) */
} mmc_dist_opts;

/* Start the distributed runtime (once per process; MPI_Init_thread for the mpi backend).
 * Returns the world group in *world (owned by the runtime). Calling it again returns the
 * same world. Without MPI support, AUTO falls back to single and MPI is an error. */
mmc_status mmc_dist_init(const mmc_dist_opts *o, mmc_comm **world);
/* The world group, or NULL before mmc_dist_init. */
mmc_comm *mmc_dist_world(void);
/* Finish pending work, free every group, MPI_Finalize. */
void mmc_dist_finalize(void);
/* Abort every process of the job (MPI_Abort on mpi; exit on single). Never returns. */
void mmc_dist_abort(int code) __attribute__((noreturn));
/* True when this build includes the MPI backend. */
bool mmc_dist_have_mpi(void);
/* True when the environment says we were started by mpirun / srun (OMPI_*, PMI_*, PMIX_*). */
bool mmc_dist_launched(void);
/* Change the watchdog timeout (seconds, > 0). */
void mmc_dist_set_timeout(double seconds);

int mmc_comm_rank(const mmc_comm *c);
int mmc_comm_size(const mmc_comm *c);
int mmc_comm_world_rank(const mmc_comm *c, int group_rank);  /* world rank of a member */
const char *mmc_comm_name(const mmc_comm *c);                 /* "world", "dp", ... */
const char *mmc_comm_backend_name(const mmc_comm *c);         /* "single", "mpi" */

/* Collective over parent: members with the same color form a new group, ordered by key
 * (then by parent rank). color < 0 = this rank joins no group (*out = NULL). */
mmc_status mmc_comm_split(mmc_comm *parent, int color, int key, const char *name, mmc_comm **out);
void mmc_comm_free(mmc_comm *c);   /* groups from split; the world is freed by finalize */

/* ---------------------------------------------------------------- parallel layout */
typedef struct {
    int tensor, context, data, pipeline, expert;  /* sizes (0 = 1); tensor*context*data*pipeline
                                                   * must equal the world size; expert must
                                                   * divide data*context */
} mmc_dist_layout;

typedef struct {
    mmc_comm *world, *tp, *cp, *dp, *pp, *ep;
    int tp_rank, cp_rank, dp_rank, pp_rank, ep_rank;
} mmc_dist_groups;

/* Cut world into groups (collective over world). Errors name the sizes when they do not
 * multiply to the world size. Free with mmc_dist_groups_free. */
mmc_status mmc_dist_layout_groups(mmc_comm *world, const mmc_dist_layout *l, mmc_dist_groups *g);
void mmc_dist_groups_free(mmc_dist_groups *g);

/* ---------------------------------------------------------------- blocking operations */
/* recv[i] = op over ranks of send[i]; send == recv allowed (in place). */
mmc_status mmc_all_reduce(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt,
                          mmc_reduce_op op);
/* send holds size * count elements; rank r receives op over ranks of send[r*count .. +count). */
mmc_status mmc_reduce_scatter(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt,
                              mmc_reduce_op op);
/* recv[r*count .. +count) = send of rank r; send == recv + rank*count allowed (in place). */
mmc_status mmc_all_gather(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt);
/* buf of root copied to every rank. */
mmc_status mmc_broadcast(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int root);
/* send holds size blocks of count; block r goes to rank r, recv block r comes from rank r. */
mmc_status mmc_all_to_all(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt);
/* Uneven all-to-all (MPI_Alltoallv): send_counts[r] elements go to rank r, packed in rank order
 * in send; recv_counts[r] come from rank r, packed in rank order in recv (every rank's counts
 * must agree with its peers'). */
mmc_status mmc_all_to_all_v(mmc_comm *c, const void *send, const int64_t *send_counts, void *recv,
                            const int64_t *recv_counts, mmc_dtype dt);
mmc_status mmc_send(mmc_comm *c, const void *buf, int64_t count, mmc_dtype dt, int peer, int tag);
mmc_status mmc_recv(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int peer, int tag);
mmc_status mmc_barrier(mmc_comm *c);

/* ---------------------------------------------------------------- non-blocking forms */
mmc_status mmc_all_reduce_start(mmc_comm *c, const void *send, void *recv, int64_t count,
                                mmc_dtype dt, mmc_reduce_op op, mmc_dist_req **req);
mmc_status mmc_reduce_scatter_start(mmc_comm *c, const void *send, void *recv, int64_t count,
                                    mmc_dtype dt, mmc_reduce_op op, mmc_dist_req **req);
mmc_status mmc_all_gather_start(mmc_comm *c, const void *send, void *recv, int64_t count,
                                mmc_dtype dt, mmc_dist_req **req);
mmc_status mmc_broadcast_start(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int root,
                               mmc_dist_req **req);
mmc_status mmc_all_to_all_start(mmc_comm *c, const void *send, void *recv, int64_t count,
                                mmc_dtype dt, mmc_dist_req **req);
mmc_status mmc_send_start(mmc_comm *c, const void *buf, int64_t count, mmc_dtype dt, int peer,
                          int tag, mmc_dist_req **req);
mmc_status mmc_recv_start(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int peer, int tag,
                          mmc_dist_req **req);
mmc_status mmc_barrier_start(mmc_comm *c, mmc_dist_req **req);
/* Block until done, then free the request (NULL is a no-op). */
mmc_status mmc_dist_wait(mmc_dist_req *r);
mmc_status mmc_dist_wait_all(mmc_dist_req **r, int n);
/* Non-blocking check; the request stays valid until waited on. */
bool mmc_dist_test(mmc_dist_req *r);

/* Communication accounting (this process, since init): operations, payload bytes this rank
 * sent into collectives, and seconds the caller spent blocked in waits (exposed time). */
typedef struct {
    int64_t ops, bytes;
    double wait_s;      /* caller blocked in mmc_dist_wait / blocking calls */
    double busy_s;      /* wall time with at least one operation in flight */
} mmc_dist_stats;
void mmc_dist_get_stats(mmc_dist_stats *s);
void mmc_dist_reset_stats(void);

#ifdef __cplusplus
}
#endif
#endif
