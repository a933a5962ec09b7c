/* comm.c — the communicator front end (argument checks, requests, statistics, process
 * groups and the parallel layout) and the single-process backend. Semantics mirror MPI's
 * collectives and torch.distributed (all_reduce, reduce_scatter_tensor, all_gather_into_tensor,
 * broadcast, all_to_all_single, send/recv, barrier); the group layout mirrors Megatron-LM's
 * parallel_state (tensor fastest, then context, data, pipeline). */
#include "parallel_internal.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static mmc_comm *g_world;
static pthread_mutex_t g_stats_mu = PTHREAD_MUTEX_INITIALIZER;
static mmc_dist_stats g_stats;

/* ------------------------------------------------------------------ helpers */
size_t dist_elsize(mmc_dtype dt) { return dt == MMC_NF4 ? 0 : mmc_dtype_size(dt); }

static bool reducible(mmc_dtype dt) {
    return dt == MMC_F32 || dt == MMC_F64 || dt == MMC_I32 || dt == MMC_I64;
}

void dist_reduce_scale(void *buf, int64_t count, mmc_dtype dt, double s) {
    if (dt == MMC_F32) {
        float *p = buf, fs = (float)s;
        for (int64_t i = 0; i < count; i++) p[i] *= fs;
    } else if (dt == MMC_F64) {
        double *p = buf;
        for (int64_t i = 0; i < count; i++) p[i] *= s;
    }
}

double dist_default_timeout(void) {
    const char *e = getenv("MMC_DIST_TIMEOUT");
    double v = e ? atof(e) : 0;
    return v > 0 ? v : 600.0;
}

const char *dist_kind_name(dist_kind k) {
    static const char *n[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                              "all_to_all", "send", "recv", "barrier", "split", "all_to_all_v"};
    return n[k];
}

void dist_stats_add_busy(double s) {
    pthread_mutex_lock(&g_stats_mu);
    g_stats.busy_s += s;
    pthread_mutex_unlock(&g_stats_mu);
}

void mmc_dist_get_stats(mmc_dist_stats *s) {
    pthread_mutex_lock(&g_stats_mu);
    *s = g_stats;
    pthread_mutex_unlock(&g_stats_mu);
}

void mmc_dist_reset_stats(void) {
    pthread_mutex_lock(&g_stats_mu);
    memset(&g_stats, 0, sizeof g_stats);
    pthread_mutex_unlock(&g_stats_mu);
}

mmc_comm *dist_comm_alloc(const dist_backend *be, int rank, int size, const char *name) {
    mmc_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->world_ranks = calloc((size_t)size, sizeof *c->world_ranks);
    if (!c->world_ranks) { free(c); return NULL; }
    c->be = be;
    c->rank = rank;
    c->size = size;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "group");
    return c;
}

/* Children of one parent get ids from (parent id, split index, color): the same on every
 * member, so the watchdog can ask peers about "the same" group. */
uint64_t dist_child_id(mmc_comm *parent, int color) {
    uint64_t h = parent->id * 0x9E3779B97F4A7C15ull + (uint64_t)parent->n_splits * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)(uint32_t)color + 1;
    h ^= h >> 31;
    return h ? h : 1;
}

/* ------------------------------------------------------------------ single backend */
typedef struct msg { int tag; size_t bytes; void *data; struct msg *next; } msg;
static msg *g_mail;                   /* messages sent to self, not yet received */
static mmc_dist_req *g_pending_recv;  /* receives posted before their send */

static void single_copy(const dist_op *o) {
    size_t es = dist_elsize(o->dt), n = (size_t)o->count * es;
    if (o->send && o->recv && o->send != o->recv && n) memmove(o->recv, o->send, n);
}

