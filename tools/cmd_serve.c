/* cmd_serve.c — `mmc serve`: an OpenAI-compatible server for one model directory (see
 * include/mmc_serve.h for the server). This file is its backend: the model, chat template,
 * image processor and generation loop of `mmc generate` (tools/runner.c), so a served greedy
 * completion equals `mmc generate`'s for the same messages. Images arrive as bytes (data:
 * URIs, written to a private temporary file for the shared loader) or as paths the server
 * resolved under --media-root; audio (Qwen2.5-Omni: input_audio / audio_url parts) as bytes
 * decoded from memory (mmc_audio_load_mem_max) or such paths. */
#include "cli.h"
#include "mmc_serve.h"
#include "runner.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void help_serve(FILE *f) {
    mmc_serve_limits l;
    mmc_serve_limits_default(&l);
    fprintf(f,
            "usage: mmc serve --model DIR [options]\n\n"
            "Serve the model in DIR over HTTP with OpenAI's API:\n"
            "  POST /v1/chat/completions   messages with text and image_url parts (base64 data: URIs;\n"
            "                              local paths only under --media-root; URLs are never fetched),\n"
            "                              and for Qwen2.5-Omni input_audio parts ({\"data\": base64,\n"
            "                              \"format\": wav, mp3, flac, ogg, opus, m4a, aac or webm}) and\n"
            "                              audio_url parts (data: URIs, or paths under --media-root)\n"
            "  POST /v1/completions        a raw prompt (no chat template)\n"
            "  GET  /v1/models, /v1/models/ID, /health, /metrics (Prometheus text)\n"
            "  GET  /                      a chat page (streaming, image upload / paste, stop, settings)\n"
            "Prompts are rendered with the model's own chat template and generated exactly as `mmc\n"
            "generate` does (greedy unless temperature > 0 or the model's generation_config.json samples).\n"
            "Requests: stream (SSE, data: [DONE]), stream_options.include_usage, max_tokens /\n"
            "max_completion_tokens, temperature, top_p, top_k, min_p, seed, n, stop, presence_penalty,\n"
            "frequency_penalty, logprobs, top_logprobs. Requests are batched continuously: every step\n"
            "decodes all running sequences together (one GEMM per weight) over a paged KV cache and\n"
            "admits queued prompts (their prefill) while blocks allow; when blocks run out the youngest\n"
            "sequence is preempted (its blocks freed, recomputed later). Greedy output equals `mmc generate`'s.\n"
            "SIGTERM / SIGINT: stop accepting, cancel queued and running requests (their streams end\n"
            "with a final chunk and [DONE]), exit 0.\n\n"
            "options:\n"
            "  --model DIR              Hugging Face model directory, or a LoRA adapter directory\n"
            "  --adapter DIR            apply this PEFT LoRA adapter to the model\n"
            "  --lora NAME=DIR          serve the PEFT LoRA adapter in DIR as model NAME (repeatable):\n"
            "                           a request whose \"model\" is NAME runs with it, the base name\n"
            "                           without; /v1/models lists each (parent: the base). Requests of\n"
            "                           different adapters are batched together (the base weights once,\n"
            "                           each sequence its own low-rank delta); greedy output equals\n"
            "                           `mmc generate --adapter DIR`'s. Not with --adapter\n"
            "  --served-model-name N    the model id clients use (default: DIR's last component)\n"
            "  --chat-template FILE     render with this Jinja template instead of the model's\n"
            "  --chat-template-name N   use the model's template named N\n"
            "  --host H                 address to bind (default 127.0.0.1; 0.0.0.0 = every interface)\n"
            "  --port P                 TCP port (default 8080; 0 = any free port, printed on start)\n"
            "  --api-key KEY            require 'Authorization: Bearer KEY' on every route but /health\n"
            "                           (default: $MMC_API_KEY if set, else no key)\n"
            "  --media-root DIR         allow image_url / audio_url paths (or file:// URLs) to files under DIR\n"
            "  --threads N              compute threads (default: OMP_NUM_THREADS, else all cores)\n"
            CLI_QUANTIZE_HELP
            "limits (an OpenAI-style 4xx error beyond each):\n"
            "  --max-body-bytes N       request body size (default %zu; 413)\n"
            "  --max-json-depth N       JSON nesting (default %d)\n"
            "  --max-images N           images per request (default %d)\n"
            "  --max-image-pixels N     pixels of one decoded image (default %lld)\n"
            "  --max-audios N           audio parts per request (default %d)\n"
            "  --max-audio-seconds S    seconds of one decoded audio clip (default %g; the model's\n"
            "                           feature extractor window may be shorter: 30 s for Whisper's)\n"
            "  --max-prompt-tokens N    prompt tokens (default: the model's context length)\n"
            "  --max-tokens N           max_tokens at most, and the default when a request gives none\n"
            "                           and the model's generation_config.json sets no length (default %d)\n"
            "  --request-timeout S      seconds per request; generation stops there with\n"
            "                           finish_reason \"length\" (default %g)\n"
            "  --max-connections N      concurrent requests; more get 503 (default %d; connections\n"
            "                           beyond N + 16 are refused outright)\n"
            "  --max-queue N            requests queued or running; more get 429 (default %d)\n"
            "  --client-timeout S       a request's headers and body must arrive within S seconds\n"
            "                           (slow clients are disconnected); idle connections close then\n"
            "                           too (default %g)\n"
            "  --max-n N                the largest n (default %d)\n"
            "batching:\n"
            "  --kv-blocks N            KV cache blocks (default: from --kv-memory)\n"
            "  --kv-memory MIB          KV cache size (default: max-batch full contexts, at most 4096)\n"
            "  --kv-block-size N        positions per block (default 16)\n"
            "  --max-batch N            sequences decoded together (default 64)\n"
            "  --prefill-tokens N       prompt tokens admitted per step while others decode (default 512;\n"
            "                           whole prompts: one longer prompt still goes alone)\n"
            "  --prefill-chunk N        prefill text prompts N tokens per step, interleaved with the\n"
            "                           decode steps of running requests (default 0: whole prompts)\n"
            "  --no-prefix-cache        do not reuse the KV cache of earlier prompts' common prefixes\n"
            "                           (on by default for text prompts and images of Qwen2-VL / 2.5-VL,\n"
            "                           LLaVA-1.5 / NeXT / OneVision and InternVL:\n"
            "                           full blocks, hashed over the tokens and each image's content)\n"
            "  --no-batching            run requests one at a time (the unbatched engine)\n"
            "  -h, --help               this help\n\n"
            "example:\n"
            "  mmc serve --model ./Qwen2-VL-2B-Instruct --port 8080 &\n"
            "  curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
            "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 32}'\n",
            l.max_body_bytes, l.max_json_depth, l.max_images, (long long)l.max_image_pixels, l.max_audios,
            l.max_audio_seconds, l.max_output_tokens,
            l.max_request_seconds, l.max_connections, l.max_queue, l.client_timeout_seconds, l.max_n);
}

