/* parallel_internal.h — what the communicator front end (comm.c) and its backends (single in
 * comm.c, MPI in comm_mpi.c, NCCL later) share: the operation descriptor, the request, the
 * group struct and the backend vtable. The front end validates arguments and keeps the
 * statistics; a backend only moves bytes. */
#ifndef MMC_PARALLEL_INTERNAL_H
#define MMC_PARALLEL_INTERNAL_H

#include "mmc_parallel.h"

typedef enum {
    OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_ALL_TO_ALL,
    OP_SEND, OP_RECV, OP_BARRIER, OP_SPLIT, OP_ALL_TO_ALL_V
} dist_kind;

typedef struct {
    dist_kind kind;
    const void *send;
    void *recv;
    int64_t count;
    mmc_dtype dt;
    mmc_reduce_op op;
    int peer, tag;           /* send/recv peer, broadcast root; split: color, key */
    const int *v;            /* all_to_all_v: [4][size] byte counts and displacements: send counts, send
                              * displacements, receive counts, receive displacements */
} dist_op;

typedef struct dist_backend dist_backend;

struct mmc_comm {
    const dist_backend *be;
    int rank, size;
    char name[32];
    int *world_ranks;        /* [size] world rank of each member */
    uint64_t id;             /* equal on every member (derived from the split history) */
    int64_t n_splits;        /* splits made from this group (feeds children's ids) */
    int64_t issued;          /* collectives issued on this group (1-based sequence numbers) */
    int64_t completed;
    void *impl;              /* backend state (MPI_Comm ...) */
};

struct mmc_dist_req {
    mmc_comm *comm;
    dist_op op;
    int64_t seq;             /* this group's collective sequence number (0 for p2p) */
    double t_start;
    volatile int done;
    mmc_status st;
    char err[200];
    /* split result */
    mmc_comm *split_out;
    const char *split_name;
    void *impl;              /* backend request */
    struct mmc_dist_req *next;
};

struct dist_backend {
    const char *name;
    /* Start r (r->op filled, r->comm set); may complete it at once (r->done = 1). */
    mmc_status (*start)(mmc_dist_req *r);
    /* Block until r->done. */
    void (*wait)(mmc_dist_req *r);
    bool (*test)(mmc_dist_req *r);
    void (*comm_free)(mmc_comm *c);
    void (*finalize)(void);
    void (*abort)(int code);   /* does not return */
    void (*set_timeout)(double s);
};

/* comm.c */
size_t dist_elsize(mmc_dtype dt);
void dist_reduce_scale(void *buf, int64_t count, mmc_dtype dt, double s);
double dist_default_timeout(void);
void dist_stats_add_busy(double s);
mmc_comm *dist_comm_alloc(const dist_backend *be, int rank, int size, const char *name);
uint64_t dist_child_id(mmc_comm *parent, int color);
const char *dist_kind_name(dist_kind k);

#ifdef MMC_HAVE_MPI
/* comm_mpi.c */
mmc_status dist_mpi_init(double timeout_s, mmc_comm **world);
#endif

#endif
