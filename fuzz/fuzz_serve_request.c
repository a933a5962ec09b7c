/* fuzz_serve_request.c — libFuzzer target for `mmc serve`'s request parser
 * (src/serve/request.c) on untrusted bodies: JSON of any shape and depth, messages with string
 * or part-list content, image_url and audio_url parts with data: URIs (base64 decoding), local
 * paths (resolved against a media root: the committed fixtures folder) and URLs, input_audio parts
 * ({"data": base64, "format": ...}), every sampling field with
 * wrong types and out-of-range values. The first byte picks the endpoint (chat or completions)
 * and whether a media root is set; the rest is the body. Checked invariants: an accepted request
 * is within the limits (n, stop count, images, audios, messages non-empty for chat, a prompt for
 * completions, every local path inside the media root, an input_audio's format one of the
 * accepted names); a refused one is a 400 whose error body
 * is valid JSON with the four OpenAI fields. */
#include "mmc_serve.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_root[PATH_MAX];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!realpath(MMC_SOURCE_DIR "/tests/fixtures/e2e", g_root)) {
        fprintf(stderr, "fuzz_serve_request: no fixtures folder at %s/tests/fixtures/e2e\n", MMC_SOURCE_DIR);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    mmc_serve_kind kind = data[0] & 1 ? MMC_SERVE_COMPLETION : MMC_SERVE_CHAT;
    const char *root = data[0] & 2 ? g_root : NULL;
    mmc_serve_limits lim;
    mmc_serve_limits_default(&lim);
    lim.max_images = 3;
    lim.max_audios = 3;
    mmc_serve_request r;
    mmc_serve_error e;
    if (mmc_serve_parse_request((const char *)data + 1, size - 1, kind, &lim, root, &r, &e)) {
        if (r.n < 1 || r.n > lim.max_n || r.n_stop < 0 || r.n_stop > MMC_SERVE_MAX_STOP) abort();
        if (r.n_images > lim.max_images || r.top_logprobs < 0 || r.top_logprobs > 20) abort();
        if (r.n_audios > lim.max_audios) abort();
        if (kind == MMC_SERVE_CHAT && (r.n_msgs < 1 || !r.msgs)) abort();
        if (kind == MMC_SERVE_COMPLETION && !r.prompt) abort();
        int images = 0, audios = 0;
        for (int i = 0; i < r.n_msgs; i++) {
            const mmc_serve_message *m = &r.msgs[i];
            if (!m->role || (!m->content && m->n_parts == 0 && !m->parts)) abort();
            for (int k = 0; k < m->n_parts; k++) {
                const mmc_serve_part *p = &m->parts[k];
                if (p->type == MMC_CHAT_TEXT && !p->text) abort();
                if (p->type == MMC_CHAT_AUDIO) {
                    audios++;
                    if (!p->path == !p->data) abort();
                    if (p->path && (!root || strncmp(p->path, root, strlen(root)) != 0)) abort();
                    if (p->data && p->n_data == 0) abort();
                    if (!memchr(p->format, 0, sizeof p->format)) abort();
                    char fb[sizeof p->format + 2];
                    snprintf(fb, sizeof fb, " %s ", p->format);
                    if (p->format[0] && !strstr(" wav mp3 flac ogg opus m4a aac webm ", fb)) abort();
                    if (p->format[0] && !p->data) abort();
                }
                if (p->type == MMC_CHAT_IMAGE) {
                    images++;
                    if (!p->path == !p->data) abort();   /* exactly one source */
                    if (p->path && (!root || strncmp(p->path, root, strlen(root)) != 0)) abort();
                    if (p->data && p->n_data == 0) abort();
                }
            }
        }
        if (images != r.n_images || audios != r.n_audios) abort();
        for (int s = 0; s < r.n_stop; s++)
            if (!r.stop[s] || !r.stop[s][0]) abort();
        mmc_serve_request_free(&r);
    } else {
        if (e.status != 400 || !e.message[0]) abort();
        char *js = mmc_serve_error_json(&e);
        cJSON *j = js ? cJSON_Parse(js) : NULL;
        const cJSON *o = cJSON_GetObjectItem(j, "error");
        if (!o || !cJSON_GetObjectItem(o, "message") || !cJSON_GetObjectItem(o, "type") ||
            !cJSON_GetObjectItem(o, "param") || !cJSON_GetObjectItem(o, "code"))
            abort();
        cJSON_Delete(j);
        free(js);
    }
    return 0;
}