#define SERVE_MAX_LORAS 64
#define SERVE_ENC_SLOTS 32
/* the encoder cache (vLLM's): one image's vision features [rows, C], by content hash and adapter */
typedef struct {
    uint64_t key;
    int64_t rows;
    float *f;
    uint64_t used;
} enc_slot;

typedef struct {
    cli_model m;
    char tmpdir[64];
    unsigned long long n_tmp;
    enc_slot enc[SERVE_ENC_SLOTS];
    uint64_t enc_tick;
    int n_loras;
    const char *lora_names[SERVE_MAX_LORAS], *lora_dirs[SERVE_MAX_LORAS];
    mmc_lora_set *loras[SERVE_MAX_LORAS];
} serve_backend;

/* --lora NAME=DIR: the adapter loaded by the model's own attach (mmc_lora_load on its linears,
 * as `mmc generate --adapter`), then taken from the model and detached: the engine attaches it
 * per request. */
static mmc_status load_lora(cli_model *m, const char *dir, mmc_lora_set **out) {
    mmc_lora_set **slot;
    mmc_status st;
    if (m->llava) { st = mmc_llava_attach_adapter(m->llava, dir); slot = &m->llava->adapter; }
    else if (m->vl) { st = mmc_qwen2_vl_attach_adapter(m->vlm, dir); slot = &m->vlm->adapter; }
    else if (m->internvl) { st = mmc_internvl_attach_adapter(m->internvl, dir); slot = &m->internvl->adapter; }
    else if (m->omni) { st = mmc_omni_attach_adapter(m->omni, dir); slot = &m->omni->lm->adapter; }
    else if (m->lm) { st = mmc_qwen2_attach_adapter(m->lm, dir); slot = &m->lm->adapter; }
    else return mmc_error(MMC_ERR_UNSUPPORTED, "%s: LoRA adapters are not supported for %s models", dir, m->model_type);
    if (st) return mmc_error_prefix(st, "--lora %s", dir);
    *out = *slot;
    *slot = NULL;
    for (int i = 0; i < (*out)->n; i++) (*out)->mods[i]->lora = NULL;
    return MMC_OK;
}

typedef struct {
    cli_prompt p;
    int lora;                 /* the request's adapter (keys the encoder cache) */
    /* media_hash's, computed once: per position the image content hash (0: text), per image
     * its hash and its placeholder run [start, start + len) */
    bool mm_done, mm_ok;
    uint64_t *mm, *img_hash;
    int64_t (*run)[2];        /* per image: its first placeholder, the end of its last */
    int64_t *mm_tokens;       /* per image: its placeholders (feature rows) */
    int n_img;
    int32_t image_token;
} serve_prompt;

