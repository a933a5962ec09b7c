/* cmd_template.c — `mmc template`: render a chat template and print exactly what
 * transformers' apply_chat_template(tokenize=False) would give: the template of a model
 * directory (transformers 5's precedence, see mmc_template_find) or a file, over
 * OpenAI/HF-style messages from a JSON file. Exit 1 with the template's error (a
 * raise_exception() message verbatim), 2 for usage errors. */
#include "cli.h"
#include "mmc_template.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

void help_template(FILE *f) {
    fprintf(f,
            "usage: mmc template (--model DIR | --template FILE) --messages M.json [options]\n\n"
            "Render a chat template as transformers' apply_chat_template(tokenize=False) does\n"
            "(jinja2 sandbox, trim_blocks, lstrip_blocks, loop controls, transformers' tojson)\n"
            "and write exactly the rendered text to stdout (no newline added).\n\n"
            "The template of DIR is the first of: chat_template.jinja, chat_template.json,\n"
            "processor_config.json's and tokenizer_config.json's \"chat_template\" (a string or a\n"
            "list of {name, template}). bos_token / eos_token default to tokenizer_config.json's.\n\n"
            "options:\n"
            "  --model DIR                 model directory holding the chat template\n"
            "  --template FILE             a Jinja template file (instead of --model)\n"
            "  --chat-template FILE        with --model: use FILE instead of the model's template\n"
            "  --chat-template-name NAME   pick the named template of a list (default \"default\")\n"
            "  --messages FILE             JSON array of messages {role, content, tool_calls, ...};\n"
            "                              content is a string or a list of parts (text, image,\n"
            "                              image_url, video, audio); '-' reads stdin (required)\n"
            "  --tools FILE                JSON array of tool schemas (the template's `tools`)\n"
            "  --documents FILE            JSON array of documents (the template's `documents`)\n"
            "  --no-generation-prompt      add_generation_prompt=False (default True)\n"
            "  --bos-token S               bos_token (default: the model's, else unset)\n"
            "  --eos-token S               eos_token (default: the model's, else unset)\n"
            "  --set KEY=JSON              any other template variable, e.g. --set enable_thinking=false\n"
            "                              or --set add_vision_id=true (repeatable; JSON value, or a\n"
            "                              plain string when it is not valid JSON)\n"
            "  -h, --help                  this help\n\n"
            "exit status: 0 rendered; 1 the template or an input failed (message on stderr);\n"
            "2 usage error.\n");
}

static cJSON *read_json(const char *path, const char *what) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) { cli_fail(MMC_OK, "template: cannot open %s file '%s'", what, path); return NULL; }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) { char *q = realloc(buf, cap *= 2); if (!q) { free(buf); buf = NULL; } else buf = q; }
    }
    if (f != stdin) fclose(f);
    if (!buf) { cli_fail(MMC_OK, "template: out of memory reading '%s'", path); return NULL; }
    cJSON *j = cJSON_ParseWithLength(buf, n);
    if (!j) {
        const char *e = cJSON_GetErrorPtr();
        cli_fail(MMC_OK, "template: %s file '%s' is not valid JSON (near byte %ld)", what, path,
                 e && e >= buf && e <= buf + n ? (long)(e - buf) : -1L);
    }
    free(buf);
    return j;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap + 1);
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) { char *q = realloc(buf, (cap *= 2) + 1); if (!q) { free(buf); buf = NULL; } else buf = q; }
    }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tfile = NULL, *ctfile = NULL, *ctname = NULL, *mfile = NULL, *toolsf = NULL, *docsf = NULL;
    const char *bos = NULL, *eos = NULL;
    bool gen = true;
    cJSON *extra = cJSON_CreateObject(), *msgs = NULL, *tools = NULL, *docs = NULL;
    char *src = NULL, *mbos = NULL, *meos = NULL, *out = NULL;
    mmc_template *t = NULL;
    int rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) goto done; } while (0)
        if (!strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "--template")) { VAL(); tfile = v; }
        else if (!strcmp(a, "--chat-template")) { VAL(); ctfile = v; }
        else if (!strcmp(a, "--chat-template-name")) { VAL(); ctname = v; }
        else if (!strcmp(a, "--messages")) { VAL(); mfile = v; }
        else if (!strcmp(a, "--tools")) { VAL(); toolsf = v; }
        else if (!strcmp(a, "--documents")) { VAL(); docsf = v; }
        else if (!strcmp(a, "--no-generation-prompt")) gen = false;
        else if (!strcmp(a, "--bos-token")) { VAL(); bos = v; }
        else if (!strcmp(a, "--eos-token")) { VAL(); eos = v; }
        else if (!strcmp(a, "--set")) {
            VAL();
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) { fprintf(stderr, "mmc: template: --set expects KEY=JSON, got '%s'\n", v); goto done; }
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(eq - v) < 255 ? (int)(eq - v) : 255, v);
            cJSON *jv = cJSON_Parse(eq + 1);
            if (!jv) jv = cJSON_CreateString(eq + 1);
            cJSON_DeleteItemFromObjectCaseSensitive(extra, key);
            cJSON_AddItemToObject(extra, key, jv);
        } else { fprintf(stderr, "mmc: template: unknown option '%s' (see mmc template --help)\n", a); goto done; }
