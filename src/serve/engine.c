/* engine.c — the engine of `mmc serve`: a bounded queue of jobs and one thread that runs them,
 * with continuous batching over a paged KV cache when the backend gives its LM, prefill and
 * sampling (see "continuous batching" below: vLLM's scheduler, simplified: decode-first steps,
 * FCFS admission, preemption of the youngest by recompute), else one at a time through the
 * backend (prepare the prompt, then each of the n choices with its own seed). Generated tokens become text the way `mmc generate` prints it (the decode of all
 * tokens so far, an incomplete UTF-8 sequence held back), cut at the first stop sequence (text
 * that may still become one is held back too), and are written to the job as OpenAI SSE
 * chunks (chat.completion.chunk / text_completion) or kept for the final body. Logprobs come
 * from the sampler's raw-logits hook (log-softmax of the model's logits, as OpenAI reports).
 * The job interface (serve_internal.h: submit -> events -> done / cancel) is what a batching
 * engine will implement in its place. */
#include "serve_internal.h"
#include "mmc_json_constraint.h"
#include "mmc_lora.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const int serve_status_codes[SERVE_N_STATUS] = {200, 400, 401, 404, 405, 408, 413, 429, 500, 503, 0, 0};
const double serve_buckets[SERVE_N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

struct serve_engine {
    const mmc_serve_backend *b;
    mmc_serve_options opt;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    serve_job *head, *tail;
    serve_job *running;
    int depth;                /* queued + running */
    bool stopping;
    serve_metrics metrics;
    uint64_t id_state;
    /* per-step scratch for logprobs */
    float *row;
    int64_t row_v;
    bool row_valid;
    /* continuous batching (the backend's lm / prefill / sampling set) */
    bool batching;
    int max_batch;
    mmc_kv_pool pool;
    struct serve_seq **run, **wait;   /* running (admission order), waiting (line order) */
    struct serve_seq *pf;             /* a text prompt part-way through its chunked prefill */
    int64_t chunk;                    /* --prefill-chunk (0: whole prompts) */
    mmc_jc_vocab *jc_vocab;           /* every token's bytes, for response_format (built on first use) */
    uint64_t call_ids;                /* tool call ids (the engine thread's) */
    int n_run, cap_run, n_wait, cap_wait;
    uint64_t n_admitted;
    int lora_on;                      /* the adapter attached to the model's linears (0: none) */
};

/* ------------------------------------------------------------------ per-request adapters
 * The backend's adapters (--lora NAME=DIR) stay loaded and detached. A prefill (or a whole
 * generation without batching) runs with its request's adapter attached to the linears, as
 * `mmc generate --adapter` does; the batched decode runs with none attached and adds each
 * sequence's own delta (mmc_qwen2_decode_batch_lora). Only the engine thread switches them. */
static void use_lora(serve_engine *e, int k) {
    if (k == e->lora_on) return;
    if (e->lora_on > 0) {
        mmc_lora_set *s = e->b->loras[e->lora_on - 1];
        for (int i = 0; i < s->n; i++)
            if (s->mods[i]->lora == &s->adapters[i]) s->mods[i]->lora = NULL;
    }
    if (k > 0) {
        mmc_lora_set *s = e->b->loras[k - 1];
        for (int i = 0; i < s->n; i++) s->mods[i]->lora = &s->adapters[i];
    }
    e->lora_on = k;
}

/* the prefix cache's key of a request: its adapter seeds the hash chain (no K/V shared across adapters) */
static mmc_kv_prefix_key prefix_key(const serve_job *j) {
    return (mmc_kv_prefix_key){.seed = j->req.lora > 0 ? (uint64_t)j->req.lora * 0x9E3779B97F4A7C15ull : 0};
}

/* ------------------------------------------------------------------ jobs */
static void job_free(serve_job *j) {
    if (j->choices)
        for (int i = 0; i < j->req.n; i++) {
            free(j->choices[i].ids);
            free(j->choices[i].text);
            free(j->choices[i].lps);
            free(j->choices[i].tool_calls);
            free(j->choices[i].content);
        }
    free(j->choices);
    free(j->sse);
    mmc_serve_request_free(&j->req);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void serve_job_release(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left == 0) job_free(j);
}

void serve_job_cancel(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    j->cancelled = true;
    pthread_mutex_unlock(&j->mu);
}

static void job_wait(serve_job *j, serve_job_state until, bool (*gone)(void *), void *user) {
    pthread_mutex_lock(&j->mu);
    while (j->state < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) && gone && !j->cancelled && j->state < until) {
            pthread_mutex_unlock(&j->mu);
            bool g = gone(user);
            pthread_mutex_lock(&j->mu);
            if (g) j->cancelled = true;
        }
    }
    pthread_mutex_unlock(&j->mu);
}

void serve_job_wait_prepared(serve_job *j, bool (*gone)(void *), void *user) { job_wait(j, JOB_PREPARED, gone, user); }
void serve_job_wait_done(serve_job *j, bool (*gone)(void *), void *user) { job_wait(j, JOB_DONE, gone, user); }

static void job_set_state(serve_job *j, serve_job_state s) {
    pthread_mutex_lock(&j->mu);
    j->state = s;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static bool job_cancelled(serve_job *j) {
    pthread_mutex_lock(&j->mu);
    bool c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

/* append one SSE event "data: <json>\n\n" (json freed) */
static void sse_event(serve_job *j, char *json) {
    if (!json) return;
    size_t n = strlen(json) + 8;
    pthread_mutex_lock(&j->mu);
    if (j->sse_len + n + 1 > j->sse_cap) {
        size_t cap = (j->sse_len + n + 1) * 2;
        char *p = realloc(j->sse, cap);
        if (!p) { pthread_mutex_unlock(&j->mu); free(json); return; }
        j->sse = p;
        j->sse_cap = cap;
    }
    j->sse_len += (size_t)sprintf(j->sse + j->sse_len, "data: %s\n\n", json);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    free(json);
}

/* ------------------------------------------------------------------ submit */
serve_job *serve_submit(serve_engine *e, mmc_serve_request *req, mmc_serve_error *err) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j) { mmc_serve_fail(err, 500, "server_error", NULL, NULL, "out of memory"); return NULL; }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->created = (long long)time(NULL);
    j->t_submit = mmc_now();
    pthread_mutex_lock(&e->mu);
    if (e->stopping || e->depth >= e->opt.limits.max_queue) {
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping) mmc_serve_fail(err, 503, "server_error", NULL, "server_shutting_down", "The server is shutting down.");
        else mmc_serve_fail(err, 429, "rate_limit_exceeded", NULL, "rate_limit_exceeded",
                            "The server is busy (%d requests queued or running); retry later.", e->opt.limits.max_queue);
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j);
        return NULL;
    }
    e->id_state = e->id_state * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r1 = e->id_state ^ (uint64_t)j->t_submit * 1000003u;
    e->id_state = e->id_state * 6364136223846793005ull + 1442695040888963407ull;
    snprintf(j->id, sizeof j->id, "%s-%016llx%08llx", req->kind == MMC_SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)r1, (unsigned long long)(e->id_state >> 32));
    j->req = *req;
    memset(req, 0, sizeof *req);
    if (e->tail) e->tail->next = j;
    else e->head = j;
    e->tail = j;
    e->depth++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return j;
}

/* ------------------------------------------------------------------ chunks */
static cJSON *usage_json(const serve_job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)j->n_completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(j->n_prompt + j->n_completion));
    return u;
}

static cJSON *obj_head(const serve_engine *e, const serve_job *j, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", e->b->model_id);
    cJSON_AddNullToObject(o, "system_fingerprint");
    return o;
}

static char *token_str(const serve_engine *e, int32_t id) {
    char *s = NULL;
    if (mmc_tokenizer_decode(e->b->tok, &id, 1, false, &s) != MMC_OK) return NULL;
    return s;
}

/* logprobs of entries [from, to): chat's {"content": [...]} or completions' legacy object */
static cJSON *logprobs_json(const serve_engine *e, const serve_job *j, const serve_choice *c, int from, int to,
                            size_t text_offset) {
    if (!j->req.logprobs) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (j->req.kind == MMC_SERVE_CHAT) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        cJSON_AddNullToObject(o, "refusal");
        for (int i = from; i < to; i++) {
            const serve_logprob *l = &c->lps[i];
            for (int k = -1; k < (i >= 0 ? l->n_top : 0); k++) {
                int32_t id = k < 0 ? l->id : l->top_id[k];
                char *s = token_str(e, id);
                cJSON *t = cJSON_CreateObject();
                cJSON_AddStringToObject(t, "token", s ? s : "");
                cJSON_AddNumberToObject(t, "logprob", k < 0 ? l->lp : l->top_lp[k]);
                cJSON *bytes = cJSON_AddArrayToObject(t, "bytes");
                for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++)
                    cJSON_AddItemToArray(bytes, cJSON_CreateNumber(*p));
                free(s);
                if (k < 0) {
                    cJSON_AddItemToArray(content, t);
                    cJSON_AddArrayToObject(t, "top_logprobs");
                } else
                    cJSON_AddItemToArray(cJSON_GetObjectItem(cJSON_GetArrayItem(content, cJSON_GetArraySize(content) - 1),
                                                             "top_logprobs"), t);
            }
        }
    } else {
        cJSON *toks = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
        cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
        size_t off = text_offset;
        for (int i = from; i < to; i++) {
            const serve_logprob *l = &c->lps[i];
            char *s = token_str(e, l->id);
            cJSON_AddItemToArray(toks, cJSON_CreateString(s ? s : ""));
            cJSON_AddItemToArray(lps, cJSON_CreateNumber(l->lp));
            cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
            off += s ? strlen(s) : 0;
            free(s);
            cJSON *t = cJSON_CreateObject();
            for (int k = 0; k < l->n_top; k++) {
                char *ts = token_str(e, l->top_id[k]);
                cJSON_AddNumberToObject(t, ts ? ts : "", l->top_lp[k]);
                free(ts);
            }
            cJSON_AddItemToArray(tops, t);
        }
    }
    return o;
}