static bool backend_prepare(void *self, const mmc_serve_request *req, void **out, int64_t *n_prompt,
                            int64_t *default_max_new, mmc_serve_error *err) {
    serve_backend *sb = self;
    cli_model *m = &sb->m;
    int n_msgs = req->kind == MMC_SERVE_CHAT ? req->n_msgs : 0, n_parts = 0;
    for (int i = 0; i < n_msgs; i++) n_parts += req->msgs[i].n_parts;
    mmc_chat_message *msgs = calloc(n_msgs > 0 ? (size_t)n_msgs : 1, sizeof *msgs);
    mmc_chat_part *parts = calloc((size_t)(n_parts ? n_parts : 1), sizeof *parts);
    const char **images = calloc((size_t)(req->n_images ? req->n_images : 1), sizeof *images);
    char **tmp = calloc((size_t)(req->n_images ? req->n_images : 1), sizeof *tmp);
    cli_audio *audios = calloc((size_t)(req->n_audios ? req->n_audios : 1), sizeof *audios);
    char(*names)[48] = calloc((size_t)(req->n_audios ? req->n_audios : 1), sizeof *names);   /* for messages */
    serve_prompt *sp = calloc(1, sizeof *sp);
    int n_img = 0, n_tmp = 0, n_aud = 0;
    bool ok = false;
    if (!msgs || !parts || !images || !tmp || !audios || !names || !sp) {
        mmc_serve_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        goto done;
    }
    int np = 0;
    for (int i = 0; i < n_msgs; i++) {
        const mmc_serve_message *q = &req->msgs[i];
        msgs[i] = (mmc_chat_message){.role = q->role, .content = q->content, .parts = parts + np, .n_parts = q->n_parts,
                                     .tool_calls = q->tool_calls, .name = q->name, .tool_call_id = q->tool_call_id};
        for (int k = 0; k < q->n_parts; k++) {
            const mmc_serve_part *p = &q->parts[k];
            parts[np++] = (mmc_chat_part){.type = p->type, .text = p->text};
            if (p->type == MMC_CHAT_AUDIO) {   /* decoded from memory by the prompt builder */
                snprintf(names[n_aud], sizeof names[n_aud], "messages.[%d].content.[%d]", i, k);
                audios[n_aud] = (cli_audio){.path = p->path, .data = p->data, .n_data = p->n_data, .name = names[n_aud]};
                n_aud++;
                continue;
            }
            if (p->type != MMC_CHAT_IMAGE) continue;
            if (p->path) { images[n_img++] = p->path; continue; }
            char path[128];
            snprintf(path, sizeof path, "%s/img%llu", sb->tmpdir, sb->n_tmp++);
            if (mmc_write_file_atomic(path, p->data, p->n_data) != MMC_OK || !(tmp[n_tmp] = strdup(path))) {
                mmc_serve_fail(err, 500, "server_error", NULL, NULL, "cannot store the image: %s", mmc_last_error());
                goto done;
            }
            images[n_img++] = tmp[n_tmp++];
        }
    }
    if (n_img && !m->vl && !m->llava && !m->internvl && !m->omni) {
        mmc_serve_fail(err, 400, "invalid_request_error", "messages", "image_not_supported",
                       "The model %s is text-only (model_type %s) and takes no images.", m->base_dir, m->model_type);
        goto done;
    }
    if (n_aud && !m->omni) {
        mmc_serve_fail(err, 400, "invalid_request_error", "messages", "audio_not_supported",
                       "The model %s (model_type %s) has no audio encoder and takes no audio; audio input needs a "
                       "Qwen2.5-Omni model.", m->base_dir, m->model_type);
        goto done;
    }
    m->chat_tools = req->tool_choice != MMC_SERVE_TOOLS_NONE ? req->tools : NULL;   /* this prompt only */
    mmc_status st = n_aud ? cli_prompt_build_audio(m, msgs, n_msgs, images, n_img, audios, n_aud, NULL, &sp->p)
                          : cli_prompt_build(m, msgs, n_msgs, req->kind == MMC_SERVE_COMPLETION, req->prompt, images,
                                             n_img, NULL, &sp->p);
    m->chat_tools = NULL;
    const char *e = mmc_last_error();
    if (st && n_aud && (strstr(e, "messages.[") || !strncmp(e, "audio ", 6) || strstr(e, "Qwen2.5-Omni audio"))) {
        /* the reader's / feature extractor's message (a data part's names the part, a path's the file) */
        bool long_ = strstr(e, "longer than") || strstr(e, "more than the");
        mmc_serve_fail(err, 400, "invalid_request_error", "messages", long_ ? "audio_too_long" : "invalid_audio",
                       "Cannot use the audio: %s", mmc_last_error());
        goto done;
    }
    if (st) {
        bool image = n_img && (strstr(mmc_last_error(), "image") || strstr(mmc_last_error(), "JPEG") ||
                               strstr(mmc_last_error(), "PNG") || strstr(mmc_last_error(), "pixels"));
        mmc_serve_fail(err, 400, "invalid_request_error", "messages", image ? "invalid_image" : NULL,
                       "Cannot build the prompt: %s", mmc_last_error());
        goto done;
    }
    sp->lora = req->lora;
    *n_prompt = sp->p.n;
    *default_max_new = m->gen.length_set ? mmc_gen_config_max_new(&m->gen, sp->p.n) : -1;
    *out = sp;
    sp = NULL;
    ok = true;
done:
    for (int i = 0; i < n_tmp; i++) { unlink(tmp[i]); free(tmp[i]); }
    free(tmp);
    free(audios);
    free(names);
    free(images);
    free(parts);
    free(msgs);
    free(sp);
    return ok;
}

static void backend_sampling(void *self, void *prompt, const mmc_serve_request *req, const mmc_serve_gen *g,
                             mmc_gen_opts *out, int32_t *eos) {
    serve_backend *sb = self;
    serve_prompt *sp = prompt;
    cli_sampling s;
    cli_sampling_init(&s);
    if (!isnan(req->temperature)) s.temperature = req->temperature;
    if (!isnan(req->top_p)) s.top_p = req->top_p;
    if (!isnan(req->min_p)) s.min_p = req->min_p;
    if (req->top_k >= 0) s.top_k = req->top_k;
    s.max_new = g->max_new;
    s.seed = (long long)g->seed;
    mmc_gen_opts go = {0};
    cli_sampling_resolve(&sb->m, &s, g->max_new, sp->p.n, &go, eos);
    go.max_new_tokens = g->max_new;
    go.sampler.seed = g->seed;
    go.sampler.presence_penalty = (float)req->presence_penalty;
    go.sampler.frequency_penalty = (float)req->frequency_penalty;
    go.sampler.on_logits = g->on_logits;
    go.sampler.logits_user = g->user;
    go.on_token = g->on_token;
    go.user = g->user;
    *out = go;
}

static mmc_status backend_generate(void *self, void *prompt, const mmc_serve_request *req, const mmc_serve_gen *g) {
    serve_backend *sb = self;
    serve_prompt *sp = prompt;
    mmc_gen_opts go;
    int32_t eos[MMC_GEN_MAX_EOS];
    backend_sampling(self, prompt, req, g, &go, eos);
    int32_t *out = malloc((size_t)(g->max_new + 1) * sizeof *out);
    if (!out) return mmc_error(MMC_ERR_OOM, "out of memory");
    int n_out = 0;
    mmc_status st = cli_generate(&sb->m, &sp->p, &go, out, &n_out);
    free(out);
    return st;
}