static mmc_status single_start(mmc_dist_req *r) {
    dist_op *o = &r->op;
    size_t es = dist_elsize(o->dt), n = (size_t)o->count * es;
    switch (o->kind) {
    case OP_ALL_REDUCE: case OP_REDUCE_SCATTER: case OP_ALL_GATHER: case OP_ALL_TO_ALL:
        single_copy(o);   /* a sum/avg/max over one rank is the value itself */
        break;
    case OP_BROADCAST: case OP_BARRIER:
        break;
    case OP_ALL_TO_ALL_V:   /* one rank: its own block */
        if (o->v[0]) memmove((char *)o->recv + o->v[3], (const char *)o->send + o->v[1], (size_t)o->v[0]);
        break;
    case OP_SEND: {
        for (mmc_dist_req **p = &g_pending_recv; *p; p = &(*p)->next) {
            if ((*p)->op.tag == o->tag) {
                mmc_dist_req *q = *p;
                *p = q->next;
                if (n) memcpy(q->op.recv, o->send, n);
                q->done = 1;
                r->done = 1;
                return MMC_OK;
            }
        }
        msg *m = malloc(sizeof *m);
        void *d = malloc(n ? n : 1);
        if (!m || !d) { free(m); free(d); return mmc_error(MMC_ERR_OOM, "dist: out of memory queueing a send"); }
        if (n) memcpy(d, o->send, n);
        m->tag = o->tag; m->bytes = n; m->data = d; m->next = NULL;
        msg **p = &g_mail;
        while (*p) p = &(*p)->next;
        *p = m;
        break;
    }
    case OP_RECV: {
        for (msg **p = &g_mail; *p; p = &(*p)->next) {
            if ((*p)->tag == o->tag) {
                msg *m = *p;
                *p = m->next;
                if (m->bytes != n) {
                    size_t got = m->bytes;
                    free(m->data); free(m);
                    return mmc_error(MMC_ERR_INVALID, "dist: recv of %zu bytes matched a send of %zu bytes (tag %d)",
                                     n, got, o->tag);
                }
                if (n) memcpy(o->recv, m->data, n);
                free(m->data); free(m);
                r->done = 1;
                return MMC_OK;
            }
        }
        r->next = NULL;
        mmc_dist_req **p = &g_pending_recv;
        while (*p) p = &(*p)->next;
        *p = r;
        return MMC_OK;   /* completes when the matching send arrives */
    }
    case OP_SPLIT: {
        mmc_comm *c = dist_comm_alloc(r->comm->be, 0, 1, r->split_name);
        if (!c) return mmc_error(MMC_ERR_OOM, "dist: out of memory creating a group");
        c->world_ranks[0] = r->comm->world_ranks[0];
        c->id = dist_child_id(r->comm, o->peer);
        r->split_out = c;
        break;
    }
    }
    r->done = 1;
    return MMC_OK;
}

static void single_wait(mmc_dist_req *r) {
    if (!r->done) {
        /* a receive whose send never comes: with one process nothing else can send it */
        fprintf(stderr, "mmc dist: rank 0: recv (tag %d) waits for a send that this single process never "
                "made; aborting\n", r->op.tag);
        abort();
    }
}
static bool single_test(mmc_dist_req *r) { return r->done; }
static void single_comm_free(mmc_comm *c) { (void)c; }
static void single_finalize(void) {
    while (g_mail) { msg *m = g_mail; g_mail = m->next; free(m->data); free(m); }
    g_pending_recv = NULL;
}
static void single_abort(int code) { exit(code); }
static void single_set_timeout(double s) { (void)s; }

static const dist_backend g_single = {"single", single_start, single_wait, single_test, single_comm_free,
                                      single_finalize, single_abort, single_set_timeout};

/* ------------------------------------------------------------------ runtime */
bool mmc_dist_have_mpi(void) {
#ifdef MMC_HAVE_MPI
    return true;
#else
    return false;
#endif
}

bool mmc_dist_launched(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return true;
    return false;
}

