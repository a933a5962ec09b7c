/* http.c — the HTTP front of `mmc serve` on libmicrohttpd (a thread per connection, MHD's
 * listening thread): routes GET / (the chat page, src/serve/web/chat.html compiled in), GET
 * /health, GET /v1/models[/ID], GET /metrics, POST /v1/chat/completions and /v1/completions; the
 * API key (every route but / and /health needs "Authorization: Bearer KEY", else 401); limits on body size (413) and connections;
 * slow clients (headers or body trickled, a Content-Length never fulfilled) cut off when their request has
 * not arrived within --client-timeout (MHD's own timeout is an idle one, which a byte now and then
 * defeats: a reaper thread shuts such sockets down, so the threads and connection slots they hold
 * come back); SSE
 * streaming from the job's bytes through MHD's response-from-callback, a dropped client
 * cancelling its job; graceful shutdown on SIGTERM / SIGINT (stop accepting, cancel queued
 * and running jobs, let their streams end with the final chunk and [DONE], then return).
 * Status codes and error bodies as OpenAI's API returns them. */
#include "serve_internal.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* one TCP connection (MHD's socket context): its socket (descriptor and inode: the reaper shuts it
 * down only while the descriptor still names this socket) and the time by which the request being
 * read must be in; deadline 0 while its request is handled and answered */
typedef struct conn_track {
    int fd;
    ino_t ino;
    double deadline;
    bool cut;
    struct conn_track *prev, *next;
} conn_track;

typedef struct {
    serve_engine *e;
    const mmc_serve_options *o;
    char media_root[PATH_MAX];
    bool has_media_root;
    long long started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int active;               /* requests being handled */
    atomic_int shutting_down;
    struct MHD_Daemon *d;
    pthread_mutex_t track_mu;   /* the open connections (conn_track), for the reaper */
    conn_track *tracked;
    atomic_int reaper_stop;
} server;

typedef struct {
    server *s;
    char *body;
    size_t len, cap, discarded;
    bool too_big, counted;
} conn_state;

typedef struct {
    server *s;
    serve_job *j;
    size_t off;
} stream_state;

static double client_timeout(const server *s) {
    return s->o->limits.client_timeout_seconds > 0 ? s->o->limits.client_timeout_seconds : 30;
}

/* the connection's tracker: deadline now + timeout (waiting for a request), or 0 (its request is in) */
static void set_deadline(server *s, struct MHD_Connection *c, bool waiting) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    conn_track *t = ci ? ci->socket_context : NULL;
    if (!t) return;
    pthread_mutex_lock(&s->track_mu);
    t->deadline = waiting ? mmc_now() + client_timeout(s) : 0;
    pthread_mutex_unlock(&s->track_mu);
}

/* MHD_OPTION_NOTIFY_CONNECTION: track each connection from accept to close. libmicrohttpd calls
 * CLOSED before it closes the socket; should a version do otherwise, the inode check of the reaper
 * still keeps it from shutting down a reused descriptor. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    server *s = cls;
    serve_metrics *m = serve_engine_metrics(s->e);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_track *t = ci ? calloc(1, sizeof *t) : NULL;
        *socket_context = t;
        if (!t) return;   /* untracked: MHD's idle timeout still applies */
        struct stat st;
        t->fd = ci->connect_fd;
        t->ino = fstat(t->fd, &st) == 0 ? st.st_ino : 0;
        t->deadline = mmc_now() + client_timeout(s);
        pthread_mutex_lock(&s->track_mu);
        t->next = s->tracked;
        if (s->tracked) s->tracked->prev = t;
        s->tracked = t;
        pthread_mutex_unlock(&s->track_mu);
        pthread_mutex_lock(&m->mu);
        m->connections++;
        pthread_mutex_unlock(&m->mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        conn_track *t = *socket_context;
        if (!t) return;
        pthread_mutex_lock(&s->track_mu);
        if (t->prev) t->prev->next = t->next;
        else s->tracked = t->next;
        if (t->next) t->next->prev = t->prev;
        pthread_mutex_unlock(&s->track_mu);
        free(t);
        *socket_context = NULL;
        pthread_mutex_lock(&m->mu);
        m->connections--;
        pthread_mutex_unlock(&m->mu);
    }
}

