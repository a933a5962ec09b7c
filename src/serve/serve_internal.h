/* serve_internal.h — what the engine (engine.c) and the HTTP front (http.c) of `mmc serve`
 * share: the job (one request's life: queued -> prepared -> done, its SSE bytes and choices),
 * the engine's submit / wait / cancel / release calls, and the metrics. A batching engine
 * replaces engine.c behind these calls. */
#ifndef MMC_SERVE_INTERNAL_H
#define MMC_SERVE_INTERNAL_H

#include "mmc_serve.h"

#include <pthread.h>

#define SERVE_MAX_TOP 20
typedef struct {
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[SERVE_MAX_TOP];
    float top_lp[SERVE_MAX_TOP];
} serve_logprob;

typedef struct {
    int32_t *ids;
    int n_ids, cap_ids;
    char *text;              /* the completion so far (cut at a stop sequence) */
    size_t len, cap;
    int prefix_off, read_off;/* incremental detokenization window: ids[prefix_off:read_off] decoded */
    size_t emitted;          /* bytes of text already streamed */
    const char *finish;      /* "stop" | "length" once done */
    serve_logprob *lps;
    int n_lp, cap_lp, lp_emitted;
    char *tool_calls;        /* tools: the calls parsed from text (OpenAI's tool_calls, JSON), or NULL */
    char *content;           /* then the text outside them (NULL: none) */
} serve_choice;

typedef enum { JOB_QUEUED = 0, JOB_PREPARED, JOB_DONE } serve_job_state;

typedef struct serve_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                /* the HTTP side and the engine */
    mmc_serve_request req;
    serve_job_state state;
    bool cancelled, failed;
    mmc_serve_error err;
    int64_t n_prompt, n_completion;
    serve_choice *choices;   /* [req.n] */
    char *sse;               /* streamed bytes (SSE events), appended by the engine */
    size_t sse_len, sse_cap;
    char id[48];
    long long created;
    double t_submit;
    /* the batching engine: the prepared prompt, choices still generating, the token limit,
     * and a failure that ends every choice of a non-streamed job */
    void *prompt;
    int n_live;
    int64_t max_new;
    bool aborted;
    struct serve_job *next;
} serve_job;

#define SERVE_N_STATUS 12
#define SERVE_N_BUCKETS 12
typedef struct {
    pthread_mutex_t mu;
    long long requests[SERVE_N_STATUS];   /* by serve_status_codes[] */
    long long prompt_tokens, completion_tokens;
    long long ttft[SERVE_N_BUCKETS + 1], itl[SERVE_N_BUCKETS + 1];   /* counts per bucket, +Inf last */
    double ttft_sum, itl_sum;
    long long ttft_n, itl_n;
    long long kv_blocks_used, kv_blocks_total, running, preemptions, packed;   /* batching engine */
    long long prefix_queried, prefix_hit;   /* prompt tokens looked up in / taken from the prefix cache */
    long long kv_blocks_cached, prefix_evictions, prefill_chunks;
    long long lora_mixed_steps;
    long long vision_encodes;               /* prompts whose media ran through the model's encoders */             /* decode steps whose batch mixed models (base / adapters) */
    long long connections, client_timeouts;   /* http.c: open TCP connections, slow clients cut off */
} serve_metrics;
extern const int serve_status_codes[SERVE_N_STATUS];
extern const double serve_buckets[SERVE_N_BUCKETS];

typedef struct serve_engine serve_engine;
mmc_status serve_engine_start(const mmc_serve_backend *b, const mmc_serve_options *o, serve_engine **out);
/* Run jobs in the calling thread (mmc_serve_run's main thread: compute threads' per-thread
 * buffers live there) until serve_engine_stop and the queue is drained. */
void serve_engine_loop(serve_engine *e);
/* From any thread: refuse new jobs, cancel queued and running ones (their streams end with
 * [DONE]); serve_engine_loop returns once they are done. Free after the loop returned. */
void serve_engine_stop(serve_engine *e);
void serve_engine_free(serve_engine *e);
/* Queue a request (taken over on success). NULL and *err (429) when the queue is full, (503)
 * when shutting down. The job comes with one reference for the caller. */
serve_job *serve_submit(serve_engine *e, mmc_serve_request *req, mmc_serve_error *err);
/* Block until the job is prepared (prompt built; streaming can start) or done. gone (may be
 * NULL) is asked every 50 ms whether the client went away; if so the job is cancelled. */
void serve_job_wait_prepared(serve_job *j, bool (*gone)(void *), void *user);
void serve_job_wait_done(serve_job *j, bool (*gone)(void *), void *user);
void serve_job_cancel(serve_job *j);
void serve_job_release(serve_job *j);
/* The non-streaming body of a done job (chat.completion / text_completion), malloc'd. */
char *serve_job_response(serve_engine *e, serve_job *j);
serve_metrics *serve_engine_metrics(serve_engine *e);
int serve_engine_queue_depth(serve_engine *e);
void serve_metrics_request(serve_metrics *m, int status);
/* Prometheus text exposition, malloc'd. */
char *serve_metrics_text(serve_engine *e);
const mmc_serve_backend *serve_engine_backend(serve_engine *e);

#endif