mmc_status mmc_dist_init(const mmc_dist_opts *o, mmc_comm **world) {
    if (g_world) { if (world) *world = g_world; return MMC_OK; }
    mmc_dist_backend be = o ? o->backend : MMC_DIST_AUTO;
    double timeout = o && o->timeout_s > 0 ? o->timeout_s : dist_default_timeout();
    if (be == MMC_DIST_AUTO) be = mmc_dist_have_mpi() && mmc_dist_launched() ? MMC_DIST_MPI : MMC_DIST_SINGLE;
    if (be == MMC_DIST_MPI) {
#ifdef MMC_HAVE_MPI
        mmc_status st = dist_mpi_init(timeout, &g_world);
        if (st) return st;
#else
        return mmc_error(MMC_ERR_UNSUPPORTED, "dist: this mmc was built without MPI (install libopenmpi-dev and "
                         "rebuild; see scripts/bootstrap.sh)");
#endif
    } else {
        g_world = dist_comm_alloc(&g_single, 0, 1, "world");
        if (!g_world) return mmc_error(MMC_ERR_OOM, "dist: out of memory");
        g_world->id = 1;
    }
    mmc_dist_reset_stats();
    if (world) *world = g_world;
    return MMC_OK;
}

mmc_comm *mmc_dist_world(void) { return g_world; }

void mmc_dist_finalize(void) {
    if (!g_world) return;
    const dist_backend *be = g_world->be;
    mmc_comm_free(g_world);
    g_world = NULL;
    be->finalize();
}

void mmc_dist_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (g_world) g_world->be->abort(code);
    exit(code);   /* backends' abort does not return */
}

void mmc_dist_set_timeout(double s) {
    if (g_world && s > 0) g_world->be->set_timeout(s);
}

int mmc_comm_rank(const mmc_comm *c) { return c ? c->rank : 0; }
int mmc_comm_size(const mmc_comm *c) { return c ? c->size : 1; }
int mmc_comm_world_rank(const mmc_comm *c, int r) {
    MMC_CHECK(c && r >= 0 && r < c->size, "mmc_comm_world_rank: rank %d outside group of %d", r, c ? c->size : 0);
    return c->world_ranks[r];
}
const char *mmc_comm_name(const mmc_comm *c) { return c ? c->name : "none"; }
const char *mmc_comm_backend_name(const mmc_comm *c) { return c ? c->be->name : "none"; }

void mmc_comm_free(mmc_comm *c) {
    if (!c) return;
    c->be->comm_free(c);
    free(c->world_ranks);
    free(c);
}

/* ------------------------------------------------------------------ operations */
static mmc_status start_op(mmc_comm *c, const dist_op *o, mmc_dist_req **out) {
    *out = NULL;
    if (!c) return mmc_error(MMC_ERR_INVALID, "dist: %s on a NULL group (mmc_dist_init not called?)",
                             dist_kind_name(o->kind));
    const char *what = dist_kind_name(o->kind);
    size_t es = dist_elsize(o->dt);
    if (o->kind != OP_BARRIER && o->kind != OP_SPLIT) {
        if (o->count < 0) return mmc_error(MMC_ERR_INVALID, "dist: %s with negative count %lld", what, (long long)o->count);
        if (!es) return mmc_error(MMC_ERR_UNSUPPORTED, "dist: %s of dtype %s (packed types: send bytes as U8)",
                                  what, mmc_dtype_name(o->dt));
        int64_t total = o->count * (int64_t)es;
        if (o->kind == OP_REDUCE_SCATTER || o->kind == OP_ALL_GATHER || o->kind == OP_ALL_TO_ALL) total *= c->size;
        if (total > INT_MAX) return mmc_error(MMC_ERR_INVALID, "dist: %s of %lld bytes exceeds one message "
                                              "(2 GiB); split it into buckets", what, (long long)total);
    }
    if ((o->kind == OP_ALL_REDUCE || o->kind == OP_REDUCE_SCATTER)) {
        if (!reducible(o->dt)) return mmc_error(MMC_ERR_UNSUPPORTED, "dist: %s reduces F32/F64/I32/I64, not %s",
                                                what, mmc_dtype_name(o->dt));
        if (o->op == MMC_AVG && o->dt != MMC_F32 && o->dt != MMC_F64)
            return mmc_error(MMC_ERR_UNSUPPORTED, "dist: %s average of integers (use MMC_SUM)", what);
        if (o->kind == OP_REDUCE_SCATTER && o->send == o->recv && c->size > 1)
            return mmc_error(MMC_ERR_INVALID, "dist: reduce_scatter needs distinct send and recv buffers");
    }
    if ((o->kind == OP_SEND || o->kind == OP_RECV || o->kind == OP_BROADCAST) && (o->peer < 0 || o->peer >= c->size))
        return mmc_error(MMC_ERR_INVALID, "dist: %s %s rank %d outside group '%s' of %d", what,
                         o->kind == OP_BROADCAST ? "root" : "peer", o->peer, c->name, c->size);
    if ((o->kind == OP_SEND || o->kind == OP_RECV) && o->tag < 0)
        return mmc_error(MMC_ERR_INVALID, "dist: %s with negative tag %d", what, o->tag);
    mmc_dist_req *r = calloc(1, sizeof *r);
    if (!r) return mmc_error(MMC_ERR_OOM, "dist: out of memory");
    r->comm = c;
    r->op = *o;
    r->t_start = mmc_now();
    if (o->kind != OP_SEND && o->kind != OP_RECV) r->seq = __atomic_add_fetch(&c->issued, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_stats_mu);
    g_stats.ops++;
    int64_t b = o->count * (int64_t)es;
    if (o->kind == OP_REDUCE_SCATTER || o->kind == OP_ALL_TO_ALL) b *= c->size;
    if (o->kind != OP_RECV && o->kind != OP_BARRIER && o->kind != OP_SPLIT) g_stats.bytes += b;
    pthread_mutex_unlock(&g_stats_mu);
    mmc_status st = c->be->start(r);
    if (st) { free(r); return st; }
    *out = r;
    return MMC_OK;
}