/* every 100 ms: shut down the sockets whose request is overdue; their MHD thread then reads the end
 * of the stream and closes the connection (no answer: the request never arrived) */
static void *reap_slow_clients(void *arg) {
    server *s = arg;
    while (!s->reaper_stop) {
        usleep(100 * 1000);
        double now = mmc_now();
        long long cut = 0;
        pthread_mutex_lock(&s->track_mu);
        for (conn_track *t = s->tracked; t; t = t->next)
            if (t->deadline > 0 && now > t->deadline && !t->cut) {
                struct stat st;
                if (fstat(t->fd, &st) == 0 && st.st_ino == t->ino) {
                    shutdown(t->fd, SHUT_RDWR);
                    cut++;
                }
                t->cut = true;
            }
        pthread_mutex_unlock(&s->track_mu);
        if (cut) {
            serve_metrics *m = serve_engine_metrics(s->e);
            pthread_mutex_lock(&m->mu);
            m->client_timeouts += cut;
            pthread_mutex_unlock(&m->mu);
        }
    }
    return NULL;
}

static atomic_int g_signal;   /* lock-free: async-signal-safe */
static void on_signal(int sig) { g_signal = sig; }

/* the thread that waits for SIGTERM / SIGINT, then stops accepting and stops the engine */
static void *watch_signals(void *arg) {
    server *s = arg;
    while (!g_signal) usleep(50 * 1000);
    fprintf(stderr, "mmc serve: signal %d: stopping (cancelling in-flight requests)\n", (int)g_signal);
    s->shutting_down = 1;
    MHD_quiesce_daemon(s->d);
    serve_engine_stop(s->e);   /* cancels queued and running jobs; their streams end with [DONE] */
    return NULL;
}

static enum MHD_Result send_body(server *s, struct MHD_Connection *c, int status, const char *type, char *body) {
    if (!body) body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    serve_metrics_request(serve_engine_metrics(s->e), status);
    return ret;
}

/* the chat page, generated from src/serve/web/chat.html by CMakeLists.txt */
extern const unsigned char mmc_serve_chat_html[];
extern const size_t mmc_serve_chat_html_len;

static enum MHD_Result send_page(server *s, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(mmc_serve_chat_html_len, (void *)mmc_serve_chat_html,
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/html; charset=utf-8");
    /* inline script and style only, fetches to this server, images from data: URIs */
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                            "img-src data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    serve_metrics_request(serve_engine_metrics(s->e), 200);
    return ret;
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *c, const mmc_serve_error *e) {
    return send_body(s, c, e->status ? e->status : 500, "application/json", mmc_serve_error_json(e));
}

static enum MHD_Result fail(server *s, struct MHD_Connection *c, int status, const char *type, const char *code,
                            const char *msg) {
    mmc_serve_error e;
    mmc_serve_fail(&e, status, type, NULL, code, "%s", msg);
    return send_error(s, c, &e);
}

/* constant-time comparison of the bearer token */
static bool authorized(server *s, struct MHD_Connection *c) {
    if (!s->o->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    const char *got = h + 7, *want = s->o->api_key;
    size_t gl = strlen(got), wl = strlen(want);
    unsigned char diff = gl != wl;
    for (size_t i = 0; i < wl; i++) diff |= (unsigned char)(want[i] ^ (i < gl ? got[i] : 0));
    return diff == 0;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_state *st = cls;
    serve_job *j = st->j;
    pthread_mutex_lock(&j->mu);
    while (st->off == j->sse_len && j->state != JOB_DONE) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT && st->off == j->sse_len && j->state != JOB_DONE) {
            pthread_mutex_unlock(&j->mu);
            static const char ka[] = ": keep-alive\n\n";   /* an SSE comment: finds a vanished client */
            size_t n = sizeof ka - 1 < max ? sizeof ka - 1 : max;
            memcpy(buf, ka, n);
            return (ssize_t)n;
        }
    }
    ssize_t n;
    if (st->off < j->sse_len) {
        size_t k = j->sse_len - st->off < max ? j->sse_len - st->off : max;
        memcpy(buf, j->sse + st->off, k);
        st->off += k;
        n = (ssize_t)k;
    } else
        n = MHD_CONTENT_READER_END_OF_STREAM;
    pthread_mutex_unlock(&j->mu);
    return n;
}