/* one streamed chunk for choice idx: delta text (may be NULL), role on the first, finish */
static void emit_chunk(serve_engine *e, serve_job *j, int idx, const char *delta, size_t n_delta, bool role,
                       const char *finish) {
    bool chat = j->req.kind == MMC_SERVE_CHAT;
    serve_choice *c = &j->choices[idx];
    cJSON *o = obj_head(e, j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *chs = cJSON_AddArrayToObject(o, "choices"), *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(chs, ch);
    cJSON_AddNumberToObject(ch, "index", idx);
    char *text = malloc(n_delta + 1);
    if (text) { memcpy(text, delta ? delta : "", n_delta); text[n_delta] = 0; }
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(ch, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (delta || role) cJSON_AddStringToObject(d, "content", text ? text : "");
    } else
        cJSON_AddStringToObject(ch, "text", text ? text : "");
    free(text);
    if (j->req.logprobs && !role && c->lp_emitted < c->n_lp && (delta || finish)) {
        cJSON_AddItemToObject(ch, "logprobs", logprobs_json(e, j, c, c->lp_emitted, c->n_lp, c->emitted - n_delta));
        c->lp_emitted = c->n_lp;
    } else
        cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (j->req.include_usage) cJSON_AddNullToObject(o, "usage");
    sse_event(j, cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
}

char *serve_job_response(serve_engine *e, serve_job *j) {
    bool chat = j->req.kind == MMC_SERVE_CHAT;
    cJSON *o = obj_head(e, j, chat ? "chat.completion" : "text_completion");
    cJSON *chs = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < j->req.n; i++) {
        serve_choice *c = &j->choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddItemToArray(chs, ch);
        cJSON_AddNumberToObject(ch, "index", i);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            cJSON *calls = c->tool_calls ? cJSON_Parse(c->tool_calls) : NULL;
            if (calls && !c->content) cJSON_AddNullToObject(m, "content");
            else cJSON_AddStringToObject(m, "content", calls ? c->content : c->text ? c->text : "");
            cJSON_AddNullToObject(m, "refusal");
            if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
        } else
            cJSON_AddStringToObject(ch, "text", c->text ? c->text : "");
        cJSON_AddItemToObject(ch, "logprobs", logprobs_json(e, j, c, 0, c->n_lp, 0));
        cJSON_AddStringToObject(ch, "finish_reason", c->finish ? c->finish : "stop");
    }
    cJSON_AddItemToObject(o, "usage", usage_json(j));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* ------------------------------------------------------------------ running a job */
typedef struct {
    serve_engine *e;
    serve_job *j;
    serve_choice *c;
    int idx, max_new;
    bool stopped;             /* by a stop sequence, cancellation or the time limit */
    const char *finish;
    double t_last;
} run_ctx;

static void observe(long long *counts, double *sum, long long *n, double v, pthread_mutex_t *mu) {
    pthread_mutex_lock(mu);
    int b = 0;
    while (b < SERVE_N_BUCKETS && v > serve_buckets[b]) b++;
    counts[b]++;
    *sum += v;
    ++*n;
    pthread_mutex_unlock(mu);
}

static void on_logits(void *user, const float *logits, int64_t V) {
    run_ctx *r = user;
    serve_engine *e = r->e;
    if (e->row_v < V) {
        float *p = realloc(e->row, (size_t)V * sizeof *p);
        if (!p) return;
        e->row = p;
        e->row_v = V;
    }
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) mx = fmaxf(mx, logits[i]);
    double s = 0;
    for (int64_t i = 0; i < V; i++) s += exp((double)logits[i] - mx);
    float lse = mx + (float)log(s);
    for (int64_t i = 0; i < V; i++) e->row[i] = logits[i] - lse;
    e->row_valid = true;
}

/* the longest suffix of text[0:len) that is a proper prefix of a stop string */
static size_t stop_holdback(const mmc_serve_request *q, const char *text, size_t len) {
    size_t hold = 0;
    for (int s = 0; s < q->n_stop; s++) {
        size_t sl = strlen(q->stop[s]);
        for (size_t k = sl - 1; k > hold; k--)
            if (k <= len && !memcmp(text + len - k, q->stop[s], k)) { hold = k; break; }
    }
    return hold;
}