static mmc_status finish(mmc_dist_req *r) {
    double t0 = mmc_now();
    r->comm->be->wait(r);
    double dt = mmc_now() - t0;
    pthread_mutex_lock(&g_stats_mu);
    g_stats.wait_s += dt;
    pthread_mutex_unlock(&g_stats_mu);
    if (r->seq) r->comm->completed = r->seq > r->comm->completed ? r->seq : r->comm->completed;
    mmc_status st = r->st;
    if (st) mmc_error(st, "%s", r->err);
    return st;
}

mmc_status mmc_dist_wait(mmc_dist_req *r) {
    if (!r) return MMC_OK;
    mmc_status st = finish(r);
    free(r);
    return st;
}

mmc_status mmc_dist_wait_all(mmc_dist_req **r, int n) {
    mmc_status first = MMC_OK;
    for (int i = 0; i < n; i++) {
        mmc_status st = mmc_dist_wait(r[i]);
        r[i] = NULL;
        if (st && !first) first = st;
    }
    return first;
}

bool mmc_dist_test(mmc_dist_req *r) { return !r || r->comm->be->test(r); }

static mmc_status run_op(mmc_comm *c, const dist_op *o) {
    mmc_dist_req *r;
    mmc_status st = start_op(c, o, &r);
    return st ? st : mmc_dist_wait(r);
}

#define OPDEF(...) dist_op o = {__VA_ARGS__}

mmc_status mmc_all_reduce_start(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt,
                                mmc_reduce_op op, mmc_dist_req **req) {
    OPDEF(.kind = OP_ALL_REDUCE, .send = send, .recv = recv, .count = count, .dt = dt, .op = op);
    return start_op(c, &o, req);
}
mmc_status mmc_reduce_scatter_start(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt,
                                    mmc_reduce_op op, mmc_dist_req **req) {
    OPDEF(.kind = OP_REDUCE_SCATTER, .send = send, .recv = recv, .count = count, .dt = dt, .op = op);
    return start_op(c, &o, req);
}
mmc_status mmc_all_gather_start(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt,
                                mmc_dist_req **req) {
    OPDEF(.kind = OP_ALL_GATHER, .send = send, .recv = recv, .count = count, .dt = dt);
    return start_op(c, &o, req);
}
mmc_status mmc_broadcast_start(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int root, mmc_dist_req **req) {
    OPDEF(.kind = OP_BROADCAST, .send = buf, .recv = buf, .count = count, .dt = dt, .peer = root);
    return start_op(c, &o, req);
}
mmc_status mmc_all_to_all_start(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt,
                                mmc_dist_req **req) {
    OPDEF(.kind = OP_ALL_TO_ALL, .send = send, .recv = recv, .count = count, .dt = dt);
    return start_op(c, &o, req);
}
mmc_status mmc_send_start(mmc_comm *c, const void *buf, int64_t count, mmc_dtype dt, int peer, int tag,
                          mmc_dist_req **req) {
    OPDEF(.kind = OP_SEND, .send = buf, .count = count, .dt = dt, .peer = peer, .tag = tag);
    return start_op(c, &o, req);
}
mmc_status mmc_recv_start(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int peer, int tag,
                          mmc_dist_req **req) {
    OPDEF(.kind = OP_RECV, .recv = buf, .count = count, .dt = dt, .peer = peer, .tag = tag);
    return start_op(c, &o, req);
}
mmc_status mmc_barrier_start(mmc_comm *c, mmc_dist_req **req) {
    OPDEF(.kind = OP_BARRIER, .dt = MMC_U8);
    return start_op(c, &o, req);
}