static void stream_free(void *cls) {
    stream_state *st = cls;
    serve_job_cancel(st->j);   /* no effect once done; stops generation for a dropped client */
    serve_job_release(st->j);
    free(st);
}

/* the client closed its end (recv would return 0) or the socket failed: no one waits for the answer */
static bool client_gone(void *user) {
    struct MHD_Connection *c = user;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* The model a request or /v1/models/ID names: 0 the base, k the adapter lora_names[k - 1], -1 none */
static int find_model(const mmc_serve_backend *b, const char *id) {
    if (!strcmp(id, b->model_id)) return 0;
    for (int k = 0; k < b->n_loras; k++)
        if (!strcmp(id, b->lora_names[k])) return k + 1;
    return -1;
}

static enum MHD_Result completion(server *s, struct MHD_Connection *c, conn_state *cs, mmc_serve_kind kind) {
    const mmc_serve_backend *b = serve_engine_backend(s->e);
    mmc_serve_request req;
    mmc_serve_error err;
    if (!mmc_serve_parse_request(cs->body ? cs->body : "", cs->len, kind, &s->o->limits,
                                 s->has_media_root ? s->media_root : NULL, &req, &err))
        return send_error(s, c, &err);
    if (req.model && (req.lora = find_model(b, req.model)) < 0) {
        mmc_serve_fail(&err, 404, "invalid_request_error", "model", "model_not_found",
                       "The model `%.200s` does not exist or you do not have access to it.", req.model);
        mmc_serve_request_free(&req);
        return send_error(s, c, &err);
    }
    bool stream = req.stream;
    serve_job *j = serve_submit(s->e, &req, &err);
    if (!j) {
        mmc_serve_request_free(&req);
        return send_error(s, c, &err);
    }
    if (stream) {
        serve_job_wait_prepared(j, client_gone, c);
        if (j->failed) {
            err = j->err;
            serve_job_release(j);
            return send_error(s, c, &err);
        }
        stream_state *st = calloc(1, sizeof *st);
        if (!st) { serve_job_cancel(j); serve_job_release(j); return MHD_NO; }
        *st = (stream_state){s, j, 0};
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st, stream_free);
        if (!r) { stream_free(st); return MHD_NO; }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r);
        serve_metrics_request(serve_engine_metrics(s->e), 200);
        return ret;
    }
    serve_job_wait_done(j, client_gone, c);
    enum MHD_Result ret;
    if (j->failed) {
        err = j->err;
        ret = send_error(s, c, &err);
    } else
        ret = send_body(s, c, 200, "application/json", serve_job_response(s->e, j));
    serve_job_release(j);
    return ret;
}

/* A model card as vLLM writes it: "root" the weights' directory, "parent" null for the base
 * model and the base's id for a LoRA adapter (k > 0: lora_names[k - 1]). */
static cJSON *model_card(server *s, int k) {
    const mmc_serve_backend *b = serve_engine_backend(s->e);
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", k ? b->lora_names[k - 1] : b->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->started);
    cJSON_AddStringToObject(m, "owned_by", "mmc");
    const char *root = k ? b->lora_dirs[k - 1] : b->model_root;
    if (root) cJSON_AddStringToObject(m, "root", root);
    else cJSON_AddNullToObject(m, "root");
    if (k) cJSON_AddStringToObject(m, "parent", b->model_id);
    else cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", (double)b->context_length);
    return m;
}

