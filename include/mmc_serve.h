/* mmc_serve.h — `mmc serve`: an OpenAI-compatible HTTP server (libmicrohttpd) in front of one
 * model. Three layers, each replaceable on its own:
 *   - the request parser (src/serve/request.c): a JSON body of /v1/chat/completions or
 *     /v1/completions -> mmc_serve_request, with OpenAI's 400 errors (type, param, code);
 *   - the engine (src/serve/engine.c): a queue and one thread that runs requests through an
 *     mmc_serve_backend (submit -> events of text deltas -> done / cancel): continuously
 *     batched over a paged KV cache (mmc_infer.h) when the backend exposes its LM, else one at
 *     a time;
 *   - the HTTP front (src/serve/http.c): routes, API key, limits, SSE streaming, /metrics,
 *     graceful shutdown.
 * The backend (tools/cmd_serve.c) renders the chat template, loads images and generates with
 * the same code as `mmc generate`, so a greedy served completion equals `mmc generate`'s.
 * Response and error bodies follow OpenAI's API reference (chat.completion, chat.completion.chunk,
 * text_completion, {"error": {"message", "type", "param", "code"}}). */
#ifndef MMC_SERVE_H
#define MMC_SERVE_H

#include "mmc.h"
#include "mmc_infer.h"
#include "mmc_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Limits; mmc_serve_limits_default gives the values `mmc serve --help` lists. */
typedef struct {
    size_t max_body_bytes;       /* larger request bodies: 413 */
    int max_json_depth;          /* deeper nesting of objects/arrays: 400 */
    int max_images;              /* image parts per request: 400 */
    int64_t max_image_pixels;    /* a larger decoded image: 400 */
    int max_audios;              /* input_audio / audio_url parts per request: 400 */
    double max_audio_seconds;    /* a longer decoded clip: 400 */
    int64_t max_prompt_tokens;   /* 0: the model's context length; more: 400 context_length_exceeded */
    int max_output_tokens;       /* max_tokens above it: 400; the default when a request gives none */
    double max_request_seconds;  /* generation stops there (finish_reason "length") */
    int max_connections;         /* concurrent HTTP connections */
    double client_timeout_seconds;/* a request's headers and body must arrive within it (slow clients
                                    are disconnected); also the idle keep-alive timeout */
    int max_queue;               /* requests waiting or running; more: 429 */
    int max_n;                   /* the largest n */
} mmc_serve_limits;
void mmc_serve_limits_default(mmc_serve_limits *l);

