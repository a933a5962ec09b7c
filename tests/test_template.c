/* test_template.c — the Jinja chat-template engine against transformers.
 *
 * tests/fixtures/template/cases.json (tools/ref/gen_template.py) holds templates written
 * after the published ones (Qwen2-VL, Qwen2.5, Qwen3, Llama 3.1, Mistral, Gemma 1/3,
 * DeepSeek-R1, Phi-3, InternVL 2.5, LLaVA 1.5, and a kitchen-sink template) x message sets,
 * and one-construct units, each with the text transformers' render_jinja_template gives or
 * the error it raises. Every rendering must be byte-equal; where transformers raises, mmc
 * must fail too, and a raise_exception() message must come through verbatim. Plus what the
 * fixtures cannot pin: strftime_now on a fixed clock, error positions, the limits, and the
 * template sources of a model directory. */
#include "mmc_template.h"
#include "mmc_tokenizer.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

static void show_diff(const char *what, const char *exp, const char *got) {
    size_t i = 0;
    while (exp[i] && exp[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu\n    expected: %.120s\n    got:      %.120s\n", what, i,
            exp + from, got + from);
}

#define FIXED_NOW 1733300000   /* 2024-12-04 08:13:20 UTC */

/* render one case and compare with its "expected" / "error" */
static int g_cases, g_bad;
static void check_case(const char *label, const char *src, const cJSON *vars, const cJSON *msgs, const cJSON *tools,
                       const cJSON *docs, bool chat, bool gen, const cJSON *c) {
    g_cases++;
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(c, "expected"), *err = cJSON_GetObjectItemCaseSensitive(c, "error");
    bool raised = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "raised"));
    mmc_template *t = NULL;
    char *out = NULL;
    mmc_status st = mmc_template_parse(src, -1, &t);
    /* strftime_now on tools/ref/gen_template.py's pinned clock (main sets TZ=UTC) */
    mmc_template_limits lim = {.max_output = 1 << 20, .max_steps = 10000000, .now = FIXED_NOW};
    if (!st) st = chat ? mmc_template_render_chat(t, msgs, tools, docs, gen, vars, &lim, &out, NULL)
                       : mmc_template_render(t, vars, &lim, &out, NULL);
    if (cJSON_IsString(exp)) {
        if (st) { g_bad++; fprintf(stderr, "FAIL %s: mmc failed: %s\n", label, mmc_last_error()); }
        else if (strcmp(out, exp->valuestring)) { g_bad++; fprintf(stderr, "FAIL %s: output differs\n", label); show_diff(label, exp->valuestring, out); }
    } else if (cJSON_IsString(err)) {
        if (!st) { g_bad++; fprintf(stderr, "FAIL %s: transformers raises (%s) but mmc rendered %.80s\n", label, err->valuestring, out); }
        else if (raised && strcmp(mmc_last_error(), err->valuestring)) {
            g_bad++;
            fprintf(stderr, "FAIL %s: raise_exception message\n    expected: %s\n    got:      %s\n", label, err->valuestring, mmc_last_error());
        }
    }
    free(out);
    mmc_template_free(t);
}

/* path: the committed corpus, or a file of "units" from tools/ref/diff_template.py */
static void test_fixtures(const char *path) {
    char *s = slurp(path);
    CHECKF(s, "%s missing (run tools/ref/gen_template.py)", path);
    if (!s) return;
    cJSON *d = cJSON_Parse(s);
    free(s);
    CHECK(d);
    if (!d) return;
    const cJSON *tpls = cJSON_GetObjectItemCaseSensitive(d, "templates"), *sets = cJSON_GetObjectItemCaseSensitive(d, "message_sets");
    const cJSON *c;
    int n0 = g_cases, b0 = g_bad;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(d, "chat")) {   /* absent in diff files */
        const char *tn = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
        const char *sn = cJSON_GetObjectItemCaseSensitive(c, "set")->valuestring;
        const cJSON *set = cJSON_GetObjectItemCaseSensitive(sets, sn);
        char label[256];
        snprintf(label, sizeof label, "chat %s x %s", tn, sn);
        check_case(label, cJSON_GetObjectItemCaseSensitive(tpls, tn)->valuestring,
                   cJSON_GetObjectItemCaseSensitive(set, "extra"), cJSON_GetObjectItemCaseSensitive(set, "messages"),
                   cJSON_GetObjectItemCaseSensitive(set, "tools"), cJSON_GetObjectItemCaseSensitive(set, "documents"), true,
                   cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(set, "add_generation_prompt")), c);
    }
    printf("chat cases: %d, %d failed\n", g_cases - n0, g_bad - b0);
    n0 = g_cases, b0 = g_bad;
    int k = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(d, "units")) {
        const char *src = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
        char label[256];
        snprintf(label, sizeof label, "unit %d `%.60s`", k++, src);
        check_case(label, src, cJSON_GetObjectItemCaseSensitive(c, "vars"), NULL, NULL, NULL, false, false, c);
    }
    printf("unit cases: %d, %d failed\n", g_cases - n0, g_bad - b0);
    g_checks += g_cases;
    g_fail += g_bad;
    cJSON_Delete(d);
}