/* GET /v1/models (k < 0: the list of the base and every adapter) or /v1/models/ID (k) */
static char *model_json(server *s, int k) {
    cJSON *root;
    if (k < 0) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(root, "data");
        for (int i = 0; i <= serve_engine_backend(s->e)->n_loras; i++) cJSON_AddItemToArray(data, model_card(s, i));
    } else
        root = model_card(s, k);
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return out;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_data_size,
                               void **con_cls) {
    (void)version;
    server *s = cls;
    conn_state *cs = *con_cls;
    bool post = !strcmp(method, "POST"), get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    if (!cs) {   /* headers only: check what can be refused before the body */
        cs = calloc(1, sizeof *cs);
        if (!cs) return MHD_NO;
        cs->s = s;
        *con_cls = cs;
        pthread_mutex_lock(&s->mu);
        s->active++;
        cs->counted = true;
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&s->mu);
        bool busy = s->active > s->o->limits.max_connections;
        pthread_mutex_unlock(&s->mu);
        if (s->shutting_down)
            return fail(s, c, 503, "server_error", "server_shutting_down", "The server is shutting down.");
        if (busy)
            return fail(s, c, 503, "server_error", "too_many_connections",
                        "The server has too many open requests (--max-connections); retry later.");
        if (strcmp(url, "/health") != 0 && strcmp(url, "/") != 0 && !authorized(s, c))
            return fail(s, c, 401, "invalid_request_error", "invalid_api_key",
                        "Incorrect API key provided. Send it as 'Authorization: Bearer KEY'.");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o->limits.max_body_bytes) {
            char msg[160];
            snprintf(msg, sizeof msg, "The request body is larger than this server's limit of %zu bytes.",
                     s->o->limits.max_body_bytes);
            return fail(s, c, 413, "invalid_request_error", "request_too_large", msg);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cs->too_big || cs->len + n > s->o->limits.max_body_bytes) {
            /* a chunked body over the limit (no Content-Length to refuse it by): read on and
             * discard, answer 413 at its end; one more than twice the limit: drop the connection */
            cs->too_big = true;
            cs->discarded += n;
            return cs->discarded > 2 * s->o->limits.max_body_bytes ? MHD_NO : MHD_YES;
        }
        if (cs->len + n + 1 > cs->cap) {
            size_t cap = (cs->len + n + 1) * 2;
            if (cap > s->o->limits.max_body_bytes + 1) cap = s->o->limits.max_body_bytes + 1;
            char *p = realloc(cs->body, cap);
            if (!p) return MHD_NO;
            cs->body = p;
            cs->cap = cap;
        }
        memcpy(cs->body + cs->len, upload_data, n);
        cs->len += n;
        cs->body[cs->len] = 0;
        return MHD_YES;
    }
    set_deadline(s, c, false);   /* the request is in: answering it may take as long as it takes */
    if (cs->too_big) {
        char msg[160];
        snprintf(msg, sizeof msg, "The request body is larger than this server's limit of %zu bytes.",
                 s->o->limits.max_body_bytes);
        return fail(s, c, 413, "invalid_request_error", "request_too_large", msg);
    }
    bool chat = !strcmp(url, "/v1/chat/completions"), cmpl = !strcmp(url, "/v1/completions");
    if (!strcmp(url, "/")) {   /* public like /health: its fetches send the key the user types */
        if (!get) goto method;
        return send_page(s, c);
    }
    if (!strcmp(url, "/health")) {
        if (!get) goto method;
        return send_body(s, c, 200, "application/json", strdup("{\"status\":\"ok\"}"));
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) goto method;
        return send_body(s, c, 200, "application/json", model_json(s, -1));
    }
    if (!strncmp(url, "/v1/models/", 11)) {
        if (!get) goto method;
        int k = find_model(serve_engine_backend(s->e), url + 11);
        if (k < 0) {
            mmc_serve_error e;
            mmc_serve_fail(&e, 404, "invalid_request_error", "model", "model_not_found",
                           "The model `%.200s` does not exist or you do not have access to it.", url + 11);
            return send_error(s, c, &e);
        }
        return send_body(s, c, 200, "application/json", model_json(s, k));
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) goto method;
        return send_body(s, c, 200, "text/plain; version=0.0.4", serve_metrics_text(s->e));
    }
    if (chat || cmpl) {
        if (!post) goto method;
        return completion(s, c, cs, chat ? MMC_SERVE_CHAT : MMC_SERVE_COMPLETION);
    }
    {
        mmc_serve_error e;
        mmc_serve_fail(&e, 404, "invalid_request_error", NULL, "unknown_url", "Unknown request URL: %s %.200s.",
                       method, url);
        return send_error(s, c, &e);
    }