/* the prompt's prefill as cli_generate's decoder runs it (for the batching engine) */
static mmc_status backend_prefill(void *self, void *prompt, mmc_ctx *ctx, mmc_kv_cache *kv, const int32_t **ids,
                                  int64_t *n_ids, float **logits, int64_t *rope_delta) {
    serve_backend *sb = self;
    cli_model *m = &sb->m;
    cli_prompt *p = &((serve_prompt *)prompt)->p;
    mmc_qwen2_vl_request req = {m->vlm, &p->media, 0};
    mmc_llava_request lreq = {m->llava, p->llava_pixels, (const int64_t (*)[2])p->llava_sizes, p->llava_n_images,
                              p->llava_video};
    mmc_internvl_request ireq = {m->internvl, p->internvl_pixels};
    mmc_omni_request oreq = {m->omni, &p->omni, 0};
    mmc_decoder d = m->llava ? mmc_llava_decoder(&lreq) : m->internvl ? mmc_internvl_decoder(&ireq)
                  : m->omni ? mmc_omni_decoder(&oreq) : m->vl ? mmc_qwen2_vl_decoder(&req) : mmc_qwen2_decoder(m->lm);
    *ids = p->ids;
    *n_ids = p->n;
    mmc_status st = d.prefill(ctx, d.self, p->ids, p->n, kv, logits);
    *rope_delta = m->vl ? req.rope_delta : m->omni ? oreq.rope_delta : 0;
    return st;
}

static bool backend_text_ids(void *self, void *prompt, const int32_t **ids, int64_t *n_ids) {
    (void)self;
    cli_prompt *p = &((serve_prompt *)prompt)->p;
    if (p->media.n_images || p->media.n_videos || p->llava_pixels || p->internvl_pixels) return false;
    if (p->omni.n_audios || p->omni.n_images || p->omni.n_videos) return false;   /* Qwen2.5-Omni's media */
    *ids = p->ids;
    *n_ids = p->n;
    return true;
}

/* ------------------------------------------------------------------ image prefix caching
 * One mechanism for every VLM served here (Qwen2-VL / Qwen2.5-VL, LLaVA-1.5 / NeXT / OneVision,
 * InternVL): each family only says, in media_layout, where a prompt's images are (per image its
 * rows of the processor's pixel tensor, the values that further decide its features: grid, size,
 * OneVision's several-image flag; and the placeholder tokens it takes) and, in media_encode, how
 * its tower turns all of them into features [sum of tokens, C] in placeholder order. The content
 * hash, the encoder cache, the splice of features into the token embeddings and the RoPE tables
 * of positions after a cached prefix are shared. An image's content hash covers what the vision
 * tower sees: its pixel rows (the processor's output, so the same picture sent as PNG or JPEG of
 * equal pixels hashes alike only if the decoded pixels are equal) and those values. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *b = data;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

typedef struct {
    int64_t row0, rows;       /* its rows of the pixel tensor (dim 0) */
    int64_t tokens;           /* its placeholder tokens (= its feature rows) */
    int64_t meta[4];          /* grid (t, h, w) / size (h, w) and multi / tiles: hashed with the pixels */
} media_img;

/* The prompt's images: *n of them in *img (malloc'd), the pixel tensor, the placeholder id and
 * the language model. false: not cacheable (no images, a video or audio, a layout this does not
 * know), and the model's own prefill runs it. */
static bool media_layout(serve_backend *sb, cli_prompt *p, media_img **img, int *n, const mmc_tensor **px,
                         int32_t *tok) {
    cli_model *m = &sb->m;
    *img = NULL, *n = 0;
    int k = 0;
    if (m->vl) {   /* Qwen2-VL / Qwen2.5-VL: pixel_values [rows, D], a grid per image, merge^2 rows a token */
        const mmc_vl_media *md = &p->media;
        if (md->n_videos || md->n_images <= 0 || !md->pixel_values) return false;
        const int64_t merge = m->vlm->visual->cfg.spatial_merge_size;
        if (!(*img = calloc((size_t)md->n_images, sizeof **img))) return false;
        for (int64_t row = 0; k < md->n_images; k++) {
            const int64_t *g = md->image_grid_thw + 3 * k, rows = g[0] * g[1] * g[2];
            (*img)[k] = (media_img){row, rows, rows / (merge * merge), {g[0], g[1], g[2], 0}};
            row += rows;
        }
        *px = md->pixel_values;
        *tok = (int32_t)m->vlm->image_token_id;
    } else if (m->llava) {   /* pixels [P, 3, S, S]: one tile per image (1.5), NeXT / OneVision's tiles by size */
        const mmc_llava *L = m->llava;
        /* past a sliding window the model's own prefill says why it cannot run the prompt */
        if (!p->llava_pixels || p->llava_video || (L->sliding_window > 0 && p->n > L->sliding_window)) return false;
        const int ni = L->variant == MMC_LLAVA_15 ? (int)p->llava_pixels->shape[0] : p->llava_n_images;
        if (ni <= 0 || !(*img = calloc((size_t)ni, sizeof **img))) return false;
        for (int64_t row = 0; k < ni; k++) {
            if (L->variant == MMC_LLAVA_15) {
                (*img)[k] = (media_img){row, 1, mmc_llava_image_tokens(L), {0}};
            } else {
                const int64_t h = p->llava_sizes[k][0], w = p->llava_sizes[k][1];
                const bool multi = ni > 1;
                (*img)[k] = (media_img){row, mmc_llava_image_patches(L, h, w, multi),
                                        mmc_llava_next_image_tokens(&m->nproc, h, w, multi), {h, w, multi, 0}};
            }
            row += (*img)[k].rows;
        }
        *px = p->llava_pixels;
        *tok = (int32_t)L->image_token_id;
    } else if (m->internvl) {   /* tiles [N, 3, s, s]; each image one <img> ... </img> run of tiles x tile tokens */
        if (!p->internvl_pixels || p->internvl_pixels->ndim != 4) return false;
        const int32_t t = (int32_t)m->internvl->image_token_id;
        const int64_t per = mmc_internvl_tile_tokens(m->internvl, p->internvl_pixels->shape[2]);
        int cap = 0;
        int64_t row = 0;
        for (int64_t i = 0; i < p->n;) {
            if (p->ids[i] != t) { i++; continue; }
            int64_t j = i;
            while (j < p->n && p->ids[j] == t) j++;
            if (per <= 0 || (j - i) % per) { free(*img); *img = NULL; return false; }
            if (k == cap) {
                media_img *g = realloc(*img, (size_t)(cap = cap ? 2 * cap : 4) * sizeof *g);
                if (!g) { free(*img); *img = NULL; return false; }
                *img = g;
            }
            (*img)[k++] = (media_img){row, (j - i) / per, j - i, {(j - i) / per, 0, 0, 0}};
            row += (j - i) / per;
            i = j;
        }
        if (!k || row != p->internvl_pixels->shape[0]) { free(*img); *img = NULL; return false; }
        *px = p->internvl_pixels;
        *tok = t;
    } else {
        return false;   /* text models; Qwen2.5-Omni's media take its own prefill */
    }
    *n = k;
    return true;
}