static bool text_append(serve_choice *c, const char *s, size_t n) {
    if (c->len + n + 1 > c->cap) {
        size_t cap = (c->len + n + 1) * 2;
        char *p = realloc(c->text, cap);
        if (!p) return false;
        c->text = p;
        c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = 0;
    return true;
}

/* ------------------------------------------------------------------ tool calls
 * Qwen / Hermes style (the tool-call format of the chat templates mmc serves with tools): each
 * call is "<tool_call>" {"name": ..., "arguments": {...}} "</tool_call>" in the answer. With
 * tools (tool_choice not "none") the text from the first "<tool_call>" on is held back while
 * streaming; at the end the calls become OpenAI's tool_calls (arguments as a JSON string, ids
 * call_<hex>), the text outside them the content (null when empty), finish_reason "tool_calls".
 * An answer whose blocks do not parse stays plain text. */
#define TOOL_OPEN "<tool_call>"
#define TOOL_CLOSE "</tool_call>"

static bool tools_parsed(const mmc_serve_request *q) {
    return q->kind == MMC_SERVE_CHAT && q->tools && q->tool_choice != MMC_SERVE_TOOLS_NONE;
}

/* where a tool call starts (or may start: a proper prefix of "<tool_call>" at the end), else len */
static size_t tool_call_start(const char *text, size_t len) {
    const char *p = text ? strstr(text, TOOL_OPEN) : NULL;
    if (p && (size_t)(p - text) < len) return (size_t)(p - text);
    const size_t k = sizeof TOOL_OPEN - 1;
    for (size_t n = k - 1; n > 0; n--)
        if (n <= len && !memcmp(text + len - n, TOOL_OPEN, n)) return len - n;
    return len;
}

/* parse c->text: true with c->tool_calls / c->content set when at least one call parses */
static bool tool_calls_parse(serve_choice *c, uint64_t *id_state) {
    const char *t = c->text ? c->text : "";
    cJSON *calls = cJSON_CreateArray();
    char *rest = malloc(strlen(t) + 1);
    size_t nr = 0;
    if (!calls || !rest) { cJSON_Delete(calls); free(rest); return false; }
    const char *p = t;
    for (;;) {
        const char *a = strstr(p, TOOL_OPEN), *b = a ? strstr(a, TOOL_CLOSE) : NULL;
        if (!a || !b) break;
        cJSON *o = cJSON_ParseWithLength(a + sizeof TOOL_OPEN - 1, (size_t)(b - a) - (sizeof TOOL_OPEN - 1));
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
        if (!args) args = cJSON_GetObjectItemCaseSensitive(o, "parameters");
        if (!cJSON_IsString(nm)) { cJSON_Delete(o); break; }
        memcpy(rest + nr, p, (size_t)(a - p));
        nr += (size_t)(a - p);
        cJSON *call = cJSON_CreateObject(), *fn;
        char id[40];
        *id_state = *id_state * 6364136223846793005ull + 1442695040888963407ull;
        snprintf(id, sizeof id, "call_%016llx", (unsigned long long)(*id_state ^ (*id_state >> 29)));
        cJSON_AddStringToObject(call, "id", id);
        cJSON_AddStringToObject(call, "type", "function");
        fn = cJSON_AddObjectToObject(call, "function");
        cJSON_AddStringToObject(fn, "name", nm->valuestring);
        char *as = cJSON_IsString(args) ? strdup(args->valuestring) : args ? cJSON_PrintUnformatted(args) : strdup("{}");
        cJSON_AddStringToObject(fn, "arguments", as ? as : "{}");
        free(as);
        cJSON_AddItemToArray(calls, call);
        cJSON_Delete(o);
        p = b + sizeof TOOL_CLOSE - 1;
    }
    if (cJSON_GetArraySize(calls) == 0) { cJSON_Delete(calls); free(rest); return false; }
    size_t tail = strlen(p);
    memcpy(rest + nr, p, tail);
    nr += tail;
    size_t s0 = 0;
    while (s0 < nr && (rest[s0] == ' ' || rest[s0] == '\n' || rest[s0] == '\t' || rest[s0] == '\r')) s0++;
    while (nr > s0 && (rest[nr - 1] == ' ' || rest[nr - 1] == '\n' || rest[nr - 1] == '\t' || rest[nr - 1] == '\r')) nr--;
    memmove(rest, rest + s0, nr - s0);
    rest[nr - s0] = 0;
    c->tool_calls = cJSON_PrintUnformatted(calls);
    cJSON_Delete(calls);
    if (nr > s0) c->content = rest;
    else free(rest);
    return c->tool_calls != NULL;
}

/* the end of a choice with tools: its calls parsed; streamed as one tool_calls delta, or the
 * held-back text when none parses */
static void tool_finish(serve_engine *e, serve_job *j, run_ctx *r) {
    if (!tools_parsed(&j->req)) return;
    serve_choice *c = r->c;
    if (!tool_calls_parse(c, &e->call_ids)) {
        if (j->req.stream && c->emitted < c->len) {
            size_t at = c->emitted;
            c->emitted = c->len;
            emit_chunk(e, j, r->idx, c->text + at, c->len - at, false, NULL);
        }
        return;
    }
    r->finish = "tool_calls";
    if (!j->req.stream) return;
    cJSON *o = obj_head(e, j, "chat.completion.chunk");
    cJSON *ch = cJSON_CreateObject(), *calls = cJSON_Parse(c->tool_calls), *call;
    cJSON_AddItemToArray(cJSON_AddArrayToObject(o, "choices"), ch);
    cJSON_AddNumberToObject(ch, "index", r->idx);
    int k = 0;
    cJSON_ArrayForEach(call, calls) cJSON_AddItemToObject(call, "index", cJSON_CreateNumber(k++));
    cJSON_AddItemToObject(cJSON_AddObjectToObject(ch, "delta"), "tool_calls", calls);
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddNullToObject(ch, "finish_reason");
    if (j->req.include_usage) cJSON_AddNullToObject(o, "usage");
    sse_event(j, cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
}

/* Incremental detokenization (the decode of a window of recent tokens minus the decode of its
 * older part, as vLLM and transformers' TextStreamer do; a window ending in an incomplete UTF-8
 * sequence waits for more): O(window) per token instead of decoding everything again. Then the
 * stop strings (searched only where a new match can start), and what is safe is streamed.
 * True when a stop string hit. */
static bool update_text(run_ctx *r, bool final) {
    serve_engine *e = r->e;
    serve_job *j = r->j;
    serve_choice *c = r->c;
    char *pre = NULL, *cur = NULL;
    size_t old = c->len;
    if (mmc_tokenizer_decode(e->b->tok, c->ids + c->prefix_off, c->read_off - c->prefix_off, true, &pre) == MMC_OK &&
        mmc_tokenizer_decode(e->b->tok, c->ids + c->prefix_off, c->n_ids - c->prefix_off, true, &cur) == MMC_OK) {
        size_t pl = strlen(pre), cl = strlen(cur);
        bool incomplete = cl >= 3 && !memcmp(cur + cl - 3, "\xEF\xBF\xBD", 3);
        if (cl > pl && (final || !incomplete) && text_append(c, cur + pl, cl - pl)) {
            c->prefix_off = c->read_off;
            c->read_off = c->n_ids;
        }
    }
    free(pre);
    free(cur);
    if (!c->text && !text_append(c, "", 0)) return false;
    size_t maxstop = 0;
    for (int s = 0; s < j->req.n_stop; s++)
        if (strlen(j->req.stop[s]) > maxstop) maxstop = strlen(j->req.stop[s]);
    size_t from = old + 1 > maxstop ? old + 1 - maxstop : 0, cut = c->len;
    bool hit = false;
    for (int s = 0; s < j->req.n_stop; s++) {
        char *p = strstr(c->text + from, j->req.stop[s]);
        if (p && (size_t)(p - c->text) < cut) { cut = (size_t)(p - c->text); hit = true; }
    }
    if (hit) { c->len = cut; c->text[cut] = 0; }
    size_t safe = hit || final ? c->len : c->len - stop_holdback(&j->req, c->text, c->len);
    if (tools_parsed(&j->req)) {   /* a tool call is not streamed as text: held from "<tool_call>" on */
        size_t at = tool_call_start(c->text, c->len);
        if (safe > at) safe = at;
    }
    if (safe < c->emitted) safe = c->emitted;   /* never take back streamed text */
    if (j->req.stream && safe > c->emitted) {
        size_t at = c->emitted;
        c->emitted = safe;
        emit_chunk(e, j, r->idx, c->text + at, safe - at, false, NULL);
    }
    return hit;
}

static bool on_token(void *user, int32_t tok) {
    run_ctx *r = user;
    serve_engine *e = r->e;
    serve_job *j = r->j;
    serve_choice *c = r->c;
    double now = mmc_now();
    if (c->n_ids == 0) observe(e->metrics.ttft, &e->metrics.ttft_sum, &e->metrics.ttft_n, now - j->t_submit, &e->metrics.mu);
    else observe(e->metrics.itl, &e->metrics.itl_sum, &e->metrics.itl_n, now - r->t_last, &e->metrics.mu);
    r->t_last = now;
    if (c->n_ids == c->cap_ids) {
        int cap = c->cap_ids ? c->cap_ids * 2 : 64;
        int32_t *p = realloc(c->ids, (size_t)cap * sizeof *p);
        if (!p) return false;
        c->ids = p;
        c->cap_ids = cap;
    }
    c->ids[c->n_ids++] = tok;
    j->n_completion++;
    if (j->req.logprobs && e->row_valid) {
        if (c->n_lp == c->cap_lp) {
            int cap = c->cap_lp ? c->cap_lp * 2 : 64;
            serve_logprob *p = realloc(c->lps, (size_t)cap * sizeof *p);
            if (!p) return false;
            c->lps = p;
            c->cap_lp = cap;
        }
        serve_logprob *l = &c->lps[c->n_lp++];
        memset(l, 0, sizeof *l);
        l->id = tok;
        l->lp = e->row[tok];
        int k = j->req.top_logprobs < SERVE_MAX_TOP ? j->req.top_logprobs : SERVE_MAX_TOP, have = 0;
        for (int64_t v = 0; v < e->row_v && k > 0; v++) {   /* one pass, a sorted top-k (ties: lower id first) */
            float x = e->row[v];
            if (x == -INFINITY || (have == k && x <= l->top_lp[k - 1])) continue;   /* masked tokens are no alternative */
            int at = have < k ? have++ : k - 1;
            while (at > 0 && l->top_lp[at - 1] < x) {
                l->top_lp[at] = l->top_lp[at - 1];
                l->top_id[at] = l->top_id[at - 1];
                at--;
            }
            l->top_lp[at] = x;
            l->top_id[at] = (int32_t)v;
        }
        l->n_top = have;
        e->row_valid = false;
    }
    if (update_text(r, false)) { r->stopped = true; r->finish = "stop"; return false; }
    if (job_cancelled(j)) { r->stopped = true; r->finish = "stop"; return false; }
    if (now - j->t_submit > e->opt.limits.max_request_seconds) { r->stopped = true; r->finish = "length"; return false; }
    return true;
}

/* Render the prompt and settle the token limit: true with *prompt and *max_new_out, else
 * false with *err (the job is not yet prepared). */
static bool job_prepare(serve_engine *e, serve_job *j, void **prompt_out, int64_t *max_new_out,
                        mmc_serve_error *err_out) {
    const mmc_serve_backend *b = e->b;
    mmc_serve_request *q = &j->req;
    void *prompt = NULL;
    int64_t n_prompt = 0, def_max = -1;
    mmc_serve_error err = {0};
    if (!b->prepare(b->self, q, &prompt, &n_prompt, &def_max, &err)) goto fail;
    int64_t ctx = b->context_length, lim_prompt = e->opt.limits.max_prompt_tokens;
    if (lim_prompt <= 0 || lim_prompt > ctx - 1) lim_prompt = ctx - 1;
    if (n_prompt > lim_prompt) {
        mmc_serve_fail(&err, 400, "invalid_request_error", "messages", "context_length_exceeded",
                       "This model's maximum context length is %lld tokens (prompts up to %lld). However, your "
                       "messages resulted in %lld tokens. Please reduce the length of the messages.",
                       (long long)ctx, (long long)lim_prompt, (long long)n_prompt);
        goto fail;
    }
    int64_t max_new;
    if (q->max_tokens > 0) {
        max_new = q->max_tokens;
        if (max_new > e->opt.limits.max_output_tokens) {
            mmc_serve_fail(&err, 400, "invalid_request_error", "max_tokens", "invalid_value",
                           "max_tokens is too large: %lld. This server supports at most %d completion tokens.",
                           (long long)max_new, e->opt.limits.max_output_tokens);
            goto fail;
        }
        if (n_prompt + max_new > ctx) {
            mmc_serve_fail(&err, 400, "invalid_request_error", "max_tokens", "context_length_exceeded",
                           "This model's maximum context length is %lld tokens. However, you requested %lld tokens "
                           "(%lld in the messages, %lld in the completion). Please reduce the length of the "
                           "messages or completion.", (long long)ctx, (long long)(n_prompt + max_new),
                           (long long)n_prompt, (long long)max_new);
            goto fail;
        }
    } else {
        max_new = def_max > 0 ? def_max : e->opt.limits.max_output_tokens;
        if (max_new > e->opt.limits.max_output_tokens) max_new = e->opt.limits.max_output_tokens;
        if (max_new > ctx - n_prompt) max_new = ctx - n_prompt;
    }
    j->n_prompt = n_prompt;
    j->choices = calloc((size_t)q->n, sizeof *j->choices);
    if (!j->choices) { mmc_serve_fail(&err, 500, "server_error", NULL, NULL, "out of memory"); goto fail; }
    *prompt_out = prompt;
    *max_new_out = max_new;
    return true;
fail:
    if (prompt) b->release(b->self, prompt);
    *err_out = err;
    return false;
}

static void job_fail(serve_job *j, const mmc_serve_error *err) {
    pthread_mutex_lock(&j->mu);
    j->failed = true;
    j->err = *err;
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void run_job(serve_engine *e, serve_job *j) {
    const mmc_serve_backend *b = e->b;
    mmc_serve_request *q = &j->req;
    void *prompt = NULL;
    int64_t max_new = 0;
    mmc_serve_error err = {0};
    if (q->json_schema) {
        bool tool = q->tool_choice == MMC_SERVE_TOOLS_REQUIRED;
        mmc_serve_fail(&err, 400, "invalid_request_error", tool ? "tool_choice" : "response_format",
                       "unsupported_parameter", "%s needs the batching engine (constrained decoding), which this "
                       "server does not run (--no-batching, or a model without a batched decode).",
                       tool ? "tool_choice 'required' or a named function" : "response_format json_object / json_schema");
        job_fail(j, &err);
        return;
    }
    if (!job_prepare(e, j, &prompt, &max_new, &err)) { job_fail(j, &err); return; }
    job_set_state(j, JOB_PREPARED);
    use_lora(e, q->lora);
    uint64_t seed = q->has_seed ? (uint64_t)q->seed : ((uint64_t)time(NULL) << 20) ^ (uint64_t)(mmc_now() * 1e6);
    for (int i = 0; i < q->n; i++) {
        run_ctx r = {.e = e, .j = j, .c = &j->choices[i], .idx = i, .max_new = (int)max_new, .t_last = mmc_now()};
        if (q->stream) emit_chunk(e, j, i, NULL, 0, q->kind == MMC_SERVE_CHAT, NULL);
        mmc_serve_gen g = {.max_new = (int)max_new, .seed = seed + (uint64_t)i, .on_token = on_token,
                           .on_logits = q->logprobs ? on_logits : NULL, .user = &r};
        e->row_valid = false;
        mmc_status st = job_cancelled(j) ? MMC_OK : b->generate(b->self, prompt, q, &g);
        if (st) {
            mmc_serve_fail(&err, 500, "server_error", NULL, NULL, "generation failed: %s", mmc_last_error());
            if (!q->stream) goto fail;
            r.finish = "stop";   /* headers are out: end the stream */
        }
        if (!r.stopped) {   /* EOS, or max_new: the held-back rest (a stop string may complete in it) */
            bool hit = update_text(&r, true);
            r.finish = hit || r.c->n_ids < max_new ? "stop" : "length";
        }
        tool_finish(e, j, &r);
        r.c->finish = r.finish;
        if (q->stream) emit_chunk(e, j, i, NULL, 0, false, r.finish);
    }
    pthread_mutex_lock(&e->metrics.mu);
    e->metrics.prompt_tokens += j->n_prompt;
    e->metrics.completion_tokens += j->n_completion;
    pthread_mutex_unlock(&e->metrics.mu);
    if (q->stream) {
        if (q->include_usage) {
            cJSON *o = obj_head(e, j, q->kind == MMC_SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
            cJSON_AddArrayToObject(o, "choices");
            cJSON_AddItemToObject(o, "usage", usage_json(j));
            sse_event(j, cJSON_PrintUnformatted(o));
            cJSON_Delete(o);
        }
        sse_event(j, strdup("[DONE]"));
    }
    if (prompt) b->release(b->self, prompt);
    job_set_state(j, JOB_DONE);
    return;
fail:
    if (prompt) b->release(b->self, prompt);
    pthread_mutex_lock(&j->mu);
    j->failed = true;
    j->err = err;
    j->state = JOB_DONE;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ------------------------------------------------------------------ continuous batching
 * Each choice of a request is a sequence. Every step the engine (1) takes new jobs off the
 * queue and prepares them, (2) ends sequences whose client left, whose job failed or whose
 * time is up, (3) admits waiting sequences while blocks allow: the model's own prefill of the
 * prompt (images included) into a contiguous cache, copied into the paged pool, and the first
 * token sampled from its logits, and (4) decodes every running sequence together
 * (mmc_qwen2_decode_batch: one GEMM per weight for the whole batch, attention per sequence
 * through its block table), each sampling with its own sampler (seed, temperature,
 * penalties). When a running sequence needs a block and none is free, the youngest running
 * sequence is preempted by recompute: its blocks are freed and it goes back to the front of
 * the waiting line with its tokens; readmitted, its prompt is prefilled again and its
 * generated tokens replayed through the batched decode (logits ignored) before it samples
 * again. Admission is in arrival order and preempted sequences come first, so none starves.
 * Text-only prompts take another way in (admit_text): the longest cached prefix of full blocks
 * from the pool's prefix cache (vLLM's automatic prefix caching), then the rest prefilled over
 * a contiguous copy of the sequence's positions, all at once or, with --prefill-chunk, a
 * chunk per step while the others keep decoding (the sequence waits in e->pf between steps);
 * its full prompt blocks then join the cache. A preempted text sequence recomputes its whole
 * history this way. Image prompts (Qwen2-VL, LLaVA, InternVL) go this way too when the backend hashes them
 * (media_hash): their blocks are keyed by the images' content hashes as well, and the part
 * after a cached prefix is prefilled from the backend's embeddings (media_inputs: vision
 * features from its encoder cache, or the tower). With response_format, each choice's
 * logits are masked by its JSON automaton (json_constraint.c) before sampling, and it ends
 * when the value is complete. */
typedef struct serve_seq {
    run_ctx r;
    mmc_gen_opts go;
    int32_t eos[MMC_GEN_MAX_EOS];
    mmc_sampler smp;
    bool smp_ok;
    int32_t *hist;              /* prompt + generated tokens */
    int64_t n_hist, n_prompt;
    mmc_kv_seq kv;
    int64_t base;               /* cache positions minus prompt tokens (a model that expands its prompt) */
    int64_t rope_delta;
    uint64_t order;             /* admission order: the largest is the youngest */
    mmc_kv_cache stage;         /* text prompts: the contiguous cache of a prefill in progress */
    bool staged;
    mmc_jc_state *jc;           /* response_format: the JSON automaton of this choice's text */
} serve_seq;

static void metrics_kv(serve_engine *e) {
    pthread_mutex_lock(&e->metrics.mu);
    e->metrics.kv_blocks_used = e->pool.n_blocks - e->pool.n_free;
    e->metrics.kv_blocks_total = e->pool.n_blocks;
    e->metrics.running = e->n_run;
    e->metrics.kv_blocks_cached = e->pool.n_lru;
    e->metrics.prefix_evictions = e->pool.prefix_evictions;
    pthread_mutex_unlock(&e->metrics.mu);
}

static void job_complete(serve_engine *e, serve_job *j) {
    mmc_serve_request *q = &j->req;
    pthread_mutex_lock(&e->metrics.mu);
    e->metrics.prompt_tokens += j->n_prompt;
    e->metrics.completion_tokens += j->n_completion;
    pthread_mutex_unlock(&e->metrics.mu);
    if (j->aborted && !q->stream) {
        if (j->prompt) e->b->release(e->b->self, j->prompt);
        job_fail(j, &j->err);
    } else {
        if (q->stream) {
            if (q->include_usage) {
                cJSON *o = obj_head(e, j, q->kind == MMC_SERVE_CHAT ? "chat.completion.chunk" : "text_completion");
                cJSON_AddArrayToObject(o, "choices");
                cJSON_AddItemToObject(o, "usage", usage_json(j));
                sse_event(j, cJSON_PrintUnformatted(o));
                cJSON_Delete(o);
            }
            sse_event(j, strdup("[DONE]"));
        }
        if (j->prompt) e->b->release(e->b->self, j->prompt);
        job_set_state(j, JOB_DONE);
    }
    j->prompt = NULL;
    pthread_mutex_lock(&e->mu);
    e->depth--;
    pthread_mutex_unlock(&e->mu);
    serve_job_release(j);
}

/* end a sequence (finish NULL: EOS or the limit, decided here) */
static void seq_finish(serve_engine *e, serve_seq *s, const char *finish) {
    run_ctx *r = &s->r;
    serve_job *j = r->j;
    if (finish) { r->stopped = true; r->finish = finish; }
    if (!r->stopped) {
        bool hit = update_text(r, true);
        r->finish = hit || r->c->n_ids < r->max_new ? "stop" : "length";
    }
    if (!j->aborted) tool_finish(e, j, r);
    r->c->finish = r->finish;
    if (j->req.stream) emit_chunk(e, j, r->idx, NULL, 0, false, r->finish);
    if (s->staged) mmc_kv_cache_free(&s->stage);
    if (e->pf == s) e->pf = NULL;
    mmc_jc_state_free(s->jc);
    mmc_kv_seq_free(&e->pool, &s->kv);
    metrics_kv(e);
    if (s->smp_ok) mmc_sampler_free(&s->smp);
    free(s->hist);
    free(s);
    if (--j->n_live == 0) job_complete(e, j);
}

static void seq_abort(serve_engine *e, serve_seq *s, const char *what) {
    serve_job *j = s->r.j;
    if (!j->aborted) {
        mmc_serve_fail(&j->err, 500, "server_error", NULL, NULL, "%s failed: %s", what, mmc_last_error());
        j->aborted = true;
    }
    seq_finish(e, s, "stop");
}

/* sample the next token from logits [V]; false when the sequence ended (and is freed) */
static bool seq_take(serve_engine *e, serve_seq *s, float *logits) {
    e->row_valid = false;
    /* response_format: only tokens that keep the text valid JSON (completable within max_tokens) */
    if (s->jc)
        mmc_jc_mask(s->jc, e->jc_vocab, s->r.max_new - s->r.c->n_ids, s->go.eos_ids, s->go.n_eos, logits,
                    e->b->lm->cfg.vocab_size);
    int32_t tok = mmc_sampler_next(&s->smp, logits, s->hist, s->n_hist);
    for (int k = 0; k < s->go.n_eos; k++)
        if (tok == s->go.eos_ids[k]) { seq_finish(e, s, NULL); return false; }
    if (s->jc && !mmc_jc_feed_token(s->jc, e->jc_vocab, tok)) {   /* nothing fit: end rather than break JSON */
        seq_finish(e, s, NULL);
        return false;
    }
    s->hist[s->n_hist++] = tok;
    if (!on_token(&s->r, tok)) { seq_finish(e, s, NULL); return false; }
    if (s->jc && mmc_jc_done(s->jc)) {   /* the JSON value is complete: the end, as at EOS */
        if (!s->r.stopped) update_text(&s->r, true);
        seq_finish(e, s, "stop");
        return false;
    }
    if (s->r.c->n_ids >= s->r.max_new) { seq_finish(e, s, NULL); return false; }
    return true;
}

static bool list_push(serve_seq ***a, int *n, int *cap, serve_seq *s, bool front) {
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 16;
        serve_seq **p = realloc(*a, (size_t)c * sizeof *p);
        if (!p) return false;
        *a = p;
        *cap = c;
    }
    if (front) {
        memmove(*a + 1, *a, (size_t)*n * sizeof **a);
        (*a)[0] = s;
    } else
        (*a)[*n] = s;
    ++*n;
    return true;
}

static void list_remove(serve_seq **a, int *n, int i) {
    memmove(a + i, a + i + 1, (size_t)(*n - i - 1) * sizeof *a);
    --*n;
}

/* a popped job: prepared, its choices queued as sequences */
static void batch_start_job(serve_engine *e, serve_job *j) {
    mmc_serve_request *q = &j->req;
    mmc_serve_error err = {0};
    if (job_cancelled(j)) {
        mmc_serve_fail(&err, 503, "server_error", NULL, "request_cancelled",
                       "The request was cancelled (client gone or server shutting down).");
        goto fail;
    }
    if (!job_prepare(e, j, &j->prompt, &j->max_new, &err)) goto fail;
    /* a sequence must fit the whole KV pool (it may end up alone in it) */
    int64_t cap = e->pool.n_blocks * e->pool.block_size;
    if (j->n_prompt + 1 > cap || (q->max_tokens > 0 && j->n_prompt + j->max_new > cap)) {
        mmc_serve_fail(&err, 400, "invalid_request_error", q->max_tokens > 0 ? "max_tokens" : "messages",
                       "context_length_exceeded", "This server's KV cache holds %lld tokens. However, you requested "
                       "%lld tokens (%lld in the prompt, %lld in the completion). Please reduce the length of the "
                       "prompt or completion.", (long long)cap, (long long)(j->n_prompt + j->max_new),
                       (long long)j->n_prompt, (long long)j->max_new);
        e->b->release(e->b->self, j->prompt);
        j->prompt = NULL;
        goto fail;
    }
    if (j->n_prompt + j->max_new > cap) j->max_new = cap - j->n_prompt;
    if (q->json_schema && !e->jc_vocab && mmc_jc_vocab_build(e->b->tok, &e->jc_vocab)) {
        mmc_serve_fail(&err, 500, "server_error", NULL, NULL, "%s", mmc_last_error());
        e->b->release(e->b->self, j->prompt);
        j->prompt = NULL;
        goto fail;
    }
    job_set_state(j, JOB_PREPARED);
    uint64_t seed = q->has_seed ? (uint64_t)q->seed : ((uint64_t)time(NULL) << 20) ^ (uint64_t)(mmc_now() * 1e6);
    j->n_live = q->n;
    for (int i = 0; i < q->n; i++) {
        if (q->stream) emit_chunk(e, j, i, NULL, 0, q->kind == MMC_SERVE_CHAT, NULL);
        serve_seq *s = calloc(1, sizeof *s);
        if (s) {
            s->r = (run_ctx){.e = e, .j = j, .c = &j->choices[i], .idx = i, .max_new = (int)j->max_new,
                             .t_last = mmc_now()};
            mmc_serve_gen g = {.max_new = (int)j->max_new, .seed = seed + (uint64_t)i, .on_token = on_token,
                               .on_logits = q->logprobs ? on_logits : NULL, .user = &s->r};
            e->b->sampling(e->b->self, j->prompt, q, &g, &s->go, s->eos);
            s->go.eos_ids = s->eos;
            s->n_prompt = j->n_prompt;
            s->hist = malloc((size_t)(j->n_prompt + j->max_new + 1) * sizeof *s->hist);
            s->smp_ok = s->hist && mmc_sampler_init(&s->smp, &s->go.sampler, e->b->lm->cfg.vocab_size) == MMC_OK &&
                        (!q->json_schema || (s->jc = mmc_jc_start(q->json_schema)));
        }
        if (!s || !s->smp_ok || !list_push(&e->wait, &e->n_wait, &e->cap_wait, s, false)) {
            if (s) { mmc_error(MMC_ERR_OOM, "out of memory"); seq_abort(e, s, "starting a sequence"); }
            else if (--j->n_live == 0) job_complete(e, j);
            continue;
        }
        if (j->max_new == 0) seq_finish(e, e->wait[--e->n_wait], NULL);
    }
    return;
fail:
    job_fail(j, &err);
    pthread_mutex_lock(&e->mu);
    e->depth--;
    pthread_mutex_unlock(&e->mu);
    serve_job_release(j);
}

static bool seq_gone(serve_engine *e, serve_seq *s) {
    serve_job *j = s->r.j;
    if (j->aborted) { seq_finish(e, s, "stop"); return true; }
    if (job_cancelled(j)) { seq_finish(e, s, "stop"); return true; }
    if (mmc_now() - j->t_submit > e->opt.limits.max_request_seconds) { seq_finish(e, s, "length"); return true; }
    return false;
}

/* move the youngest running sequence back to the front of the waiting line */
static void preempt_youngest(serve_engine *e) {
    int y = 0;
    for (int i = 1; i < e->n_run; i++)
        if (e->run[i]->order > e->run[y]->order) y = i;
    serve_seq *s = e->run[y];
    list_remove(e->run, &e->n_run, y);
    mmc_kv_seq_release(&e->pool, &s->kv);
    if (!list_push(&e->wait, &e->n_wait, &e->cap_wait, s, true)) {
        mmc_error(MMC_ERR_OOM, "out of memory");
        seq_abort(e, s, "preemption");
    }
    pthread_mutex_lock(&e->metrics.mu);
    e->metrics.preemptions++;
    pthread_mutex_unlock(&e->metrics.mu);
}

static void metric_vision_encode(serve_engine *e) {
    pthread_mutex_lock(&e->metrics.mu);
    e->metrics.vision_encodes++;
    pthread_mutex_unlock(&e->metrics.mu);
}

/* prefill the first waiting sequence into the pool: 1 admitted, 0 not now (blocks), -1 ended */
static int admit(serve_engine *e, mmc_ctx *ctx, serve_seq *s) {
    mmc_kv_pool *p = &e->pool;
    int64_t need = mmc_kv_pool_blocks_for(p, s->n_hist + 1);
    if (need > p->n_free) {
        if (e->n_run > 0) return 0;
        if (need > p->n_blocks) {
            mmc_error(MMC_ERR_OOM, "the KV cache holds %lld positions (%lld blocks of %lld); this sequence needs "
                      "%lld: start the server with more --kv-blocks / --kv-memory", (long long)(p->n_blocks *
                      p->block_size), (long long)p->n_blocks, (long long)p->block_size, (long long)(s->n_hist + 1));
            seq_abort(e, s, "admission");
            return -1;
        }
        return 0;
    }
    mmc_kv_cache kv;
    mmc_status st = mmc_kv_cache_init(&kv, e->b->lm->cfg.num_layers ? (int)e->b->lm->cfg.num_layers : 1, 1,
                                      p->kv_heads, p->head_dim, s->n_prompt);
    const int32_t *ids = NULL;
    int64_t n_ids = 0;
    float *logits = NULL;
    mmc_ctx_reset(ctx);
    use_lora(e, s->r.j->req.lora);
    if (!st) st = e->b->prefill(e->b->self, s->r.j->prompt, ctx, &kv, &ids, &n_ids, &logits, &s->rope_delta);
    if (!st && s->n_hist == 0) {   /* first admission: the history starts with the prompt */
        memcpy(s->hist, ids, (size_t)n_ids * sizeof *ids);
        s->n_hist = s->n_prompt = n_ids;
    }
    if (!st && mmc_kv_pool_blocks_for(p, kv.len + 1) > p->n_free) {   /* a prompt the model expanded */
        mmc_kv_cache_free(&kv);
        if (e->n_run > 0) return 0;
        mmc_error(MMC_ERR_OOM, "the KV cache (%lld blocks) cannot hold this prompt's %lld positions; give more "
                  "--kv-blocks / --kv-memory", (long long)p->n_blocks, (long long)kv.len);
        st = MMC_ERR_OOM;
    }
    if (!st) st = mmc_kv_seq_import(p, &s->kv, &kv);
    if (!st) s->base = kv.len - s->n_prompt;
    mmc_kv_cache_free(&kv);
    if (st) { seq_abort(e, s, "prefill"); return -1; }
    const int32_t *tid;
    int64_t ntid;
    if (!e->b->text_ids || !e->b->text_ids(e->b->self, s->r.j->prompt, &tid, &ntid)) metric_vision_encode(e);
    s->order = ++e->n_admitted;
    if (s->n_hist == s->n_prompt && !seq_take(e, s, logits)) return -1;
    if (!list_push(&e->run, &e->n_run, &e->cap_run, s, false)) {
        mmc_error(MMC_ERR_OOM, "out of memory");
        seq_abort(e, s, "admission");
        return -1;
    }
    return 1;
}

/* A text prompt through the pool's own prefill: the longest cached prefix of its prompt is
 * taken from the prefix cache, the rest is prefilled over a contiguous copy of the sequence's
 * positions (all of it at once, or with --prefill-chunk at most *budget tokens per step: the
 * sequence then stays in e->pf between steps), appended to its blocks, and its full prompt
 * blocks are offered to the cache. A preempted sequence recomputes its whole history so. 1:
 * admitted or in progress, 0: not now (blocks), -1: ended. */
static bool seq_text_ids(serve_engine *e, serve_seq *s, const int32_t **ids, int64_t *n) {
    const mmc_serve_backend *b = e->b;
    return b->text_ids && b->lm->cfg.rope_kind != MMC_ROPE_DYNAMIC && b->text_ids(b->self, s->r.j->prompt, ids, n) &&
           *n > 0;
}

/* A prompt the pool's own prefill takes: text, or with the backend's media hooks (VLM
 * images) one keyed by its images' content hashes (*mm [n], NULL for text) */
static bool seq_cached_ids(serve_engine *e, serve_seq *s, const int32_t **ids, int64_t *n, const uint64_t **mm) {
    const mmc_serve_backend *b = e->b;
    *mm = NULL;
    if (seq_text_ids(e, s, ids, n)) return true;
    return e->pool.prefix_cache && b->media_hash && b->media_inputs && b->lm->cfg.rope_kind != MMC_ROPE_DYNAMIC &&
           b->media_hash(b->self, s->r.j->prompt, ids, n, mm) && *mm && *n > 0;
}

static int admit_text(serve_engine *e, mmc_ctx *ctx, serve_seq *s, const int32_t *ids, int64_t n_ids,
                      const uint64_t *mm, int64_t *budget) {
    mmc_kv_pool *p = &e->pool;
    if (s->n_hist == 0) {
        memcpy(s->hist, ids, (size_t)n_ids * sizeof *ids);
        s->n_hist = s->n_prompt = n_ids;
    }
    const int64_t n = s->n_hist;
    mmc_status st = MMC_OK;
    if (!s->staged) {
        int64_t total = mmc_kv_pool_blocks_for(p, n + 1);
        if (total > p->n_blocks) {
            mmc_error(MMC_ERR_OOM, "the KV cache holds %lld positions (%lld blocks of %lld); this sequence needs "
                      "%lld: start the server with more --kv-blocks / --kv-memory", (long long)(p->n_blocks *
                      p->block_size), (long long)p->n_blocks, (long long)p->block_size, (long long)(n + 1));
            seq_abort(e, s, "admission");
            return -1;
        }
        mmc_kv_prefix_key key = prefix_key(s->r.j);
        key.media = mm;
        int64_t hit = mmc_kv_seq_match_prefix(p, &s->kv, &key, s->hist, s->n_prompt);
        if (!mmc_kv_seq_reserve(p, &s->kv, n + 1)) {
            mmc_kv_seq_release(p, &s->kv);
            return 0;
        }
        if ((st = mmc_kv_seq_export(p, &s->kv, &s->stage, n - hit))) { seq_abort(e, s, "prefill"); return -1; }
        s->staged = true;
        pthread_mutex_lock(&e->metrics.mu);
        if (p->prefix_cache) {
            e->metrics.prefix_queried += s->n_prompt;
            e->metrics.prefix_hit += hit;
        }
        pthread_mutex_unlock(&e->metrics.mu);
    }
    float *logits = NULL;
    while (s->stage.len < n) {
        int64_t c = n - s->stage.len;
        bool media = mm && s->stage.len < s->n_prompt;   /* the prompt's rest, images included: in one piece */
        if (media) c = s->n_prompt - s->stage.len;
        if (e->chunk > 0) {
            int64_t lim = e->chunk < *budget ? e->chunk : *budget;
            if (lim <= 0) break;
            if (c > lim && !media) c = lim;
        }
        mmc_ctx_reset(ctx);
        use_lora(e, s->r.j->req.lora);
        if (media) {   /* the vision features from the backend's encoder cache, or its tower now */
            mmc_tensor *emb, *cos, *sin;
            int enc = 0;
            st = e->b->media_inputs(e->b->self, s->r.j->prompt, ctx, s->stage.len, &emb, &cos, &sin, &s->rope_delta,
                                    &enc);
            if (!st) st = mmc_qwen2_prefill_embeds(ctx, e->b->lm, emb, cos, sin, &s->stage, &logits);
            if (!st && enc) metric_vision_encode(e);
        } else
            st = mmc_qwen2_prefill_chunk_at(ctx, e->b->lm, s->hist + s->stage.len, c, &s->stage, mm ? s->rope_delta : 0,
                                            &logits);
        if (!st) st = mmc_kv_seq_append(p, &s->kv, &s->stage, s->stage.len - c, c);
        if (st) { seq_abort(e, s, "prefill"); return -1; }
        *budget -= c;
        pthread_mutex_lock(&e->metrics.mu);
        e->metrics.prefill_chunks++;
        pthread_mutex_unlock(&e->metrics.mu);
    }
    if (s->stage.len < n) {
        e->pf = s;
        return 1;
    }
    mmc_kv_cache_free(&s->stage);
    s->staged = false;
    if (e->pf == s) e->pf = NULL;
    mmc_kv_prefix_key key = prefix_key(s->r.j);
    key.media = mm;
    mmc_kv_seq_cache_prefix(p, &s->kv, &key, s->hist, s->n_prompt);
    s->base = 0;
    if (!mm) s->rope_delta = 0;
    s->order = ++e->n_admitted;
    if (!seq_take(e, s, logits)) return -1;   /* the whole history is in the cache: the next token */
    if (!list_push(&e->run, &e->n_run, &e->cap_run, s, false)) {
        mmc_error(MMC_ERR_OOM, "out of memory");
        seq_abort(e, s, "admission");
        return -1;
    }
    return 1;
}

/* Text-only prompts at the head of the line, admitted together through one packed prefill
 * (mmc_qwen2_prefill_packed) while budget, batch size and blocks allow. */
static void admit_packed(serve_engine *e, mmc_ctx *ctx, int64_t *budget) {
    const mmc_serve_backend *b = e->b;
    if (!b->text_ids || b->lm->cfg.rope_kind == MMC_ROPE_DYNAMIC) return;
    int K = 0;
    int64_t blocks = 0, tokens = 0;
    enum { MAXK = 64 };
    const int32_t *ids[MAXK];
    int64_t n[MAXK];
    while (K < e->n_wait && K < MAXK && e->n_run + K < e->max_batch) {
        serve_seq *s = e->wait[K];
        const int32_t *id;
        int64_t ni;
        if (!b->text_ids(b->self, s->r.j->prompt, &id, &ni) || ni <= 0) break;
        if (s->r.j->req.lora != e->wait[0]->r.j->req.lora) break;   /* one adapter per pass */
        mmc_kv_prefix_key key = prefix_key(s->r.j);
        if (mmc_kv_prefix_lookup(&e->pool, &key, id, ni) > 0) break;   /* it takes its cached prefix instead */
        int64_t nb = mmc_kv_pool_blocks_for(&e->pool, (s->n_hist > ni ? s->n_hist : ni) + 1);
        if (blocks + nb > e->pool.n_free || ((K > 0 || e->chunk > 0) && tokens + ni > *budget)) break;
        ids[K] = id;
        n[K++] = ni;
        blocks += nb;
        tokens += ni;
    }
    if (K < 2) return;   /* one goes the ordinary way */
    serve_seq *grp[MAXK];
    mmc_kv_seq *kvs[MAXK];
    for (int i = 0; i < K; i++) { grp[i] = e->wait[i]; kvs[i] = &grp[i]->kv; }
    memmove(e->wait, e->wait + K, (size_t)(e->n_wait - K) * sizeof *e->wait);
    e->n_wait -= K;
    *budget -= tokens;
    float *logits = NULL;
    mmc_ctx_reset(ctx);
    use_lora(e, grp[0]->r.j->req.lora);
    mmc_status st = mmc_qwen2_prefill_packed(ctx, b->lm, ids, n, K, &e->pool, kvs, &logits);
    pthread_mutex_lock(&e->metrics.mu);
    e->metrics.packed += K;
    pthread_mutex_unlock(&e->metrics.mu);
    const int64_t V = b->lm->cfg.vocab_size;
    for (int i = 0; i < K; i++) {
        serve_seq *s = grp[i];
        if (st) { seq_abort(e, s, "packed prefill"); continue; }
        if (s->n_hist == 0) {
            memcpy(s->hist, ids[i], (size_t)n[i] * sizeof *ids[i]);
            s->n_hist = s->n_prompt = n[i];
        }
        s->base = 0;
        s->rope_delta = 0;
        s->order = ++e->n_admitted;
        mmc_kv_prefix_key key = prefix_key(s->r.j);
        mmc_kv_seq_cache_prefix(&e->pool, &s->kv, &key, ids[i], n[i]);
        pthread_mutex_lock(&e->metrics.mu);
        e->metrics.prefix_queried += e->pool.prefix_cache ? n[i] : 0;
        pthread_mutex_unlock(&e->metrics.mu);
        if (s->n_hist == s->n_prompt && !seq_take(e, s, logits + i * V)) continue;
        if (!list_push(&e->run, &e->n_run, &e->cap_run, s, false)) {
            mmc_error(MMC_ERR_OOM, "out of memory");
            seq_abort(e, s, "admission");
        }
    }
}

static void batch_step(serve_engine *e, mmc_ctx *ctx) {
    /* every running sequence needs room for one more position; the youngest yields */
    for (int i = 0; i < e->n_run;) {
        serve_seq *s = e->run[i];
        if (mmc_kv_seq_reserve(&e->pool, &s->kv, s->kv.len + 1)) { i++; continue; }
        preempt_youngest(e);   /* may be s itself; the list shifted: check again from the start */
        i = 0;
    }
    if (e->n_run == 0) return;
    const int64_t B = e->n_run, V = e->b->lm->cfg.vocab_size;
    int32_t *tok = malloc((size_t)B * sizeof *tok);
    int64_t *pos = malloc((size_t)B * sizeof *pos);
    mmc_kv_seq **kvs = malloc((size_t)B * sizeof *kvs);
    serve_seq **batch = malloc((size_t)B * sizeof *batch);
    int *lrow = e->b->n_loras > 0 ? malloc((size_t)B * sizeof *lrow) : NULL;   /* each sequence's adapter */
    mmc_status st = tok && pos && kvs && batch && (lrow || !e->b->n_loras) ? MMC_OK
                  : mmc_error(MMC_ERR_OOM, "out of memory");
    for (int64_t b = 0; !st && b < B; b++) {
        serve_seq *s = batch[b] = e->run[b];
        tok[b] = s->hist[s->kv.len - s->base];   /* the next token not yet in the cache */
        pos[b] = s->kv.len + s->rope_delta;
        kvs[b] = &s->kv;
        if (lrow) lrow[b] = s->r.j->req.lora;
    }
    float *logits = NULL;
    mmc_ctx_reset(ctx);
    use_lora(e, 0);
    bool mixed = false;
    for (int64_t b = 1; lrow && b < B; b++) mixed |= lrow[b] != lrow[0];
    if (mixed) {
        pthread_mutex_lock(&e->metrics.mu);
        e->metrics.lora_mixed_steps++;
        pthread_mutex_unlock(&e->metrics.mu);
    }
    mmc_lora_rows lr = {e->b->n_loras, e->b->loras, lrow};
    if (!st) st = mmc_qwen2_decode_batch_lora(ctx, e->b->lm, tok, pos, B, &e->pool, kvs, lrow ? &lr : NULL, &logits);
    if (st) {
        while (e->n_run > 0) {
            serve_seq *s = e->run[--e->n_run];
            seq_abort(e, s, "batched decode");
        }
    } else {
        for (int64_t b = 0; b < B; b++) {
            serve_seq *s = batch[b];
            if (s->kv.len - s->base < s->n_hist) continue;   /* replaying after a preemption */
            if (!seq_take(e, s, logits + b * V))
                for (int i = 0; i < e->n_run; i++)
                    if (e->run[i] == s) { list_remove(e->run, &e->n_run, i); break; }
        }
    }
    free(tok);
    free(pos);
    free(kvs);
    free(batch);
    free(lrow);
}

static void batch_loop(serve_engine *e) {
    mmc_ctx *ctx = mmc_ctx_new();
    if (ctx) mmc_set_grad_enabled(ctx, false);
    for (;;) {
        /* 1. new jobs, while the waiting line is short */
        pthread_mutex_lock(&e->mu);
        while (!e->head && !e->stopping && e->n_run == 0 && e->n_wait == 0 && !e->pf) pthread_cond_wait(&e->cv, &e->mu);
        bool stopping = e->stopping;
        if (!e->head && e->n_run == 0 && e->n_wait == 0 && !e->pf) { pthread_mutex_unlock(&e->mu); break; }
        serve_job *got = NULL, **tail = &got;
        while (e->head && e->n_wait + e->n_run < 2 * e->max_batch) {
            serve_job *j = e->head;
            e->head = j->next;
            if (!e->head) e->tail = NULL;
            j->next = NULL;
            *tail = j;
            tail = &j->next;
            if (stopping) serve_job_cancel(j);
        }
        pthread_mutex_unlock(&e->mu);
        while (got) {
            serve_job *j = got;
            got = j->next;
            j->next = NULL;
            if (!ctx) { mmc_serve_error err; mmc_serve_fail(&err, 500, "server_error", NULL, NULL, "out of memory");
                        job_fail(j, &err); pthread_mutex_lock(&e->mu); e->depth--; pthread_mutex_unlock(&e->mu);
                        serve_job_release(j); continue; }
            batch_start_job(e, j);
        }
        if (!ctx) continue;
        /* 2. sequences whose client left, whose job failed or whose time is up */
        int w = 0;
        for (int i = 0; i < e->n_run; i++) {
            serve_seq *s = e->run[i];
            if (stopping) serve_job_cancel(s->r.j);
            if (!seq_gone(e, s)) e->run[w++] = s;
        }
        e->n_run = w;
        w = 0;
        for (int i = 0; i < e->n_wait; i++) {
            serve_seq *s = e->wait[i];
            if (stopping) serve_job_cancel(s->r.j);
            if (!seq_gone(e, s)) e->wait[w++] = s;
        }
        e->n_wait = w;
        if (e->pf) {
            if (stopping) serve_job_cancel(e->pf->r.j);
            seq_gone(e, e->pf);   /* e->pf becomes NULL if it ended */
        }
        /* 3. admissions in line order, under a prefill token budget per step while others
         * decode: whole prompts (the first always goes), or with --prefill-chunk that many
         * prompt tokens, a longer prompt continuing over the next steps */
        int64_t budget = e->chunk > 0 ? e->chunk : e->opt.prefill_tokens > 0 ? e->opt.prefill_tokens : 512;
        const int32_t *tids;
        int64_t n_tids;
        const uint64_t *mm;
        if (e->pf && seq_cached_ids(e, e->pf, &tids, &n_tids, &mm)) admit_text(e, ctx, e->pf, tids, n_tids, mm, &budget);
        if (!e->pf) admit_packed(e, ctx, &budget);
        while (!e->pf && e->n_wait > 0 && e->n_run < e->max_batch && (budget > 0 || (e->chunk <= 0 && e->n_run == 0))) {
            serve_seq *s = e->wait[0];
            int64_t cost = s->n_hist > 0 ? s->n_hist : s->r.j->n_prompt;
            list_remove(e->wait, &e->n_wait, 0);
            int a;
            if (seq_cached_ids(e, s, &tids, &n_tids, &mm)) a = admit_text(e, ctx, s, tids, n_tids, mm, &budget);
            else {
                a = admit(e, ctx, s);
                if (a) budget -= cost;
            }
            if (a == 0) { list_push(&e->wait, &e->n_wait, &e->cap_wait, s, true); break; }
        }
        /* 4. one decode step for every running sequence */
        batch_step(e, ctx);
        metrics_kv(e);
    }
    mmc_ctx_free(ctx);
}

void serve_engine_loop(serve_engine *e) {
    if (e->opt.threads > 0) mmc_set_num_threads(e->opt.threads);
    if (e->batching) {
        batch_loop(e);
        return;
    }
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->head && !e->stopping) pthread_cond_wait(&e->cv, &e->mu);
        if (!e->head) { pthread_mutex_unlock(&e->mu); break; }
        serve_job *j = e->head;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        e->running = j;
        bool stopping = e->stopping;
        pthread_mutex_unlock(&e->mu);
        if (stopping) serve_job_cancel(j);
        if (job_cancelled(j) && j->state == JOB_QUEUED) {
            pthread_mutex_lock(&j->mu);
            j->failed = true;
            mmc_serve_fail(&j->err, 503, "server_error", NULL, "request_cancelled",
                           "The request was cancelled (client gone or server shutting down).");
            j->state = JOB_DONE;
            pthread_cond_broadcast(&j->cv);
            pthread_mutex_unlock(&j->mu);
        } else
            run_job(e, j);
        pthread_mutex_lock(&e->mu);
        e->running = NULL;
        e->depth--;
        pthread_mutex_unlock(&e->mu);
        serve_job_release(j);
    }
}