method : {
    mmc_serve_error e;
    mmc_serve_fail(&e, 405, "invalid_request_error", NULL, "method_not_allowed",
                   "Method %s is not allowed for %.200s.", method, url);
    return send_error(s, c, &e);
}
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    server *s = cls;
    set_deadline(s, c, true);   /* a kept-alive connection: the next request within the timeout */
    conn_state *cs = *con_cls;
    if (!cs) return;
    if (cs->counted) {
        pthread_mutex_lock(&s->mu);
        s->active--;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    free(cs->body);
    free(cs);
    *con_cls = NULL;
}

mmc_status mmc_serve_run(const mmc_serve_backend *b, const mmc_serve_options *o) {
    server s = {.o = o, .started = (long long)time(NULL)};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    pthread_mutex_init(&s.track_mu, NULL);
    if (o->media_root) {
        if (!realpath(o->media_root, s.media_root))
            return mmc_error(MMC_ERR_NOT_FOUND, "--media-root %s: %s", o->media_root, strerror(errno));
        s.has_media_root = true;
    }
    const char *host = o->host ? o->host : "127.0.0.1";
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai) return mmc_error(MMC_ERR_INVALID, "--host %s: %s", host, gai_strerror(gai));
    mmc_status st = serve_engine_start(b, o, &s.e);
    if (st) { freeaddrinfo(ai); return st; }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC |
                     (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, handler, &s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        /* MHD's idle timeout (a client that stops reading its answer) beyond the reaper's deadline, so that
         * a request that stops arriving is the reaper's (counted in mmc_client_timeouts_total) */
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->limits.max_connections + 16, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)fmax(3, ceil(client_timeout(&s)) + 2), MHD_OPTION_NOTIFY_COMPLETED, completed, &s,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, &s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        serve_engine_stop(s.e);
        serve_engine_free(s.e);
        return mmc_error(MMC_ERR_IO, "cannot listen on %s:%d (in use, or not an address of this machine?)", host,
                         o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int bound = di ? di->port : o->port;
    struct sigaction sa = {.sa_handler = on_signal}, old_term, old_int, old_pipe;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    struct sigaction ign = {.sa_handler = SIG_IGN};
    sigaction(SIGPIPE, &ign, &old_pipe);
    const char *lb = strchr(host, ':') ? "[" : "", *rb = strchr(host, ':') ? "]" : "";   /* IPv6 in a URL */
    fprintf(stderr, "mmc serve: %s on http://%s%s%s:%d (OpenAI API under /v1; Ctrl-C to stop)\n", b->model_id, lb, host,
            rb, bound);
    fprintf(stderr, "listening on http://%s%s%s:%d\n", lb, host, rb, bound);
    fflush(stderr);
    s.d = d;
    pthread_t watcher, reaper;
    if (pthread_create(&reaper, NULL, reap_slow_clients, &s)) {
        MHD_stop_daemon(d);
        serve_engine_stop(s.e);
        serve_engine_free(s.e);
        return mmc_error(MMC_ERR_IO, "cannot start the slow-client reaper thread");
    }
    if (pthread_create(&watcher, NULL, watch_signals, &s)) {
        s.reaper_stop = 1;
        pthread_join(reaper, NULL);
        MHD_stop_daemon(d);
        serve_engine_stop(s.e);
        serve_engine_free(s.e);
        return mmc_error(MMC_ERR_IO, "cannot start the signal watcher thread");
    }
    serve_engine_loop(s.e);   /* here, until a signal stops it */
    pthread_join(watcher, NULL);
    double t0 = mmc_now();
    pthread_mutex_lock(&s.mu);
    while (s.active > 0 && mmc_now() - t0 < 10) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        pthread_cond_timedwait(&s.cv, &s.mu, &ts);
    }
    pthread_mutex_unlock(&s.mu);
    s.reaper_stop = 1;
    pthread_join(reaper, NULL);
    MHD_stop_daemon(d);
    serve_engine_free(s.e);
    pthread_mutex_destroy(&s.track_mu);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
    g_signal = 0;
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
    fprintf(stderr, "mmc serve: stopped\n");
    return MMC_OK;
}