/* every image's features [sum of tokens, C] in placeholder order, as the model's own prefill computes them */
static mmc_status media_encode(serve_backend *sb, cli_prompt *p, mmc_ctx *ctx, mmc_tensor **out) {
    cli_model *m = &sb->m;
    if (m->vl)
        return mmc_vision_forward(ctx, m->vlm->visual, p->media.pixel_values, p->media.image_grid_thw,
                                  p->media.n_images, out, NULL);
    if (m->llava)
        return mmc_llava_image_features_sized(ctx, m->llava, p->llava_pixels, (const int64_t (*)[2])p->llava_sizes,
                                              p->llava_n_images, out);
    return mmc_internvl_image_features(ctx, m->internvl, p->internvl_pixels, out);
}

static mmc_qwen2 *media_lm(const cli_model *m) {
    return m->vl ? m->vlm->lm : m->llava ? m->llava->lm : m->internvl ? m->internvl->lm : NULL;
}

static bool backend_media_hash(void *self, void *prompt, const int32_t **ids, int64_t *n_ids, const uint64_t **mm) {
    serve_backend *sb = self;
    serve_prompt *sp = prompt;
    cli_prompt *p = &sp->p;
    if (!sp->mm_done) {
        sp->mm_done = true;
        media_img *img;
        const mmc_tensor *px;
        int32_t tok;
        int n_img;
        if (!media_layout(sb, p, &img, &n_img, &px, &tok)) return false;
        const size_t row_bytes = (size_t)(mmc_numel(px) / px->shape[0]) * sizeof(float);
        sp->mm = calloc((size_t)p->n, sizeof *sp->mm);
        sp->img_hash = calloc((size_t)n_img, sizeof *sp->img_hash);
        sp->run = calloc((size_t)n_img, sizeof *sp->run);
        sp->mm_tokens = calloc((size_t)n_img, sizeof *sp->mm_tokens);
        sp->n_img = n_img;
        sp->image_token = tok;
        bool ok = sp->mm && sp->img_hash && sp->run && sp->mm_tokens && px->dtype == MMC_F32 && mmc_is_contiguous(px);
        int64_t rows = 0;
        for (int k = 0; ok && k < n_img; k++) {
            uint64_t h = fnv1a(0xCBF29CE484222325ull, img[k].meta, sizeof img[k].meta);
            h = fnv1a(h, (const char *)px->data + (size_t)img[k].row0 * row_bytes, (size_t)img[k].rows * row_bytes);
            sp->img_hash[k] = h | 1;   /* never 0 (text) */
            sp->mm_tokens[k] = img[k].tokens;
            rows += img[k].rows;
            ok = img[k].tokens > 0;
        }
        ok = ok && rows == px->shape[0];
        /* the k-th image's features take the next tokens_k placeholders (in order, as the model's
         * splice puts them); run[k]: its first placeholder and the end of its last */
        int k = 0;
        int64_t r = 0;
        for (int64_t i = 0; ok && i < p->n; i++) {
            if (p->ids[i] != tok) continue;
            if (k == n_img) { ok = false; break; }   /* more placeholders than the images' features */
            if (r == 0) sp->run[k][0] = i;
            sp->mm[i] = sp->img_hash[k];
            if (++r == sp->mm_tokens[k]) {
                sp->run[k][1] = i + 1;
                k++;
                r = 0;
            }
        }
        sp->mm_ok = ok && k == n_img;
        free(img);
    }
    if (!sp->mm_ok) return false;
    *ids = p->ids;
    *n_ids = p->n;
    *mm = sp->mm;
    return true;
}

static enc_slot *enc_find(serve_backend *sb, uint64_t key) {
    for (int i = 0; i < SERVE_ENC_SLOTS; i++)
        if (sb->enc[i].f && sb->enc[i].key == key) { sb->enc[i].used = ++sb->enc_tick; return &sb->enc[i]; }
    return NULL;
}

static void enc_put(serve_backend *sb, uint64_t key, const float *f, int64_t rows, int64_t C) {
    enc_slot *s = &sb->enc[0];
    for (int i = 1; i < SERVE_ENC_SLOTS && s->f; i++)   /* an empty slot, else the least recently used */
        if (!sb->enc[i].f || sb->enc[i].used < s->used) s = &sb->enc[i];
    float *c = malloc((size_t)(rows * C) * sizeof *c);
    if (!c) return;   /* not cached: encoded again next time */
    memcpy(c, f, (size_t)(rows * C) * sizeof *c);
    free(s->f);
    *s = (enc_slot){.key = key, .rows = rows, .f = c, .used = ++sb->enc_tick};
}

