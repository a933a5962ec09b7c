/* comm_mpi.c — the MPI backend of the communicator (OpenMPI / MPICH, CPU buffers), built
 * when CMake finds MPI (MMC_HAVE_MPI).
 *
 * One communication thread per process makes every MPI call after MPI_Init_thread
 * (MPI_THREAD_SERIALIZED is enough). Callers enqueue operations; the thread starts them at
 * once with the non-blocking MPI call (MPI_Iallreduce, MPI_Ireduce_scatter_block, ...) in
 * program order — so every rank issues collectives in the same order, as MPI requires — and
 * keeps testing them, which is what makes them progress while the caller computes (OpenMPI
 * moves a non-blocking collective forward only inside MPI calls; this is the role of
 * torch's ProcessGroup worker threads).
 *
 * The same thread is the watchdog (torch's NCCL watchdog / TORCH_NCCL_ASYNC_ERROR_HANDLING):
 * when the oldest pending operation is older than the timeout, it asks every other member
 * of that group, over a private duplicate of MPI_COMM_WORLD, how many collectives it has
 * issued on the group; members that have not reached this one (or do not answer) are named
 * in the message, and the job is ended with MPI_Abort. Idle ranks answer those questions
 * too, so a rank stuck in computation is named rather than merely suspected. */
#ifdef MMC_HAVE_MPI
#include "parallel_internal.h"

#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { TAG_QUERY = 1, TAG_REPLY = 2, MAX_INFLIGHT = 512 };

typedef struct { MPI_Comm comm; } mpi_impl;
typedef struct { MPI_Request req; mmc_dist_req *r; } inflight;

static struct {
    pthread_t th;
    bool running, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    mmc_dist_req *q_head, *q_tail;   /* queued, not yet started */
    MPI_Comm wd;                     /* watchdog questions and answers */
    double timeout;
    int wrank, wsize;
    mmc_comm **reg;                  /* live groups, for answering questions */
    int n_reg, cap_reg;
    MPI_Comm *to_free;               /* groups freed by the caller, released by the thread */
    int n_free, cap_free;
    inflight fl[MAX_INFLIGHT];       /* owned by the thread */
    int nfl;
} M = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv_work = PTHREAD_COND_INITIALIZER,
       .cv_done = PTHREAD_COND_INITIALIZER};

static MPI_Comm mcomm(const mmc_comm *c) { return ((mpi_impl *)c->impl)->comm; }

static MPI_Datatype mtype(mmc_dtype dt) {
    switch (dt) {
    case MMC_F32: return MPI_FLOAT;
    case MMC_F64: return MPI_DOUBLE;
    case MMC_I32: return MPI_INT32_T;
    case MMC_I64: return MPI_INT64_T;
    default: return MPI_BYTE;
    }
}

static void reg_add(mmc_comm *c) {
    pthread_mutex_lock(&M.mu);
    if (M.n_reg == M.cap_reg) {
        int cap = M.cap_reg ? 2 * M.cap_reg : 16;
        mmc_comm **n = realloc(M.reg, (size_t)cap * sizeof *n);
        if (n) { M.reg = n; M.cap_reg = cap; }
    }
    if (M.n_reg < M.cap_reg) M.reg[M.n_reg++] = c;
    pthread_mutex_unlock(&M.mu);
}

static void complete(mmc_dist_req *r) {
    pthread_mutex_lock(&M.mu);
    r->done = 1;
    pthread_cond_broadcast(&M.cv_done);
    pthread_mutex_unlock(&M.mu);
}

static void fail_req(mmc_dist_req *r, int rc) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    r->st = MMC_ERR_IO;
    snprintf(r->err, sizeof r->err, "dist: MPI %s on group '%s' failed: %.*s", dist_kind_name(r->op.kind),
             r->comm->name, len, s);
}