static char *render(const char *src, const char *vars_json, mmc_template_limits *lim, mmc_status *st) {
    mmc_template *t = NULL;
    char *out = NULL;
    cJSON *v = vars_json ? cJSON_Parse(vars_json) : NULL;
    *st = mmc_template_parse(src, -1, &t);
    if (!*st) *st = mmc_template_render(t, v, lim, &out, NULL);
    mmc_template_free(t);
    cJSON_Delete(v);
    return out;
}

static void test_strftime_and_errors(void) {
    mmc_template_limits lim = {.now = FIXED_NOW};
    mmc_status st;
    char *o = render("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M') }}", NULL, &lim, &st);
    CHECK(st == MMC_OK && o && !strcmp(o, "04 Dec 2024|2024-12-04 08:13"));
    free(o);
    /* errors name the line and column */
    o = render("line one\n{% for m in messages %}\n  {{ m.content.nope() }}\n{% endfor %}", "{\"messages\": [{\"content\": 1}]}", NULL, &st);
    CHECK(st != MMC_OK && !o);
    CHECKF(strstr(mmc_last_error(), "line 3"), "%s", mmc_last_error());
    o = render("ok\n{{ 1 +\n}}", NULL, NULL, &st);
    CHECK(st == MMC_ERR_FORMAT);
    CHECKF(strstr(mmc_last_error(), "line 3, column 1"), "%s", mmc_last_error());
    /* limits: an endless-ish loop, huge output, deep recursion */
    mmc_template_limits small = {.max_steps = 100000, .max_output = 1 << 16, .max_memory = 16 << 20, .max_depth = 50};
    mmc_template_limits steps = {.max_steps = 100000};
    o = render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL, &steps, &st);
    CHECKF(st && strstr(mmc_last_error(), "steps"), "%s", mmc_last_error());
    o = render("{% for i in range(100000) %}xxxxxxxxxxxxxxxxxxxxxx{% endfor %}", NULL, &small, &st);
    CHECKF(st && strstr(mmc_last_error(), "exceeds"), "%s", mmc_last_error());
    o = render("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", NULL, &small, &st);
    CHECKF(st && strstr(mmc_last_error(), "deeper"), "%s", mmc_last_error());
    o = render("{{ 'x' * 100000000 }}", NULL, &small, &st);
    CHECKF(st, "%s", "huge repetition refused");
    o = render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", NULL, &small, &st);
    CHECKF(st, "%s", "doubling string refused");
    char deep[2100] = "{{";
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++) strcat(deep, ")");
    strcat(deep, "}}");
    o = render(deep, NULL, NULL, &st);
    CHECKF(st == MMC_ERR_FORMAT && strstr(mmc_last_error(), "deeply"), "%s", mmc_last_error());
}

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    MMC_CHECK(f, "cannot write %s", path);
    fputs(s, f);
    fclose(f);
}

/* write dir/file, then the template found must be `want` */
static void add_and_expect(const char *dir, const char *file, const char *content, const char *want) {
    char p[512], *src = NULL, *origin = NULL;
    snprintf(p, sizeof p, "%s/%s", dir, file);
    write_file(p, content);
    CHECK_OK(mmc_template_find(dir, NULL, &src, &origin));
    CHECKF(src && !strcmp(src, want), "after writing %s: got '%s' from %s, expected '%s'", file, src ? src : "", origin ? origin : "", want);
    free(src);
    free(origin);
}

