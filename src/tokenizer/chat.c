/* chat.c — chat messages to the prompt string and ids, through the model's own chat
 * template executed by the Jinja engine (src/template/): the one renderer generate, chat,
 * train and eval share, so that training and serving cannot drift.
 *
 * Mirrors transformers' apply_chat_template(tokenize=False): the template comes from the
 * tokenizer's directory in transformers 5's precedence (mmc_template_find:
 * chat_template.jinja, chat_template.json, processor_config.json, tokenizer_config.json),
 * falling back to the chat_template the tokenizer loaded; bos_token / eos_token come from
 * tokenizer_config.json; content parts become {"type": "text"|"image"|"video"} dicts, and
 * add_vision_id is passed when set.
 *
 * Assistant spans (the training loss mask) are found the way the template itself defines
 * turns: the text an assistant message adds is render(messages[:i+1]) minus
 * render(messages[:i], add_generation_prompt=True), trailing whitespace excluded — for
 * ChatML that is the content plus <|im_end|>. A template that is not prefix-consistent
 * there (one that rewrites earlier turns, e.g. Qwen3 dropping old <think> blocks) falls
 * back to the assistant's text content as found in order in the full rendering.
 *
 * Parsed templates are cached per tokenizer (a few reference-counted entries that live for
 * the process); rendering is reentrant, so several threads may render at once.
 */
#include "tok_internal.h"

#include "mmc_template.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const mmc_tokenizer *tok;
    const char *tok_tpl;   /* tok->chat_template when cached (identity check) */
    const char *tok_name;  /* tok->chat_template_name when cached (identity check) */
    char dir[1024];
    char origin[1100];     /* the file the template came from ("" : tok->chat_template) */
    struct timespec mtime; /* ... and its mtime and size, so an edited file is read again */
    off_t size;
    mmc_template *t;
    char *bos, *eos;
    int refs;              /* renders using it now; only an unused entry is replaced */
    bool cached;           /* false: a private entry (cache full of busy ones), freed on release */
} tpl_cache_entry;

#define TPL_CACHE 8
static tpl_cache_entry g_cache[TPL_CACHE];
static int g_cache_next;
static pthread_mutex_t g_cache_mu = PTHREAD_MUTEX_INITIALIZER;

static bool same_file(const tpl_cache_entry *e) {
    if (!e->origin[0]) return true;
    struct stat sb;
    return !stat(e->origin, &sb) && sb.st_size == e->size && sb.st_mtim.tv_sec == e->mtime.tv_sec &&
           sb.st_mtim.tv_nsec == e->mtime.tv_nsec;
}

/* the parsed template of tok (cached), with bos/eos */
static void entry_clear(tpl_cache_entry *e) {
    mmc_template_free(e->t);
    free(e->bos);
    free(e->eos);
    e->t = NULL;
    e->bos = e->eos = NULL;
}

static void chat_template_release(tpl_cache_entry *e) {
    pthread_mutex_lock(&g_cache_mu);
    bool priv = !e->cached;
    e->refs--;
    pthread_mutex_unlock(&g_cache_mu);
    if (priv) { entry_clear(e); free(e); }
}