/* ------------------------------------------------------------------ the thread's side */
static void do_split(mmc_dist_req *r) {
    mmc_comm *p = r->comm;
    MPI_Comm nc = MPI_COMM_NULL;
    int color = r->op.peer;
    int rc = MPI_Comm_split(mcomm(p), color < 0 ? MPI_UNDEFINED : color, r->op.tag, &nc);
    if (rc != MPI_SUCCESS) { fail_req(r, rc); return; }
    if (nc == MPI_COMM_NULL) return;
    int rank, size;
    MPI_Comm_rank(nc, &rank);
    MPI_Comm_size(nc, &size);
    mmc_comm *c = dist_comm_alloc(p->be, rank, size, r->split_name);
    mpi_impl *im = malloc(sizeof *im);
    if (!c || !im) {
        free(im); mmc_comm_free(c); MPI_Comm_free(&nc);
        r->st = MMC_ERR_OOM; snprintf(r->err, sizeof r->err, "dist: out of memory creating a group");
        return;
    }
    im->comm = nc;
    c->impl = im;
    c->id = dist_child_id(p, color);
    MPI_Group g, wg;
    MPI_Comm_group(nc, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int *idx = malloc((size_t)size * sizeof *idx);
    if (idx) {
        for (int i = 0; i < size; i++) idx[i] = i;
        MPI_Group_translate_ranks(g, size, idx, wg, c->world_ranks);
        free(idx);
    }
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    r->split_out = c;
    reg_add(c);
}

/* Start r; returns true if it now waits in the in-flight table. */
static bool mpi_issue(mmc_dist_req *r, MPI_Request *q) {
    dist_op *o = &r->op;
    MPI_Comm cm = mcomm(r->comm);
    size_t es = dist_elsize(o->dt);
    int n = (int)o->count, nb = (int)(o->count * (int64_t)es);
    int rc = MPI_SUCCESS;
    switch (o->kind) {
    case OP_ALL_REDUCE:
        rc = MPI_Iallreduce(o->send == o->recv ? MPI_IN_PLACE : o->send, o->recv, n, mtype(o->dt),
                            o->op == MMC_MAX ? MPI_MAX : MPI_SUM, cm, q);
        break;
    case OP_REDUCE_SCATTER:
        rc = MPI_Ireduce_scatter_block(o->send, o->recv, n, mtype(o->dt), o->op == MMC_MAX ? MPI_MAX : MPI_SUM, cm, q);
        break;
    case OP_ALL_GATHER: {
        bool inplace = o->send == (const char *)o->recv + (size_t)r->comm->rank * (size_t)nb;
        rc = MPI_Iallgather(inplace ? MPI_IN_PLACE : o->send, nb, MPI_BYTE, o->recv, nb, MPI_BYTE, cm, q);
        break;
    }
    case OP_BROADCAST: rc = MPI_Ibcast(o->recv, nb, MPI_BYTE, o->peer, cm, q); break;
    case OP_ALL_TO_ALL: rc = MPI_Ialltoall(o->send, nb, MPI_BYTE, o->recv, nb, MPI_BYTE, cm, q); break;
    case OP_ALL_TO_ALL_V: {
        const int P = r->comm->size;
        rc = MPI_Ialltoallv(o->send, o->v, o->v + P, MPI_BYTE, o->recv, o->v + 2 * P, o->v + 3 * P, MPI_BYTE, cm, q);
        break;
    }
    case OP_SEND: rc = MPI_Isend(o->send, nb, MPI_BYTE, o->peer, o->tag, cm, q); break;
    case OP_RECV: rc = MPI_Irecv(o->recv, nb, MPI_BYTE, o->peer, o->tag, cm, q); break;
    case OP_BARRIER: rc = MPI_Ibarrier(cm, q); break;
    case OP_SPLIT: do_split(r); return false;
    }
    if (rc != MPI_SUCCESS) { fail_req(r, rc); return false; }
    return true;
}

static void post(mmc_dist_req *r) {
    if (r->op.op == MMC_AVG && (r->op.kind == OP_ALL_REDUCE || r->op.kind == OP_REDUCE_SCATTER))
        dist_reduce_scale(r->op.recv, r->op.count, r->op.dt, 1.0 / r->comm->size);
}

static int64_t issued_on(uint64_t id) {
    int64_t v = -1;
    pthread_mutex_lock(&M.mu);
    for (int i = 0; i < M.n_reg; i++)
        if (M.reg[i]->id == id) { v = __atomic_load_n(&M.reg[i]->issued, __ATOMIC_RELAXED); break; }
    pthread_mutex_unlock(&M.mu);
    return v;
}

/* Answer "how far are you on group id?" from ranks whose watchdog fired. */
static void serve_queries(void) {
    for (;;) {
        int flag = 0;
        MPI_Status s;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, M.wd, &flag, &s);
        if (!flag) return;
        int64_t q[2];
        MPI_Recv(q, 2, MPI_INT64_T, s.MPI_SOURCE, TAG_QUERY, M.wd, MPI_STATUS_IGNORE);
        int64_t rep[2] = {issued_on((uint64_t)q[0]), M.nfl};
        MPI_Send(rep, 2, MPI_INT64_T, s.MPI_SOURCE, TAG_REPLY, M.wd);
    }
}