mmc_status serve_engine_start(const mmc_serve_backend *b, const mmc_serve_options *o, serve_engine **out) {
    serve_engine *e = calloc(1, sizeof *e);
    if (!e) return mmc_error(MMC_ERR_OOM, "out of memory");
    e->b = b;
    e->opt = *o;
    e->id_state = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
    e->call_ids = e->id_state * 0x9E3779B97F4A7C15ull + 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->metrics.mu, NULL);
    if (b->lm && b->prefill && b->sampling) {
        const mmc_qwen2_config *c = &b->lm->cfg;
        int64_t D = c->head_dim, Hkv = b->lm->layers[0].k.out_features / D;
        int64_t bs = o->kv_block_size > 0 ? o->kv_block_size : 16;
        int64_t per_block = (int64_t)c->num_layers * 2 * bs * Hkv * D * (int64_t)sizeof(float);
        e->max_batch = o->max_batch > 0 ? o->max_batch : 64;
        int64_t nb = o->kv_blocks;
        if (nb <= 0) {
            int64_t mem = o->kv_memory_mib > 0 ? o->kv_memory_mib << 20 : 0;
            if (mem <= 0) {
                int64_t ctxlen = b->context_length < ((int64_t)1 << 20) ? b->context_length : (int64_t)1 << 20;
                mem = (ctxlen + bs) / bs * per_block * e->max_batch;
                if (mem > ((int64_t)4096 << 20)) mem = (int64_t)4096 << 20;
            }
            nb = mem / per_block > 0 ? mem / per_block : 1;
        }
        mmc_status st = mmc_kv_pool_init(&e->pool, (int)c->num_layers, Hkv, D, bs, nb);
        if (st) {
            serve_engine_free(e);
            return st;
        }
        e->pool.prefix_cache = !o->no_prefix_cache;
        e->chunk = o->prefill_chunk > 0 ? o->prefill_chunk : 0;
        e->batching = true;
    }
    *out = e;
    return MMC_OK;
}