/* the decoder inputs of positions [from, n) (what the model's own prefill computes for the whole
 * prompt: token embeddings with the vision features at the placeholders; RoPE tables: Qwen2-VL's
 * M-RoPE from get_rope_index, else positions from .. n - 1), the features taken from the encoder
 * cache when every image they need is there */
static mmc_status backend_media_inputs(void *self, void *prompt, mmc_ctx *ctx, int64_t from, mmc_tensor **embeds,
                                       mmc_tensor **cos, mmc_tensor **sin, int64_t *rope_delta, int *encoded) {
    serve_backend *sb = self;
    serve_prompt *sp = prompt;
    cli_prompt *p = &sp->p;
    mmc_qwen2 *lm = media_lm(&sb->m);
    const mmc_qwen2_config *c = &lm->cfg;
    const int64_t n = p->n, T = n - from, C = c->hidden_size;
    *encoded = 0;
    *rope_delta = 0;
    if (!sp->mm_ok || from < 0 || T <= 0)
        return mmc_error(MMC_ERR_INVALID, "media prefill of positions [%lld, %lld)", (long long)from, (long long)n);
    mmc_status st;
    if (sb->m.vl) {
        int64_t *pos = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * 3 * (size_t)n);
        if ((st = mmc_qwen2_vl_rope_index(sb->m.vlm, p->ids, 1, n, &p->media, pos, rope_delta))) return st;
        mmc_tensor *pt = mmc_new(ctx, MMC_I64, 3, MMC_SHAPE(3, 1, T));
        for (int a = 0; a < 3; a++)
            memcpy((int64_t *)pt->data + a * T, pos + a * n + from, (size_t)T * sizeof(int64_t));
        mmc_rope_table_mrope(ctx, pt, c->mrope_section, (int)c->head_dim, c->rope_theta, cos, sin);   /* [1, T, D] */
    } else {
        mmc_tensor *pt = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(T));
        for (int64_t t = 0; t < T; t++) ((int64_t *)pt->data)[t] = from + t;
        mmc_qwen2_rope_table(ctx, c, pt, cos, sin);                                                   /* [T, D] */
    }
    mmc_tensor *idt = mmc_new(ctx, MMC_I32, 2, MMC_SHAPE(1, T));
    memcpy(idt->data, p->ids + from, (size_t)T * sizeof(int32_t));
    mmc_tensor *e = mmc_contiguous(ctx, mmc_reshape(ctx, mmc_qwen2_embed(ctx, lm, idt), 2, MMC_SHAPE(T, C)));
    const int n_img = sp->n_img;
    const uint64_t salt = (uint64_t)sp->lora * 0x9E3779B97F4A7C15ull;   /* an adapter may adapt the tower */
    bool all = true;
    for (int k = 0; k < n_img && all; k++)
        if (sp->run[k][1] > from) all = enc_find(sb, sp->img_hash[k] ^ salt) != NULL;
    const float *feats = NULL;
    int64_t *off = mmc_arena_alloc(mmc_ctx_arena(ctx), sizeof(int64_t) * (size_t)(n_img + 1));   /* feature rows */
    off[0] = 0;
    for (int k = 0; k < n_img; k++) off[k + 1] = off[k] + sp->mm_tokens[k];
    if (!all) {   /* the tower on the prompt's images (as the model's own prefill runs it), cached per image */
        mmc_tensor *f;
        if ((st = media_encode(sb, p, ctx, &f))) return mmc_error_prefix(st, "images");
        f = mmc_contiguous(ctx, f);
        if (mmc_numel(f) != off[n_img] * C)
            return mmc_error(MMC_ERR_SHAPE, "images: the tower gave %lld values, the placeholders take %lld x %lld",
                             (long long)mmc_numel(f), (long long)off[n_img], (long long)C);
        feats = f->data;   /* [sum of tokens, C] */
        *encoded = 1;
        for (int k = 0; k < n_img; k++)
            enc_put(sb, sp->img_hash[k] ^ salt, feats + off[k] * C, off[k + 1] - off[k], C);
    }
    /* each placeholder at or after from: the next row of its image's features */
    float *ed = e->data;
    const int32_t tok = sp->image_token;
    int k = 0;
    int64_t r = 0;
    const float *src = NULL;
    for (int64_t i = 0; i < n && k < n_img; i++) {
        if (p->ids[i] != tok) continue;
        if (i >= from) {
            if (!src) src = feats ? feats + off[k] * C : enc_find(sb, sp->img_hash[k] ^ salt)->f;
            memcpy(ed + (i - from) * C, src + r * C, (size_t)C * sizeof *ed);
        }
        if (++r == off[k + 1] - off[k]) { k++; r = 0; src = NULL; }
    }
    *embeds = mmc_reshape(ctx, e, 3, MMC_SHAPE(1, T, C));
    return MMC_OK;
}

static void backend_release(void *self, void *prompt) {
    (void)self;
    serve_prompt *sp = prompt;
    cli_prompt_free(&sp->p);
    free(sp->mm);
    free(sp->img_hash);
    free(sp->run);
    free(sp->mm_tokens);
    free(sp);
}

static int opt_ll(const char *o, int argc, char **argv, int *i, long long lo, long long hi, long long *out) {
    const char *v = cli_value(argc, argv, i);
    return v && cli_int(o, v, lo, hi, out) ? 0 : -1;
}