mmc_status mmc_all_reduce(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt, mmc_reduce_op op) {
    OPDEF(.kind = OP_ALL_REDUCE, .send = send, .recv = recv, .count = count, .dt = dt, .op = op);
    return run_op(c, &o);
}
mmc_status mmc_reduce_scatter(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt,
                              mmc_reduce_op op) {
    OPDEF(.kind = OP_REDUCE_SCATTER, .send = send, .recv = recv, .count = count, .dt = dt, .op = op);
    return run_op(c, &o);
}
mmc_status mmc_all_gather(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt) {
    OPDEF(.kind = OP_ALL_GATHER, .send = send, .recv = recv, .count = count, .dt = dt);
    return run_op(c, &o);
}
mmc_status mmc_broadcast(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int root) {
    OPDEF(.kind = OP_BROADCAST, .send = buf, .recv = buf, .count = count, .dt = dt, .peer = root);
    return run_op(c, &o);
}
mmc_status mmc_all_to_all(mmc_comm *c, const void *send, void *recv, int64_t count, mmc_dtype dt) {
    OPDEF(.kind = OP_ALL_TO_ALL, .send = send, .recv = recv, .count = count, .dt = dt);
    return run_op(c, &o);
}
mmc_status mmc_all_to_all_v(mmc_comm *c, const void *send, const int64_t *send_counts, void *recv,
                            const int64_t *recv_counts, mmc_dtype dt) {
    const int P = mmc_comm_size(c);
    const size_t es = dist_elsize(dt);
    if (!c) return mmc_error(MMC_ERR_INVALID, "dist: all_to_all_v on a NULL group (mmc_dist_init not called?)");
    if (!es) return mmc_error(MMC_ERR_UNSUPPORTED, "dist: all_to_all_v of dtype %s", mmc_dtype_name(dt));
    if (send == recv && P > 1) return mmc_error(MMC_ERR_INVALID, "dist: all_to_all_v needs distinct send and recv buffers");
    int *v = malloc(sizeof(int) * 4 * (size_t)P);
    if (!v) return mmc_error(MMC_ERR_OOM, "dist: out of memory");
    int64_t so = 0, ro = 0;
    for (int i = 0; i < P; i++) {
        if (send_counts[i] < 0 || recv_counts[i] < 0) {
            free(v);
            return mmc_error(MMC_ERR_INVALID, "dist: all_to_all_v with a negative count for rank %d", i);
        }
        v[i] = (int)(send_counts[i] * (int64_t)es); v[P + i] = (int)so;
        v[2 * P + i] = (int)(recv_counts[i] * (int64_t)es); v[3 * P + i] = (int)ro;
        so += send_counts[i] * (int64_t)es;
        ro += recv_counts[i] * (int64_t)es;
        if (so > INT_MAX || ro > INT_MAX) {
            free(v);
            return mmc_error(MMC_ERR_INVALID, "dist: all_to_all_v of more than 2 GiB; split it");
        }
    }
    OPDEF(.kind = OP_ALL_TO_ALL_V, .send = send, .recv = recv, .count = so / (int64_t)es, .dt = dt, .v = v);
    mmc_status st = run_op(c, &o);
    free(v);
    return st;
}
mmc_status mmc_send(mmc_comm *c, const void *buf, int64_t count, mmc_dtype dt, int peer, int tag) {
    OPDEF(.kind = OP_SEND, .send = buf, .count = count, .dt = dt, .peer = peer, .tag = tag);
    return run_op(c, &o);
}
mmc_status mmc_recv(mmc_comm *c, void *buf, int64_t count, mmc_dtype dt, int peer, int tag) {
    OPDEF(.kind = OP_RECV, .recv = buf, .count = count, .dt = dt, .peer = peer, .tag = tag);
    return run_op(c, &o);
}
mmc_status mmc_barrier(mmc_comm *c) {
    OPDEF(.kind = OP_BARRIER, .dt = MMC_U8);
    return run_op(c, &o);
}

