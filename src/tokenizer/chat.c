/* chat.c — the Qwen2 / Qwen2-VL ChatML chat template rendered directly in C (no Jinja).
 *
 * Mirrors the output of transformers' apply_chat_template with Qwen2-VL's template
 * (tokenizer_config.json "chat_template"): a default system turn "You are a helpful
 * assistant." when the first message is not a system message, "<|im_start|>{role}\n
 * {content}<|im_end|>\n" per message, image/video parts as vision placeholders (optionally
 * numbered with add_vision_id), and "<|im_start|>assistant\n" for add_generation_prompt.
 * The template text is only inspected to recognise it; anything else is refused.
 */
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;
static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) { b->oom = true; return; }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* 0: unknown, 1: Qwen2 text ChatML, 2: Qwen2-VL ChatML */
static int template_kind(const char *tpl) {
    if (!tpl) return 0;
    if (!strstr(tpl, "<|im_start|>") || !strstr(tpl, "<|im_end|>") ||
        !strstr(tpl, "You are a helpful assistant.") || strstr(tpl, "tools") ||
        strstr(tpl, "tool_call") || strstr(tpl, "<think>") || strstr(tpl, "reasoning_content"))
        return 0;
    if (strstr(tpl, "<|vision_start|><|image_pad|><|vision_end|>")) return 2;
    if (strstr(tpl, "image") || strstr(tpl, "video")) return 0;
    return 1;
}

mmc_status mmc_chat_render(const mmc_tokenizer *tok, const mmc_chat_message *msgs, int n_msgs,
                           const mmc_chat_options *opt, char **out, mmc_chat_span **spans,
                           int *n_spans) {
    if (!tok || !out || (n_msgs > 0 && !msgs)) return mmc_error(MMC_ERR_INVALID, "mmc_chat_render: NULL argument");
    *out = NULL;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    int kind = template_kind(tok->chat_template);
    if (!kind)
        return mmc_error(MMC_ERR_UNSUPPORTED,
                         "chat template of %s: %s; mmc renders only the Qwen2/Qwen2-VL ChatML template "
                         "(default system prompt, no tools/thinking)",
                         tok->path, tok->chat_template ? "not a recognised Qwen2/Qwen2-VL ChatML template"
                                                       : "tokenizer_config.json has no chat_template");
    mmc_chat_options o = opt ? *opt : (mmc_chat_options){0};
    sbuf b = {0};
    int n_asst = 0;
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role) return mmc_error(MMC_ERR_INVALID, "mmc_chat_render: message %d has no role", i);
        if (!msgs[i].content && msgs[i].n_parts > 0 && !msgs[i].parts)
            return mmc_error(MMC_ERR_INVALID, "mmc_chat_render: message %d has n_parts but no parts", i);
        if (!msgs[i].content && kind == 1 && msgs[i].n_parts)
            return mmc_error(MMC_ERR_UNSUPPORTED, "chat template of %s is text-only: message %d has content parts", tok->path, i);
        n_asst += !strcmp(msgs[i].role, "assistant");
    }
    mmc_chat_span *sp = NULL;
    if (spans && n_asst) {
        sp = malloc((size_t)n_asst * sizeof *sp);
        if (!sp) return mmc_error(MMC_ERR_OOM, "mmc_chat_render: out of memory");
    }
    int k = 0, n_img = 0, n_vid = 0;
    char num[64];
    for (int i = 0; i < n_msgs; i++) {
        const mmc_chat_message *m = &msgs[i];
        if (i == 0 && strcmp(m->role, "system"))
            sb_str(&b, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
        sb_str(&b, "<|im_start|>");
        sb_str(&b, m->role);
        sb_str(&b, "\n");
        bool asst = !strcmp(m->role, "assistant");
        size_t start = b.n;
        if (m->content) sb_str(&b, m->content);
        else
            for (int j = 0; j < m->n_parts; j++) {
                const mmc_chat_part *p = &m->parts[j];
                if (p->type == MMC_CHAT_IMAGE) {
                    n_img++;
                    if (o.add_vision_id) { snprintf(num, sizeof num, "Picture %d: ", n_img); sb_str(&b, num); }
                    sb_str(&b, "<|vision_start|><|image_pad|><|vision_end|>");
                } else if (p->type == MMC_CHAT_VIDEO) {
                    n_vid++;
                    if (o.add_vision_id) { snprintf(num, sizeof num, "Video %d: ", n_vid); sb_str(&b, num); }
                    sb_str(&b, "<|vision_start|><|video_pad|><|vision_end|>");
                } else if (p->text) sb_str(&b, p->text);
            }
        sb_str(&b, "<|im_end|>");
        if (asst && sp) { sp[k].start = (int64_t)start; sp[k].end = (int64_t)b.n; }
        k += asst;
        sb_str(&b, "\n");
    }
    if (o.add_generation_prompt) sb_str(&b, "<|im_start|>assistant\n");
    if (!b.p) sb_add(&b, "", 0);
    if (b.oom) { free(b.p); free(sp); return mmc_error(MMC_ERR_OOM, "mmc_chat_render: out of memory"); }
    *out = b.p;
    if (spans) *spans = sp;
    if (n_spans) *n_spans = n_asst;
    return MMC_OK;
}

mmc_status mmc_chat_encode(const mmc_tokenizer *tok, const mmc_chat_message *msgs, int n_msgs,
                           const mmc_chat_options *opt, int32_t **ids, uint8_t **mask, int64_t *n) {
    if (!ids || !n) return mmc_error(MMC_ERR_INVALID, "mmc_chat_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    if (mask) *mask = NULL;
    char *s = NULL;
    mmc_chat_span *sp = NULL;
    int nsp = 0;
    int64_t *offs = NULL;
    mmc_status st = mmc_chat_render(tok, msgs, n_msgs, opt, &s, &sp, &nsp);
    if (st) return st;
    st = mmc_tokenizer_encode_offsets(tok, s, -1, false, ids, &offs, n);
    if (!st && mask) {
        *mask = calloc((size_t)*n + 1, 1);
        if (!*mask) st = mmc_error(MMC_ERR_OOM, "mmc_chat_encode: out of memory");
        else
            for (int64_t i = 0, k = 0; i < *n; i++) {
                int64_t a = offs[2 * i];
                while (k < nsp && a >= sp[k].end) k++;
                (*mask)[i] = k < nsp && a >= sp[k].start;
            }
    }
    if (st) { free(*ids); *ids = NULL; *n = 0; }
    free(offs);
    free(sp);
    free(s);
    return st;
}