static void diagnose_and_abort(mmc_dist_req *r, double age) {
    mmc_comm *c = r->comm;
    char msg[4096];
    int len = snprintf(msg, sizeof msg, "mmc dist: rank %d: timeout: %s", M.wrank, dist_kind_name(r->op.kind));
    if (r->seq) len += snprintf(msg + len, sizeof msg - len, " #%lld", (long long)r->seq);
    len += snprintf(msg + len, sizeof msg - len, " on group '%s' (%d ranks, %lld x %s) has not completed after "
                    "%.1f s (parallel.timeout %.1f s)", c->name, c->size, (long long)r->op.count,
                    mmc_dtype_name(r->op.dt), age, M.timeout);
    int nq = 0, *who = calloc((size_t)c->size, sizeof *who);
    int64_t (*rep)[2] = calloc((size_t)c->size, sizeof *rep);
    bool *got = calloc((size_t)c->size, sizeof *got);
    if (who && rep && got) {
        for (int m = 0; m < c->size; m++) {
            if (m == c->rank) continue;
            int64_t q[2] = {(int64_t)c->id, r->seq};
            MPI_Send(q, 2, MPI_INT64_T, c->world_ranks[m], TAG_QUERY, M.wd);
            who[nq++] = m;
        }
        double deadline = mmc_now() + 2.0;
        int ngot = 0;
        while (ngot < nq && mmc_now() < deadline) {
            serve_queries();
            int flag = 0;
            MPI_Status s;
            MPI_Iprobe(MPI_ANY_SOURCE, TAG_REPLY, M.wd, &flag, &s);
            if (!flag) { struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL); continue; }
            int64_t a[2];
            MPI_Recv(a, 2, MPI_INT64_T, s.MPI_SOURCE, TAG_REPLY, M.wd, MPI_STATUS_IGNORE);
            for (int m = 0; m < c->size; m++)
                if (c->world_ranks[m] == s.MPI_SOURCE && !got[m]) { got[m] = true; rep[m][0] = a[0]; rep[m][1] = a[1]; ngot++; }
        }
        int named = 0;
        for (int k = 0; k < nq; k++) {
            int m = who[k], wr = c->world_ranks[m];
            bool p2p = r->op.kind == OP_SEND || r->op.kind == OP_RECV;
            if (p2p && m != r->op.peer) continue;
            if (!got[m]) {
                len += snprintf(msg + len, sizeof msg - len, "; waiting on rank %d: it does not answer (dead or hung)", wr);
                named++;
            } else if (p2p || rep[m][0] < r->seq) {
                len += snprintf(msg + len, sizeof msg - len, "; waiting on rank %d: it has not entered this %s "
                                "(it has issued %lld operations on '%s'%s)", wr, dist_kind_name(r->op.kind),
                                (long long)(rep[m][0] < 0 ? 0 : rep[m][0]), c->name,
                                rep[m][1] ? "" : " and waits on no communication: busy or stuck in computation");
                named++;
            }
            if (len >= (int)sizeof msg - 200) break;
        }
        if (!named) len += snprintf(msg + len, sizeof msg - len, "; every peer has entered it (transport stuck?)");
    }
    fprintf(stderr, "%s; aborting the job\n", msg);
    fflush(stderr);
    free(who); free(rep); free(got);
    MPI_Abort(MPI_COMM_WORLD, 3);
    abort();
}