int cmd_serve(int argc, char **argv) {
    mmc_serve_options o = {.host = "127.0.0.1", .port = 8080, .api_key = getenv("MMC_API_KEY")};
    if (o.api_key && !o.api_key[0]) o.api_key = NULL;
    mmc_serve_limits_default(&o.limits);
    const char *model = NULL, *adapter = NULL, *name = NULL, *tpl = NULL, *tpl_name = NULL;
    const char *lora_arg[SERVE_MAX_LORAS];
    int n_lora = 0;
    bool no_batch = false;
    int quant = 0;   /* --quantize */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long long v = 0;
        double x = 0;
        const char **slot = !strcmp(a, "--model") ? &model : !strcmp(a, "--adapter") ? &adapter
                          : !strcmp(a, "--served-model-name") ? &name : !strcmp(a, "--host") ? &o.host
                          : !strcmp(a, "--api-key") ? &o.api_key : !strcmp(a, "--media-root") ? &o.media_root
                          : !strcmp(a, "--chat-template") ? &tpl : !strcmp(a, "--chat-template-name") ? &tpl_name : NULL;
        if (slot) {
            if (!(*slot = cli_value(argc, argv, &i))) return CLI_USAGE;
        } else if (!strcmp(a, "--port")) {
            if (opt_ll(a, argc, argv, &i, 0, 65535, &v)) return CLI_USAGE;
            o.port = (int)v;
        } else if (!strcmp(a, "--bf16-matmul")) {
            cli_bf16_matmul("serve");
        } else if (!strcmp(a, "--matmul-precision")) {
            const char *pv = cli_value(argc, argv, &i);
            if (!pv || cli_matmul_precision("serve", pv)) return CLI_USAGE;
        } else if (!strcmp(a, "--quantize")) {
            const char *qv = cli_value(argc, argv, &i);
            if (!qv || cli_quantize_arg("serve", qv, &quant)) return CLI_USAGE;
        } else if (!strcmp(a, "--threads")) {
            if (opt_ll(a, argc, argv, &i, 0, 4096, &v)) return CLI_USAGE;
            o.threads = (int)v;
        } else if (!strcmp(a, "--max-body-bytes")) {
            if (opt_ll(a, argc, argv, &i, 1024, (long long)1 << 34, &v)) return CLI_USAGE;
            o.limits.max_body_bytes = (size_t)v;
        } else if (!strcmp(a, "--max-json-depth")) {
            if (opt_ll(a, argc, argv, &i, 4, 1000, &v)) return CLI_USAGE;
            o.limits.max_json_depth = (int)v;
        } else if (!strcmp(a, "--max-images")) {
            if (opt_ll(a, argc, argv, &i, 0, 1024, &v)) return CLI_USAGE;
            o.limits.max_images = (int)v;
        } else if (!strcmp(a, "--max-image-pixels")) {
            if (opt_ll(a, argc, argv, &i, 1, (long long)1 << 40, &v)) return CLI_USAGE;
            o.limits.max_image_pixels = v;
        } else if (!strcmp(a, "--max-audios")) {
            if (opt_ll(a, argc, argv, &i, 0, 1024, &v)) return CLI_USAGE;
            o.limits.max_audios = (int)v;
        } else if (!strcmp(a, "--max-audio-seconds")) {
            const char *s = cli_value(argc, argv, &i);
            if (!s || !cli_float(a, s, 0.01, MMC_AUDIO_MAX_SECONDS, &x)) return CLI_USAGE;
            o.limits.max_audio_seconds = x;
        } else if (!strcmp(a, "--max-prompt-tokens")) {
            if (opt_ll(a, argc, argv, &i, 1, (long long)1 << 40, &v)) return CLI_USAGE;
            o.limits.max_prompt_tokens = v;
        } else if (!strcmp(a, "--max-tokens")) {
            if (opt_ll(a, argc, argv, &i, 1, 1 << 30, &v)) return CLI_USAGE;
            o.limits.max_output_tokens = (int)v;
        } else if (!strcmp(a, "--request-timeout")) {
            const char *s = cli_value(argc, argv, &i);
            if (!s || !cli_float(a, s, 0.001, 1e7, &x)) return CLI_USAGE;
            o.limits.max_request_seconds = x;
        } else if (!strcmp(a, "--max-connections")) {
            if (opt_ll(a, argc, argv, &i, 1, 100000, &v)) return CLI_USAGE;
            o.limits.max_connections = (int)v;
        } else if (!strcmp(a, "--client-timeout")) {
            const char *s = cli_value(argc, argv, &i);
            if (!s || !cli_float(a, s, 0.1, 86400, &x)) return CLI_USAGE;
            o.limits.client_timeout_seconds = x;
        } else if (!strcmp(a, "--max-queue")) {
            if (opt_ll(a, argc, argv, &i, 1, 100000, &v)) return CLI_USAGE;
            o.limits.max_queue = (int)v;
        } else if (!strcmp(a, "--kv-blocks")) {
            if (opt_ll(a, argc, argv, &i, 1, (long long)1 << 30, &v)) return CLI_USAGE;
            o.kv_blocks = v;
        } else if (!strcmp(a, "--kv-block-size")) {
            if (opt_ll(a, argc, argv, &i, 1, 4096, &v)) return CLI_USAGE;
            o.kv_block_size = v;
        } else if (!strcmp(a, "--kv-memory")) {
            if (opt_ll(a, argc, argv, &i, 1, (long long)1 << 30, &v)) return CLI_USAGE;
            o.kv_memory_mib = v;
        } else if (!strcmp(a, "--max-batch")) {
            if (opt_ll(a, argc, argv, &i, 1, 4096, &v)) return CLI_USAGE;
            o.max_batch = (int)v;
        } else if (!strcmp(a, "--prefill-tokens")) {
            if (opt_ll(a, argc, argv, &i, 1, (long long)1 << 30, &v)) return CLI_USAGE;
            o.prefill_tokens = v;
        } else if (!strcmp(a, "--prefill-chunk")) {
            if (opt_ll(a, argc, argv, &i, 0, (long long)1 << 30, &v)) return CLI_USAGE;
            o.prefill_chunk = v;
        } else if (!strcmp(a, "--lora")) {
            const char *v = cli_value(argc, argv, &i);
            if (!v) return CLI_USAGE;
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || !eq[1])
                return cli_usage("serve", "--lora takes NAME=DIR (the model name requests use, then the PEFT adapter "
                                 "directory), not '%s'", v);
            if (n_lora == SERVE_MAX_LORAS) return cli_usage("serve", "at most %d --lora adapters", SERVE_MAX_LORAS);
            lora_arg[n_lora++] = v;
        } else if (!strcmp(a, "--no-prefix-cache")) {
            o.no_prefix_cache = true;
        } else if (!strcmp(a, "--no-batching")) {
            no_batch = true;
        } else if (!strcmp(a, "--max-n")) {
            if (opt_ll(a, argc, argv, &i, 1, 128, &v)) return CLI_USAGE;
            o.limits.max_n = (int)v;
        } else
            return cli_usage("serve", "unknown option '%s'", a);
    }
    if (!model && !adapter) return cli_usage("serve", "--model DIR is required");
    if (o.api_key && !o.api_key[0]) return cli_usage("serve", "--api-key must not be empty");
    if (n_lora && adapter)
        return cli_usage("serve", "--adapter (one adapter on every request) and --lora (adapters by model name) "
                         "do not go together: serve the --adapter one as --lora NAME=DIR too");

    serve_backend sb = {0};
    mmc_status st = cli_model_load(model ? model : adapter, model ? adapter : NULL, &sb.m);
    if (st) return cli_fail(st, "serve: cannot load the model");
    int rc = CLI_ERROR;
    if ((st = cli_model_quantize(&sb.m, quant))) {
        cli_fail(st, "serve: cannot quantise the model");
        goto done;
    }
    if ((st = cli_model_prepack(&sb.m))) {
        cli_fail(st, "serve: cannot pre-pack the weights");
        goto done;
    }
    if ((st = cli_model_set_template(&sb.m, tpl, tpl_name))) {
        cli_fail(st, "serve: cannot set the chat template");
        goto done;
    }
    sb.m.max_image_pixels = o.limits.max_image_pixels;
    sb.m.max_audio_seconds = o.limits.max_audio_seconds;
    snprintf(sb.tmpdir, sizeof sb.tmpdir, "/tmp/mmc-serve.XXXXXX");
    if (!mkdtemp(sb.tmpdir)) {
        cli_fail(mmc_error(MMC_ERR_IO, "mkdtemp: %s", strerror(errno)), "serve: no temporary directory");
        goto done;
    }
    char id[256];
    if (name) snprintf(id, sizeof id, "%s", name);
    else {
        const char *d = model ? model : adapter;
        size_t n = strlen(d);
        while (n > 1 && d[n - 1] == '/') n--;
        const char *b = d + n;
        while (b > d && b[-1] != '/') b--;
        snprintf(id, sizeof id, "%.*s", (int)(d + n - b), b);
    }
    char names[SERVE_MAX_LORAS][256];
    for (int k = 0; k < n_lora; k++) {
        const char *eq = strchr(lora_arg[k], '=');
        snprintf(names[k], sizeof names[k], "%.*s", (int)(eq - lora_arg[k]), lora_arg[k]);
        bool dup = !strcmp(names[k], id);
        for (int i = 0; i < k; i++) dup |= !strcmp(names[i], names[k]);
        if (dup) {
            cli_usage("serve", "--lora %s: the name '%s' is taken (the served model or another adapter)", lora_arg[k],
                      names[k]);
            rc = CLI_USAGE;
            goto done;
        }
        if ((st = load_lora(&sb.m, eq + 1, &sb.loras[k]))) {
            cli_fail(st, "serve: cannot load the adapter");
            goto done;
        }
        sb.lora_names[k] = names[k];
        sb.lora_dirs[k] = eq + 1;
        sb.n_loras = k + 1;
    }
    mmc_qwen2_vl_request vreq = {sb.m.vlm, NULL, 0};
    mmc_llava_request lreq = {sb.m.llava, NULL, NULL, 0, NULL};
    mmc_internvl_request ireq = {sb.m.internvl, NULL};
    mmc_omni_request oreq = {sb.m.omni, NULL, 0};
    mmc_decoder dec = sb.m.llava ? mmc_llava_decoder(&lreq) : sb.m.internvl ? mmc_internvl_decoder(&ireq)
                    : sb.m.omni ? mmc_omni_decoder(&oreq) : sb.m.vl ? mmc_qwen2_vl_decoder(&vreq)
                    : mmc_qwen2_decoder(sb.m.lm);
    mmc_serve_backend b = {.self = &sb,
                           .tok = sb.m.tok,
                           .model_id = id,
                           .context_length = dec.max_positions,
                           .prepare = backend_prepare,
                           .generate = backend_generate,
                           .release = backend_release,
                           .lm = sb.m.llava ? sb.m.llava->lm : sb.m.internvl ? sb.m.internvl->lm
                               : sb.m.omni ? sb.m.omni->lm : sb.m.vl ? sb.m.vlm->lm : sb.m.lm,
                           .prefill = backend_prefill,
                           .sampling = backend_sampling,
                           .text_ids = backend_text_ids,
                           .media_hash = backend_media_hash,
                           .media_inputs = backend_media_inputs,
                           .n_loras = sb.n_loras,
                           .lora_names = sb.lora_names,
                           .lora_dirs = sb.lora_dirs,
                           .loras = sb.loras,
                           .model_root = sb.m.base_dir};
    if (no_batch) b.lm = NULL;
    st = mmc_serve_run(&b, &o);
    rmdir(sb.tmpdir);
    if (st) cli_fail(st, "serve: cannot serve");
    else rc = 0;
done:
    for (int i = 0; i < SERVE_ENC_SLOTS; i++) free(sb.enc[i].f);
    for (int k = 0; k < sb.n_loras; k++) mmc_lora_free(sb.loras[k]);   /* before the model: they point into it */
    cli_model_free(&sb.m);
    return rc;
}