/* An OpenAI error: HTTP status and the body's fields ("" -> null). */
typedef struct {
    int status;
    char type[40], param[96], code[48], message[512];
} mmc_serve_error;
/* Fill e and return false (for `return mmc_serve_fail(...)`). */
bool mmc_serve_fail(mmc_serve_error *e, int status, const char *type, const char *param, const char *code,
                    const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error": {...}} as a malloc'd string. */
char *mmc_serve_error_json(const mmc_serve_error *e);

/* ------------------------------------------------------------------ requests */
typedef enum { MMC_SERVE_CHAT = 0, MMC_SERVE_COMPLETION } mmc_serve_kind;

typedef struct {
    mmc_chat_part_type type;     /* MMC_CHAT_TEXT, MMC_CHAT_IMAGE or MMC_CHAT_AUDIO */
    char *text;                  /* text parts */
    unsigned char *data;         /* an image / audio from a data: URI or input_audio (decoded bytes) ... */
    size_t n_data;
    char *path;                  /* ... or a local file, resolved, under --media-root */
    char format[8];              /* input_audio.format ("wav", "mp3", ...), else "" */
} mmc_serve_part;

typedef struct {
    char *role;
    char *content;               /* a string content, or NULL: parts */
    mmc_serve_part *parts;
    int n_parts;
    char *tool_calls;            /* an assistant turn's tool_calls (JSON array text), or NULL */
    char *name, *tool_call_id;   /* a tool result's, or NULL */
} mmc_serve_message;

#define MMC_SERVE_MAX_STOP 4
typedef struct {
    mmc_serve_kind kind;
    char *model;                 /* NULL if absent */
    mmc_serve_message *msgs;     /* chat */
    int n_msgs, n_images, n_audios;
    char *prompt;                /* completions */
    /* sampling: NAN / -1 when not given (the model's generation_config.json decides) */
    double temperature, top_p, min_p, presence_penalty, frequency_penalty;
    int64_t top_k, max_tokens, seed;
    bool has_seed;
    int n;
    char *stop[MMC_SERVE_MAX_STOP];
    int n_stop;
    bool stream, include_usage;
    bool logprobs;               /* chat: logprobs true; completions: logprobs = k given */
    int top_logprobs;            /* chat: top_logprobs; completions: the logprobs integer */
    /* response_format json_object / json_schema: the compiled constraint (mmc_json_constraint.h)
     * every choice's tokens are masked with; NULL: free text */
    struct mmc_jc_schema *json_schema;
    /* tools: the function schemas (JSON array text, for the chat template) and tool_choice:
     * "auto" (tool calls parsed from the answer), "none" (tools not shown, text only), "required"
     * or a named function (the answer is constrained to one tool call: json_schema holds it) */
    char *tools;
    int tool_choice;             /* MMC_SERVE_TOOLS_* */
    int lora;                    /* the adapter "model" names: 0 the base, k the backend's loras[k - 1] (http.c) */
} mmc_serve_request;
enum { MMC_SERVE_TOOLS_AUTO = 0, MMC_SERVE_TOOLS_NONE, MMC_SERVE_TOOLS_REQUIRED };

/* Parse a request body. media_root (a resolved directory, or NULL: local paths refused) bounds
 * local image paths. false with *err set (status 400) on any invalid field. */
bool mmc_serve_parse_request(const char *body, size_t len, mmc_serve_kind kind, const mmc_serve_limits *lim,
                             const char *media_root, mmc_serve_request *req, mmc_serve_error *err);
void mmc_serve_request_free(mmc_serve_request *req);
/* Standard base64 (padding optional, no whitespace) -> malloc'd bytes; false if malformed. */
bool mmc_serve_base64_decode(const char *s, size_t n, unsigned char **out, size_t *n_out);

/* ------------------------------------------------------------------ backend */
/* One generation of a prepared prompt: the backend calls on_token per new token (return false
 * to stop) and installs on_logits (may be NULL) as the sampler's raw-logits hook. */
typedef struct {
    int max_new;
    uint64_t seed;
    mmc_token_cb on_token;
    void (*on_logits)(void *user, const float *logits, int64_t vocab);
    void *user;
} mmc_serve_gen;

typedef struct {
    void *self;
    const mmc_tokenizer *tok;
    const char *model_id;        /* the name /v1/models lists */
    int64_t context_length;
    /* Render + encode the request's prompt (chat template, images). *prompt: backend state for
     * generate; *n_prompt its tokens; *default_max_new the model's default length (or -1). */
    bool (*prepare)(void *self, const mmc_serve_request *req, void **prompt, int64_t *n_prompt,
                    int64_t *default_max_new, mmc_serve_error *err);
    mmc_status (*generate)(void *self, void *prompt, const mmc_serve_request *req, const mmc_serve_gen *g);
    void (*release)(void *self, void *prompt);
    /* Continuous batching (all three set, else requests run one at a time through generate):
     * the language model whose decode steps the engine batches (mmc_qwen2_decode_batch), the
     * prompt's prefill into a fresh single-sequence cache (the model's own, images included)
     * with the prompt's token ids (history for penalties), the last position's logits [V] in
     * ctx and the RoPE offset of later tokens (Qwen2-VL's rope delta, else 0), and the
     * sampler and EOS ids generate would use (eos: MMC_GEN_MAX_EOS slots, go->eos_ids points there). */
    struct mmc_qwen2 *lm;
    mmc_status (*prefill)(void *self, void *prompt, mmc_ctx *ctx, mmc_kv_cache *kv, const int32_t **ids,
                          int64_t *n_ids, float **logits, int64_t *rope_delta);
    void (*sampling)(void *self, void *prompt, const mmc_serve_request *req, const mmc_serve_gen *g,
                     mmc_gen_opts *go, int32_t *eos);
    /* Optional: true with the prompt's ids when it is text only (its prefill is the LM's alone:
     * the engine then prefills several such prompts in one packed pass). */
    bool (*text_ids)(void *self, void *prompt, const int32_t **ids, int64_t *n_ids);
    /* Optional, both or neither: the prefix cache of image prompts (Qwen2-VL / Qwen2.5-VL, LLaVA-1.5 /
     * NeXT / OneVision, InternVL).
     * media_hash: true for a prompt with images (no video or audio) with its ids and, per
     * position, the content hash of the image an image placeholder stands for (its pixel_values
     * and grid; 0 for text; *mm lives with the prompt): vLLM's mm_hash in the block hash chain.
     * media_inputs: the decoder inputs of positions [from, n) after a cached prefix: embeddings
     * [1, n - from, C] with the vision features at the placeholders (the backend's encoder cache
     * of features by content hash, else its vision tower runs: *encoded 1), the RoPE tables
     * (Qwen2-VL's M-RoPE, else positions from .. n - 1) and the rope delta of later tokens (0
     * but for Qwen2-VL). */
    bool (*media_hash)(void *self, void *prompt, const int32_t **ids, int64_t *n_ids, const uint64_t **mm);
    mmc_status (*media_inputs)(void *self, void *prompt, mmc_ctx *ctx, int64_t from, mmc_tensor **embeds,
                               mmc_tensor **cos, mmc_tensor **sin, int64_t *rope_delta, int *encoded);
    /* Per-request LoRA adapters (`--lora NAME=DIR`, vLLM's multi-LoRA serving): a request whose
     * "model" is lora_names[k] runs with loras[k], loaded on the model's linears (mmc_lora_load)
     * and detached; the engine attaches it for that request's prefill (or generate) and adds
     * each sequence's own delta in the batched decode (mmc_qwen2_decode_batch_lora). */
    int n_loras;
    const char *const *lora_names;
    const char *const *lora_dirs;        /* /v1/models' "root" of each */
    struct mmc_lora_set *const *loras;
    const char *model_root;              /* the base model's directory (/v1/models' "root"), or NULL */
} mmc_serve_backend;

/* ------------------------------------------------------------------ server */
typedef struct {
    const char *host;            /* default 127.0.0.1 */
    int port;                    /* 0: any free port (printed) */
    const char *api_key;         /* NULL: no auth */
    const char *media_root;      /* NULL: no local image paths */
    int threads;                 /* compute threads (0: all cores) */
    /* paged KV cache of the batching engine: blocks of kv_block_size positions; kv_blocks of
     * them (0: kv_memory_mib's worth, 0: enough for max_batch full contexts up to 4 GiB) */
    int64_t kv_blocks, kv_block_size, kv_memory_mib;
    int max_batch;               /* sequences decoded together (default 64) */
    int64_t prefill_tokens;      /* prompt tokens prefilled per step while others decode (default 512) */
    int64_t prefill_chunk;       /* > 0: text prompts prefilled at most this many tokens per step, a long
                                  * one over several steps between decode steps (0: whole prompts) */
    bool no_prefix_cache;        /* do not reuse the KV blocks of earlier prompts' common prefixes */
    mmc_serve_limits limits;
} mmc_serve_options;

/* Run until SIGTERM / SIGINT: then stop accepting, cancel queued requests, end in-flight streams
 * (their final chunk and [DONE]) and return MMC_OK. Prints "listening on http://HOST:PORT". */
mmc_status mmc_serve_run(const mmc_serve_backend *b, const mmc_serve_options *o);

#ifdef __cplusplus
}
#endif
#endif