static void *worker(void *arg) {
    (void)arg;
    long backoff_ns = 0;
    double busy_since = 0;
    for (;;) {
        pthread_mutex_lock(&M.mu);
        if (M.nfl == 0 && !M.q_head) {
            if (M.stop) { pthread_mutex_unlock(&M.mu); break; }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 20000000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&M.cv_work, &M.mu, &ts);
        }
        mmc_dist_req *take = NULL, **tail = &take;
        int room = MAX_INFLIGHT - M.nfl;
        while (M.q_head && room-- > 0) {
            mmc_dist_req *r = M.q_head;
            M.q_head = r->next;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
        }
        if (!M.q_head) M.q_tail = NULL;
        MPI_Comm frees[16];
        int nf = 0;
        while (M.n_free && nf < 16) frees[nf++] = M.to_free[--M.n_free];
        pthread_mutex_unlock(&M.mu);
        for (int i = 0; i < nf; i++) MPI_Comm_free(&frees[i]);

        bool progressed = false;
        while (take) {
            mmc_dist_req *r = take;
            take = r->next;
            if (mpi_issue(r, &M.fl[M.nfl].req)) { M.fl[M.nfl++].r = r; if (!busy_since) busy_since = mmc_now(); }
            else complete(r);
            progressed = true;
        }
        for (int i = 0; i < M.nfl;) {
            int flag = 0;
            int rc = MPI_Test(&M.fl[i].req, &flag, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) { fail_req(M.fl[i].r, rc); flag = 1; }
            if (flag) {
                mmc_dist_req *r = M.fl[i].r;
                if (!r->st) post(r);
                M.fl[i] = M.fl[--M.nfl];
                complete(r);
                progressed = true;
            } else {
                i++;
            }
        }
        if (M.nfl == 0 && busy_since) { dist_stats_add_busy(mmc_now() - busy_since); busy_since = 0; }
        serve_queries();
        if (M.nfl) {
            double now = mmc_now(), oldest = now;
            mmc_dist_req *old = NULL;
            for (int i = 0; i < M.nfl; i++)
                if (M.fl[i].r->t_start < oldest) { oldest = M.fl[i].r->t_start; old = M.fl[i].r; }
            pthread_mutex_lock(&M.mu);
            double to = M.timeout;
            pthread_mutex_unlock(&M.mu);
            if (old && now - oldest > to) diagnose_and_abort(old, now - oldest);
            if (progressed) {
                backoff_ns = 0;
            } else {
                /* spin briefly, then sleep up to 200 us: latency vs. a core shared with compute */
                backoff_ns = backoff_ns ? (backoff_ns * 2 > 200000 ? 200000 : backoff_ns * 2) : 2000;
                struct timespec ts = {0, backoff_ns};
                nanosleep(&ts, NULL);
            }
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------ the callers' side */
static mmc_status mpi_start(mmc_dist_req *r) {
    if (r->op.kind == OP_ALL_TO_ALL && r->op.send == r->op.recv && r->comm->size > 1)
        return mmc_error(MMC_ERR_INVALID, "dist: all_to_all needs distinct send and recv buffers");
    if (r->op.kind == OP_SEND || r->op.kind == OP_RECV) {
        int ub_ok = r->op.tag <= 32767;
        if (!ub_ok) return mmc_error(MMC_ERR_INVALID, "dist: tag %d above 32767", r->op.tag);
    }
    pthread_mutex_lock(&M.mu);
    r->next = NULL;
    if (M.q_tail) M.q_tail->next = r; else M.q_head = r;
    M.q_tail = r;
    pthread_cond_signal(&M.cv_work);
    pthread_mutex_unlock(&M.mu);
    return MMC_OK;
}

static void mpi_wait(mmc_dist_req *r) {
    pthread_mutex_lock(&M.mu);
    while (!r->done) pthread_cond_wait(&M.cv_done, &M.mu);
    pthread_mutex_unlock(&M.mu);
}

static bool mpi_test(mmc_dist_req *r) {
    pthread_mutex_lock(&M.mu);
    bool d = r->done;
    pthread_mutex_unlock(&M.mu);
    return d;
}

static void mpi_comm_free(mmc_comm *c) {
    mpi_impl *im = c->impl;
    pthread_mutex_lock(&M.mu);
    for (int i = 0; i < M.n_reg; i++)
        if (M.reg[i] == c) { M.reg[i] = M.reg[--M.n_reg]; break; }
    if (im && M.running) {
        if (M.n_free == M.cap_free) {
            int cap = M.cap_free ? 2 * M.cap_free : 16;
            MPI_Comm *n = realloc(M.to_free, (size_t)cap * sizeof *n);
            if (n) { M.to_free = n; M.cap_free = cap; }
        }
        if (M.n_free < M.cap_free) M.to_free[M.n_free++] = im->comm;
    }
    pthread_mutex_unlock(&M.mu);
    free(im);
    c->impl = NULL;
}

static void mpi_finalize(void) {
    pthread_mutex_lock(&M.mu);
    M.stop = true;
    pthread_cond_signal(&M.cv_work);
    pthread_mutex_unlock(&M.mu);
    if (M.running) pthread_join(M.th, NULL);
    M.running = false;
    while (M.n_free) MPI_Comm_free(&M.to_free[--M.n_free]);
    free(M.to_free); M.to_free = NULL; M.cap_free = 0;
    free(M.reg); M.reg = NULL; M.n_reg = M.cap_reg = 0;
    MPI_Comm_free(&M.wd);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

static void mpi_abort(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static void mpi_set_timeout(double s) {
    pthread_mutex_lock(&M.mu);
    M.timeout = s;
    pthread_mutex_unlock(&M.mu);
}

static const dist_backend g_mpi = {"mpi", mpi_start, mpi_wait, mpi_test, mpi_comm_free, mpi_finalize, mpi_abort,
                                   mpi_set_timeout};

mmc_status dist_mpi_init(double timeout_s, mmc_comm **world) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return mmc_error(MMC_ERR_IO, "dist: MPI_Init_thread failed");
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return mmc_error(MMC_ERR_UNSUPPORTED, "dist: this MPI library offers thread level %d; mmc needs "
                         "MPI_THREAD_SERIALIZED (its communication thread makes the MPI calls)", provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &M.wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &M.wsize);
    mmc_comm *c = dist_comm_alloc(&g_mpi, M.wrank, M.wsize, "world");
    mpi_impl *im = malloc(sizeof *im);
    if (!c || !im) { free(im); mmc_comm_free(c); return mmc_error(MMC_ERR_OOM, "dist: out of memory"); }
    MPI_Comm_dup(MPI_COMM_WORLD, &im->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &M.wd);
    c->impl = im;
    c->id = 1;
    for (int i = 0; i < M.wsize; i++) c->world_ranks[i] = i;
    M.timeout = timeout_s;
    M.stop = false;
    M.nfl = 0;
    reg_add(c);
    if (pthread_create(&M.th, NULL, worker, NULL)) {
        mmc_comm_free(c);
        return mmc_error(MMC_ERR_IO, "dist: cannot start the communication thread");
    }
    M.running = true;
    *world = c;
    return MMC_OK;
}
#endif /* MMC_HAVE_MPI */