static void test_sources(void) {
    char dir[] = "/tmp/mmc_tpl_srcXXXXXX";
    MMC_CHECK(mkdtemp(dir), "mkdtemp");
    char p[512], *src = NULL, *origin = NULL, *bos = NULL, *eos = NULL;
    CHECK(mmc_template_find(dir, NULL, &src, NULL) == MMC_ERR_NOT_FOUND);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file(p, "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
                  "\"chat_template\": [{\"name\": \"default\", \"template\": \"TOK\"}, {\"name\": \"tool_use\", \"template\": \"TOOLS\"}]}");
    CHECK_OK(mmc_template_find(dir, NULL, &src, &origin));
    CHECK(src && !strcmp(src, "TOK") && strstr(origin, "tokenizer_config.json"));
    free(src); free(origin);
    CHECK_OK(mmc_template_find(dir, "tool_use", &src, NULL));
    CHECK(src && !strcmp(src, "TOOLS"));
    free(src);
    CHECK(mmc_template_find(dir, "nope", &src, NULL) == MMC_ERR_NOT_FOUND);
    CHECK(strstr(mmc_last_error(), "'tool_use'"));
    CHECK_OK(mmc_template_special_tokens(dir, &bos, &eos));
    CHECK(bos && eos && !strcmp(bos, "<s>") && !strcmp(eos, "</s>"));
    free(bos); free(eos);
    /* a tokenizer: chat_template.jinja over tokenizer_config.json */
    add_and_expect(dir, "chat_template.jinja", "JINJA", "JINJA");
    /* a processor: the legacy chat_template.json over the .jinja (ProcessorMixin) ... */
    add_and_expect(dir, "preprocessor_config.json", "{}", "JINJA");
    add_and_expect(dir, "chat_template.json", "{\"chat_template\": \"JSON\"}", "JSON");
    /* ... and processor_config.json's own chat_template over both */
    add_and_expect(dir, "processor_config.json", "{\"chat_template\": \"PROC\"}", "PROC");
    static const char *const files[] = {"chat_template.jinja", "chat_template.json", "processor_config.json",
                                        "tokenizer_config.json", "preprocessor_config.json"};
    for (int i = 0; i < 5; i++) { snprintf(p, sizeof p, "%s/%s", dir, files[i]); remove(p); }
    rmdir(dir);
}

static void copy_file(const char *from, const char *to) {
    char *s = slurp(from);
    MMC_CHECK(s, "cannot read %s", from);
    write_file(to, s);
    free(s);
}

/* mmc_chat_render (src/tokenizer/chat.c) goes through the engine: the directory's
 * chat_template.jinja wins over tokenizer_config.json, an edited file is read again, and
 * assistant spans come from prefix renders (or the text, for a template that rewrites
 * earlier turns) */
static void test_chat_render(void) {
    char dir[] = "/tmp/mmc_tpl_chatXXXXXX", p[512];
    MMC_CHECK(mkdtemp(dir), "mkdtemp");
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    copy_file("tests/fixtures/tokenizer/tokenizer.json", p);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    write_file(p, "{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}"
                  "{% for c in m.content %}{{ '[IMG]' if c.type == 'image' else c.text }}{% endfor %}{% endif %}</s>\n"
                  "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}");
    mmc_tokenizer *tok = NULL;
    CHECK_OK(mmc_tokenizer_load(dir, &tok));
    mmc_chat_part parts[2] = {{.type = MMC_CHAT_IMAGE}, {.type = MMC_CHAT_TEXT, .text = "What?"}};
    mmc_chat_message m[3] = {{.role = "user", .parts = parts, .n_parts = 2}, {.role = "assistant", .content = "A cat."},
                             {.role = "user", .content = "Sure?"}};
    mmc_chat_options o = {.add_generation_prompt = true};
    char *s = NULL;
    mmc_chat_span *sp = NULL;
    int nsp = 0;
    CHECK_OK(mmc_chat_render(tok, m, 3, &o, &s, &sp, &nsp));
    CHECK(s && !strcmp(s, "<user>[IMG]What?</s>\n<assistant>A cat.</s>\n<user>Sure?</s>\n<assistant>"));
    CHECK(nsp == 1 && sp && s && !strncmp(s + sp[0].start, "A cat.</s>", 10) && sp[0].end - sp[0].start == 10);
    free(s); free(sp);
    /* edited: read again; a template that rewrites history: spans fall back to the text */
    /* (a different size: seen even where mtimes are coarse) */
    write_file(p, "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.role }}: {{ m.content if m.content is string else '' }};{% endfor %}");
    CHECK_OK(mmc_chat_render(tok, m, 3, &o, &s, &sp, &nsp));
    CHECK(s && !strcmp(s, "user: ;assistant: A cat.;LAST user: Sure?;"));
    CHECK(nsp == 1 && sp && s && sp[0].end - sp[0].start == 6 && !strncmp(s + sp[0].start, "A cat.", 6));
    free(s); free(sp);
    /* the template's own error comes through */
    write_file(p, "{{ raise_exception('no chats today') }}x");
    CHECK(mmc_chat_render(tok, m, 3, &o, &s, NULL, NULL) != MMC_OK);
    CHECKF(strstr(mmc_last_error(), "no chats today"), "%s", mmc_last_error());
    mmc_tokenizer_free(tok);
    remove(p);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    remove(p);
    rmdir(dir);
}

int main(int argc, char **argv) {
    setenv("TZ", "UTC", 1);   /* strftime_now's local time, as the fixtures were rendered */
    tzset();
    if (argc > 1) {   /* replay a differential file: build/test_template /tmp/d.json */
        test_fixtures(argv[1]);
        return test_done("test_template");
    }
    test_fixtures("tests/fixtures/template/cases.json");
    test_strftime_and_errors();
    test_sources();
    test_chat_render();
    return test_done("test_template");
}