#undef VAL
    }
    if (!model == !tfile) { fprintf(stderr, "mmc: template: give exactly one of --model DIR and --template FILE (see mmc template --help)\n"); goto done; }
    if (!mfile) { fprintf(stderr, "mmc: template: --messages FILE is required (see mmc template --help)\n"); goto done; }
    if (ctfile && !model) { fprintf(stderr, "mmc: template: --chat-template goes with --model (use --template FILE alone)\n"); goto done; }
    rc = 1;
    const char *srcpath = ctfile ? ctfile : tfile;
    if (srcpath) {
        if (!(src = read_text(srcpath))) { cli_fail(MMC_OK, "template: cannot read template file '%s'", srcpath); goto done; }
    } else {
        /* as tokenizer.get_chat_template: with tools and no name, a "tool_use" template wins */
        mmc_status st = !ctname && toolsf ? mmc_template_find(model, "tool_use", &src, NULL) : MMC_ERR_NOT_FOUND;
        if (st) st = mmc_template_find(model, ctname, &src, NULL);
        if (st) { cli_fail(st, "template"); goto done; }
    }
    if (model) {
        mmc_status st = mmc_template_special_tokens(model, &mbos, &meos);
        if (st) { cli_fail(st, "template"); goto done; }
    }
    if (!bos) bos = mbos;
    if (!eos) eos = meos;
    if (bos && !cJSON_GetObjectItemCaseSensitive(extra, "bos_token")) cJSON_AddStringToObject(extra, "bos_token", bos);
    if (eos && !cJSON_GetObjectItemCaseSensitive(extra, "eos_token")) cJSON_AddStringToObject(extra, "eos_token", eos);
    if (!(msgs = read_json(mfile, "messages"))) goto done;
    if (!cJSON_IsArray(msgs)) { cli_fail(MMC_OK, "template: '%s' must hold a JSON array of messages", mfile); goto done; }
    if (toolsf && !(tools = read_json(toolsf, "tools"))) goto done;
    if (docsf && !(docs = read_json(docsf, "documents"))) goto done;
    mmc_status st = mmc_template_parse(src, -1, &t);
    if (st) { fprintf(stderr, "mmc: template: %s\n", mmc_last_error()); goto done; }
    size_t n = 0;
    st = mmc_template_render_chat(t, msgs, tools, docs, gen, extra, NULL, &out, &n);
    if (st) { fprintf(stderr, "%s\n", mmc_last_error()); goto done; }
    fwrite(out, 1, n, stdout);
    fflush(stdout);
    rc = 0;
done:
    free(out);
    mmc_template_free(t);
    free(src);
    free(mbos);
    free(meos);
    cJSON_Delete(extra);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(docs);
    return rc;
}