/* ------------------------------------------------------------------ groups */
mmc_status mmc_comm_split(mmc_comm *parent, int color, int key, const char *name, mmc_comm **out) {
    *out = NULL;
    if (!parent) return mmc_error(MMC_ERR_INVALID, "dist: split of a NULL group");
    dist_op o = {.kind = OP_SPLIT, .dt = MMC_U8, .peer = color, .tag = key};
    mmc_dist_req *r = calloc(1, sizeof *r);
    if (!r) return mmc_error(MMC_ERR_OOM, "dist: out of memory");
    r->comm = parent;
    r->op = o;
    r->split_name = name;
    r->t_start = mmc_now();
    r->seq = __atomic_add_fetch(&parent->issued, 1, __ATOMIC_RELAXED);
    mmc_status st = parent->be->start(r);
    if (!st) st = finish(r);
    parent->n_splits++;
    if (!st) *out = color < 0 ? (mmc_comm_free(r->split_out), NULL) : r->split_out;
    free(r);
    return st;
}

mmc_status mmc_dist_layout_groups(mmc_comm *world, const mmc_dist_layout *l, mmc_dist_groups *g) {
    memset(g, 0, sizeof *g);
    int tp = l->tensor > 0 ? l->tensor : 1, cp = l->context > 0 ? l->context : 1;
    int dp = l->data > 0 ? l->data : 1, pp = l->pipeline > 0 ? l->pipeline : 1;
    int ep = l->expert > 0 ? l->expert : 1;
    int W = mmc_comm_size(world), r = mmc_comm_rank(world);
    if ((int64_t)tp * cp * dp * pp != W)
        return mmc_error(MMC_ERR_INVALID, "parallel layout: tensor %d x context %d x data %d x pipeline %d = %lld "
                         "processes, but the job has %d (world size)", tp, cp, dp, pp,
                         (long long)tp * cp * dp * pp, W);
    if (dp % ep)
        return mmc_error(MMC_ERR_INVALID, "parallel layout: expert parallel size %d does not divide data "
                         "parallel size %d", ep, dp);
    int t = r % tp, c = (r / tp) % cp, d = (r / (tp * cp)) % dp, p = r / (tp * cp * dp);
    int st_t = 1, st_c = tp, st_d = tp * cp, st_p = tp * cp * dp;
    mmc_status st;
    g->world = world;
    /* each group: color = this rank with its own coordinate zeroed; key = the coordinate */
    if ((st = mmc_comm_split(world, r - t * st_t, t, "tp", &g->tp))) goto fail;
    if ((st = mmc_comm_split(world, r - c * st_c, c, "cp", &g->cp))) goto fail;
    if ((st = mmc_comm_split(world, r - d * st_d, d, "dp", &g->dp))) goto fail;
    if ((st = mmc_comm_split(world, r - p * st_p, p, "pp", &g->pp))) goto fail;
    if ((st = mmc_comm_split(world, r - (d % ep) * st_d, d % ep, "ep", &g->ep))) goto fail;
    g->tp_rank = t; g->cp_rank = c; g->dp_rank = d; g->pp_rank = p; g->ep_rank = d % ep;
    return MMC_OK;
fail:
    mmc_dist_groups_free(g);
    return st;
}

void mmc_dist_groups_free(mmc_dist_groups *g) {
    mmc_comm_free(g->tp); mmc_comm_free(g->cp); mmc_comm_free(g->dp);
    mmc_comm_free(g->pp); mmc_comm_free(g->ep);
    memset(g, 0, sizeof *g);
}