void serve_engine_stop(serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    for (serve_job *j = e->head; j; j = j->next) serve_job_cancel(j);
    if (e->running) serve_job_cancel(e->running);
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void serve_engine_free(serve_engine *e) {
    use_lora(e, 0);
    free(e->row);
    mmc_jc_vocab_free(e->jc_vocab);
    if (e->batching || e->pool.n_blocks) mmc_kv_pool_free(&e->pool);
    free(e->run);
    free(e->wait);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->metrics.mu);
    free(e);
}

serve_metrics *serve_engine_metrics(serve_engine *e) { return &e->metrics; }
const mmc_serve_backend *serve_engine_backend(serve_engine *e) { return e->b; }

int serve_engine_queue_depth(serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    int d = e->depth;
    pthread_mutex_unlock(&e->mu);
    return d;
}

void serve_metrics_request(serve_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int k = SERVE_N_STATUS - 1;
    for (int i = 0; i < SERVE_N_STATUS; i++)
        if (serve_status_codes[i] == status) { k = i; break; }
    m->requests[k]++;
    pthread_mutex_unlock(&m->mu);
}

static void hist_text(char **buf, size_t *len, size_t cap, const char *name, const char *help, const long long *c,
                      double sum, long long n) {
    *len += (size_t)snprintf(*buf + *len, cap - *len, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long long acc = 0;
    for (int b = 0; b < SERVE_N_BUCKETS; b++) {
        acc += c[b];
        *len += (size_t)snprintf(*buf + *len, cap - *len, "%s_bucket{le=\"%g\"} %lld\n", name, serve_buckets[b], acc);
    }
    acc += c[SERVE_N_BUCKETS];
    *len += (size_t)snprintf(*buf + *len, cap - *len, "%s_bucket{le=\"+Inf\"} %lld\n%s_sum %.6f\n%s_count %lld\n",
                             name, acc, name, sum, name, n);
}

char *serve_metrics_text(serve_engine *e) {
    size_t cap = 16384, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    int depth = serve_engine_queue_depth(e);
    serve_metrics *m = &e->metrics;
    pthread_mutex_lock(&m->mu);
    len += (size_t)snprintf(buf + len, cap - len,
                            "# HELP mmc_requests_total HTTP requests by status code.\n"
                            "# TYPE mmc_requests_total counter\n");
    for (int i = 0; i < SERVE_N_STATUS; i++)
        if (serve_status_codes[i])
            len += (size_t)snprintf(buf + len, cap - len, "mmc_requests_total{code=\"%d\"} %lld\n",
                                    serve_status_codes[i], m->requests[i]);
        else if (i == SERVE_N_STATUS - 1)
            len += (size_t)snprintf(buf + len, cap - len, "mmc_requests_total{code=\"other\"} %lld\n", m->requests[i]);
    len += (size_t)snprintf(buf + len, cap - len,
                            "# HELP mmc_prompt_tokens_total Prompt tokens processed.\n# TYPE mmc_prompt_tokens_total counter\n"
                            "mmc_prompt_tokens_total %lld\n"
                            "# HELP mmc_completion_tokens_total Completion tokens generated.\n"
                            "# TYPE mmc_completion_tokens_total counter\nmmc_completion_tokens_total %lld\n"
                            "# HELP mmc_queue_depth Requests queued or running.\n# TYPE mmc_queue_depth gauge\n"
                            "mmc_queue_depth %d\n",
                            m->prompt_tokens, m->completion_tokens, depth);
    len += (size_t)snprintf(buf + len, cap - len,
                            "# HELP mmc_kv_blocks_in_use Paged KV cache blocks held by sequences.\n"
                            "# TYPE mmc_kv_blocks_in_use gauge\nmmc_kv_blocks_in_use %lld\n"
                            "# HELP mmc_kv_blocks_total Paged KV cache blocks.\n# TYPE mmc_kv_blocks_total gauge\n"
                            "mmc_kv_blocks_total %lld\n"
                            "# HELP mmc_running_sequences Sequences in the decode batch.\n"
                            "# TYPE mmc_running_sequences gauge\nmmc_running_sequences %lld\n"
                            "# HELP mmc_preemptions_total Sequences preempted (recomputed) for lack of KV blocks.\n"
                            "# TYPE mmc_preemptions_total counter\nmmc_preemptions_total %lld\n"
                            "# HELP mmc_packed_prefill_prompts_total Prompts prefilled together in a packed pass.\n"
                            "# TYPE mmc_packed_prefill_prompts_total counter\nmmc_packed_prefill_prompts_total %lld\n",
                            m->kv_blocks_used, m->kv_blocks_total, m->running, m->preemptions, m->packed);
    len += (size_t)snprintf(buf + len, cap - len,
                            "# HELP mmc_prefix_cache_queries_total Prompt tokens looked up in the prefix cache.\n"
                            "# TYPE mmc_prefix_cache_queries_total counter\nmmc_prefix_cache_queries_total %lld\n"
                            "# HELP mmc_prefix_cache_hits_total Prompt tokens whose KV came from the prefix cache "
                            "(not prefilled).\n# TYPE mmc_prefix_cache_hits_total counter\nmmc_prefix_cache_hits_total %lld\n"
                            "# HELP mmc_kv_blocks_cached Cached KV blocks held by no sequence (evictable).\n"
                            "# TYPE mmc_kv_blocks_cached gauge\nmmc_kv_blocks_cached %lld\n"
                            "# HELP mmc_prefix_cache_evictions_total Cached KV blocks evicted for new ones.\n"
                            "# TYPE mmc_prefix_cache_evictions_total counter\nmmc_prefix_cache_evictions_total %lld\n"
                            "# HELP mmc_prefill_chunks_total Prefill passes of text prompts (chunks).\n"
                            "# TYPE mmc_prefill_chunks_total counter\nmmc_prefill_chunks_total %lld\n",
                            m->prefix_queried, m->prefix_hit, m->kv_blocks_cached, m->prefix_evictions,
                            m->prefill_chunks);
    len += (size_t)snprintf(buf + len, cap - len,
                            "# HELP mmc_vision_encodes_total Prompts whose images / video / audio ran through the "
                            "model's encoders (a repeated image from the encoder and prefix caches does not).\n"
                            "# TYPE mmc_vision_encodes_total counter\nmmc_vision_encodes_total %lld\n"
                            "# HELP mmc_lora_mixed_decode_steps_total Batched decode steps whose sequences used "
                            "different models (the base and --lora adapters).\n"
                            "# TYPE mmc_lora_mixed_decode_steps_total counter\nmmc_lora_mixed_decode_steps_total %lld\n"
                            "# HELP mmc_open_connections Open TCP connections.\n"
                            "# TYPE mmc_open_connections gauge\nmmc_open_connections %lld\n"
                            "# HELP mmc_client_timeouts_total Connections closed because their request did not "
                            "arrive within --client-timeout.\n"
                            "# TYPE mmc_client_timeouts_total counter\nmmc_client_timeouts_total %lld\n",
                            m->vision_encodes, m->lora_mixed_steps, m->connections, m->client_timeouts);
    hist_text(&buf, &len, cap, "mmc_time_to_first_token_seconds", "Time from request to the first token.", m->ttft,
              m->ttft_sum, m->ttft_n);
    hist_text(&buf, &len, cap, "mmc_inter_token_latency_seconds", "Time between consecutive tokens.", m->itl,
              m->itl_sum, m->itl_n);
    pthread_mutex_unlock(&m->mu);
    return buf;
}