static mmc_status chat_template_of(const mmc_tokenizer *tok, tpl_cache_entry **out) {
    char dir[1024];
    const char *sl = strrchr(tok->path, '/');
    snprintf(dir, sizeof dir, "%.*s", sl ? (int)(sl - tok->path) : 1, sl ? tok->path : ".");
    pthread_mutex_lock(&g_cache_mu);
    for (int i = 0; i < TPL_CACHE; i++)
        if (g_cache[i].t && g_cache[i].tok == tok && g_cache[i].tok_tpl == tok->chat_template &&
            g_cache[i].tok_name == tok->chat_template_name && !strcmp(g_cache[i].dir, dir) &&
            same_file(&g_cache[i])) {
            *out = &g_cache[i];
            g_cache[i].refs++;
            pthread_mutex_unlock(&g_cache_mu);
            return MMC_OK;
        }
    char *src = NULL, *bos = NULL, *eos = NULL, *origin = NULL;
    mmc_template *t = NULL;
    mmc_status st = tok->chat_template_override ? MMC_ERR_NOT_FOUND
                                                : mmc_template_find(dir, tok->chat_template_name, &src, &origin);
    /* a template asked for by name that is not there stays an error (it names what there is) */
    bool named = tok->chat_template_name && !tok->chat_template_override;
    if (st == MMC_ERR_NOT_FOUND && tok->chat_template && !named)
        st = (src = strdup(tok->chat_template)) ? MMC_OK : MMC_ERR_OOM;
    if (st == MMC_ERR_NOT_FOUND && !named)
        st = mmc_error(MMC_ERR_UNSUPPORTED, "tokenizer %s has no chat_template (looked for chat_template.jinja, chat_template.json, "
                       "and \"chat_template\" in processor_config.json and tokenizer_config.json); pass one with "
                       "--chat-template FILE", tok->path);
    if (!st) st = mmc_template_special_tokens(dir, &bos, &eos);
    if (!st && (st = mmc_template_parse(src, -1, &t))) mmc_error_prefix(st, "chat template of %s", dir);
    free(src);
    if (st) { free(bos); free(eos); free(origin); pthread_mutex_unlock(&g_cache_mu); return st; }
    /* an unused slot, round-robin; none: a private entry freed after this render */
    tpl_cache_entry *e = NULL;
    for (int k = 0; k < TPL_CACHE && !e; k++) {
        tpl_cache_entry *c = &g_cache[(g_cache_next + k) % TPL_CACHE];
        if (!c->refs) { e = c; g_cache_next = (g_cache_next + k + 1) % TPL_CACHE; }
    }
    if (e) entry_clear(e);
    else if (!(e = calloc(1, sizeof *e))) {
        mmc_template_free(t); free(bos); free(eos); free(origin);
        pthread_mutex_unlock(&g_cache_mu);
        return mmc_error(MMC_ERR_OOM, "mmc_chat_render: out of memory");
    }
    bool cached = e >= g_cache && e < g_cache + TPL_CACHE;
    *e = (tpl_cache_entry){.tok = tok, .tok_tpl = tok->chat_template, .tok_name = tok->chat_template_name, .t = t, .bos = bos, .eos = eos, .refs = 1, .cached = cached};
    snprintf(e->dir, sizeof e->dir, "%s", dir);
    struct stat sb;
    if (origin && !stat(origin, &sb) && S_ISREG(sb.st_mode)) {
        snprintf(e->origin, sizeof e->origin, "%s", origin);
        e->mtime = sb.st_mtim;
        e->size = sb.st_size;
    }
    free(origin);
    *out = e;
    pthread_mutex_unlock(&g_cache_mu);
    return MMC_OK;
}

static cJSON *messages_json(const mmc_chat_message *msgs, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        if (!m) { cJSON_Delete(a); return NULL; }
        cJSON_AddItemToArray(a, m);
        cJSON_AddStringToObject(m, "role", msgs[i].role);
        if (msgs[i].name) cJSON_AddStringToObject(m, "name", msgs[i].name);
        if (msgs[i].tool_call_id) cJSON_AddStringToObject(m, "tool_call_id", msgs[i].tool_call_id);
        cJSON *tc = msgs[i].tool_calls ? cJSON_Parse(msgs[i].tool_calls) : NULL;
        if (tc) {   /* OpenAI sends arguments as a JSON string; templates print them as an object */
            cJSON *call;
            cJSON_ArrayForEach(call, tc) {
                cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
                cJSON *args = fn ? cJSON_GetObjectItemCaseSensitive(fn, "arguments") : NULL;
                cJSON *obj = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
                if (obj) cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj);
            }
            cJSON_AddItemToObject(m, "tool_calls", tc);
        }
        if (msgs[i].content) { cJSON_AddStringToObject(m, "content", msgs[i].content); continue; }
        cJSON *parts = cJSON_AddArrayToObject(m, "content");
        for (int j = 0; parts && j < msgs[i].n_parts; j++) {
            const mmc_chat_part *p = &msgs[i].parts[j];
            cJSON *o = cJSON_CreateObject();
            if (!o) break;
            cJSON_AddItemToArray(parts, o);
            cJSON_AddStringToObject(o, "type", p->type == MMC_CHAT_IMAGE ? "image" : p->type == MMC_CHAT_VIDEO ? "video"
                                                  : p->type == MMC_CHAT_AUDIO ? "audio" : "text");
            if (p->type == MMC_CHAT_TEXT) cJSON_AddStringToObject(o, "text", p->text ? p->text : "");
        }
    }
    return a;
}

static mmc_status render_n(const tpl_cache_entry *e, cJSON *all, int n, bool gen, const cJSON *extra,
                           const cJSON *tools, char **out, size_t *len) {
    cJSON *sub = cJSON_CreateArray();
    if (!sub) return mmc_error(MMC_ERR_OOM, "mmc_chat_render: out of memory");
    for (int i = 0; i < n; i++) cJSON_AddItemReferenceToArray(sub, cJSON_GetArrayItem(all, i));
    mmc_status st = mmc_template_render_chat(e->t, sub, tools, NULL, gen, extra, NULL, out, len);
    cJSON_Delete(sub);
    return st;
}

mmc_status mmc_chat_render(const mmc_tokenizer *tok, const mmc_chat_message *msgs, int n_msgs,
                           const mmc_chat_options *opt, char **out, mmc_chat_span **spans,
                           int *n_spans) {
    if (!tok || !out || (n_msgs > 0 && !msgs)) return mmc_error(MMC_ERR_INVALID, "mmc_chat_render: NULL argument");
    *out = NULL;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    int n_asst = 0;
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role) return mmc_error(MMC_ERR_INVALID, "mmc_chat_render: message %d has no role", i);
        if (!msgs[i].content && msgs[i].n_parts > 0 && !msgs[i].parts)
            return mmc_error(MMC_ERR_INVALID, "mmc_chat_render: message %d has n_parts but no parts", i);
        n_asst += !strcmp(msgs[i].role, "assistant");
    }
    tpl_cache_entry *e;
    mmc_status st = chat_template_of(tok, &e);
    if (st) return st;
    mmc_chat_options o = opt ? *opt : (mmc_chat_options){0};
    cJSON *all = messages_json(msgs, n_msgs), *extra = cJSON_CreateObject();
    cJSON *tools = o.tools ? cJSON_Parse(o.tools) : NULL;
    char *full = NULL, *a = NULL, *b = NULL;
    mmc_chat_span *sp = NULL;
    size_t nf = 0;
    if (!all || !extra) { st = mmc_error(MMC_ERR_OOM, "mmc_chat_render: out of memory"); goto done; }
    if (o.tools && !tools) { st = mmc_error(MMC_ERR_INVALID, "mmc_chat_render: tools are not valid JSON"); goto done; }
    if (e->bos) cJSON_AddStringToObject(extra, "bos_token", e->bos);
    if (e->eos) cJSON_AddStringToObject(extra, "eos_token", e->eos);
    if (o.add_vision_id) cJSON_AddTrueToObject(extra, "add_vision_id");
    if ((st = render_n(e, all, n_msgs, o.add_generation_prompt, extra, tools, &full, &nf))) {
        mmc_error_prefix(st, "chat template of %s", e->dir);
        goto done;
    }
    if (spans && n_asst) {
        if (!(sp = malloc((size_t)n_asst * sizeof *sp))) { st = mmc_error(MMC_ERR_OOM, "mmc_chat_render: out of memory"); goto done; }
        size_t from = 0;
        for (int i = 0, k = 0; i < n_msgs; i++) {
            if (strcmp(msgs[i].role, "assistant")) continue;
            size_t na = 0, nb = 0;
            bool ok = !render_n(e, all, i, true, extra, tools, &a, &na) &&
                      !render_n(e, all, i + 1, false, extra, tools, &b, &nb);
            while (ok && nb > na && (b[nb - 1] == '\n' || b[nb - 1] == ' ' || b[nb - 1] == '\t' || b[nb - 1] == '\r')) nb--;
            ok = ok && na >= from && nb > na && nb <= nf && !memcmp(a, b, na) && !memcmp(b, full, nb);
            if (ok) sp[k] = (mmc_chat_span){(int64_t)na, (int64_t)nb};
            else {   /* not prefix-consistent: the assistant's text, found in order */
                size_t tl = 0;
                char *txt = NULL;
                if (msgs[i].content) txt = strdup(msgs[i].content);
                else {
                    for (int j = 0; j < msgs[i].n_parts; j++) if (msgs[i].parts[j].type == MMC_CHAT_TEXT && msgs[i].parts[j].text) tl += strlen(msgs[i].parts[j].text);
                    if ((txt = calloc(tl + 1, 1)))
                        for (int j = 0; j < msgs[i].n_parts; j++) if (msgs[i].parts[j].type == MMC_CHAT_TEXT && msgs[i].parts[j].text) strcat(txt, msgs[i].parts[j].text);
                }
                const char *hit = txt && *txt ? memmem(full + from, nf - from, txt, strlen(txt)) : NULL;
                sp[k] = hit ? (mmc_chat_span){(int64_t)(hit - full), (int64_t)(hit - full) + (int64_t)strlen(txt)}
                            : (mmc_chat_span){(int64_t)from, (int64_t)from};
                free(txt);
            }
            from = (size_t)sp[k].end;
            k++;
            free(a); free(b);
            a = b = NULL;
        }
    }
    *out = full;
    full = NULL;
    if (spans) { *spans = sp; sp = NULL; }
    if (n_spans) *n_spans = n_asst;
done:
    free(full);
    free(a);
    free(b);
    free(sp);
    cJSON_Delete(all);
    cJSON_Delete(extra);
    cJSON_Delete(tools);
    chat_template_release(e);
    return st;
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
    mmc_status st = mmc_chat_render(tok, msgs, n_msgs, opt, &s, mask ? &sp : NULL, &nsp);
    if (st) return st;
    st = mmc_tokenizer_encode_offsets(tok, s, -1, opt && opt->add_special_tokens, ids, &offs, n);
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
