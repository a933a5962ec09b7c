/* test_yaml.c — YAML run configs: the tree with line numbers, --set overrides, and
 * schema-driven reading with errors that name file:line, the key path and the reason. */
#include "test_util.h"

#include <stddef.h>

#define FIX "tests/fixtures/io/"

static bool contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
#define CHECK_MSG(sub) CHECKF(contains(mmc_last_error(), sub), "message '%s' lacks '%s'", mmc_last_error(), sub)

/* ---- the schema of a run config */
typedef struct { int64_t steps, batch_size; bool bf16; mmc_str_list datasets; } train_cfg;
typedef struct { int name; double lr, weight_decay; char *betas_note; } opt_cfg;
typedef struct {
    char *model;
    int64_t seed;
    train_cfg train;
    opt_cfg optimizer;
    mmc_str_list tags;
} run_cfg;

static const char *const g_opt_names[] = {"adamw", "sgd", "lion", NULL};
static const mmc_cfg_field g_train[] = {
    {"steps", MMC_CFG_INT, offsetof(train_cfg, steps), 1, 1e9, NULL, NULL, "optimizer steps"},
    {"batch_size", MMC_CFG_INT, offsetof(train_cfg, batch_size), 1, 4096, NULL, NULL, NULL},
    {"bf16", MMC_CFG_BOOL, offsetof(train_cfg, bf16), 1, 0, NULL, NULL, NULL},
    {"datasets", MMC_CFG_STR_LIST, offsetof(train_cfg, datasets), 1, 0, NULL, NULL, NULL},
    {0},
};
static const mmc_cfg_field g_opt[] = {
    {"name", MMC_CFG_ENUM, offsetof(opt_cfg, name), 1, 0, g_opt_names, NULL, NULL},
    {"lr", MMC_CFG_FLOAT, offsetof(opt_cfg, lr), 0, 1, NULL, NULL, NULL},
    {"weight_decay", MMC_CFG_FLOAT, offsetof(opt_cfg, weight_decay), 1, 0, NULL, NULL, NULL},
    {"betas_note", MMC_CFG_STR, offsetof(opt_cfg, betas_note), 1, 0, NULL, NULL, NULL},
    {0},
};
static const mmc_cfg_field g_run[] = {
    {"model", MMC_CFG_STR, offsetof(run_cfg, model), 1, 0, NULL, NULL, NULL},
    {"seed", MMC_CFG_INT, offsetof(run_cfg, seed), 1, 0, NULL, NULL, NULL},
    {"train", MMC_CFG_SECTION, offsetof(run_cfg, train), 1, 0, NULL, g_train, NULL},
    {"optimizer", MMC_CFG_SECTION, offsetof(run_cfg, optimizer), 1, 0, NULL, g_opt, NULL},
    {"tags", MMC_CFG_STR_LIST, offsetof(run_cfg, tags), 1, 0, NULL, NULL, NULL},
    {0},
};

static void defaults(run_cfg *c) {
    memset(c, 0, sizeof *c);
    c->seed = 1;
    c->train.steps = 10;
    c->train.batch_size = 1;
    c->optimizer.lr = 1e-3;
}

static void test_file(void) {
    mmc_yaml *y = NULL;
    CHECK_OK(mmc_yaml_load(FIX "run.yaml", &y));
    if (!y) return;
    CHECK(mmc_yaml_kind_of(y) == MMC_YAML_MAP && mmc_yaml_len(y) == 5);
    CHECK(strcmp(mmc_yaml_key(y, 0), "model") == 0);
    const mmc_yaml *opt = mmc_yaml_get(y, "optimizer");
    CHECK(opt && mmc_yaml_kind_of(opt) == MMC_YAML_MAP);
    const mmc_yaml *lr = mmc_yaml_get(opt, "lr");
    CHECK(lr && mmc_yaml_line(lr) == 11 && strcmp(mmc_yaml_scalar(lr), "2e-5") == 0);
    const mmc_yaml *tags = mmc_yaml_get(y, "tags");
    CHECK(tags && mmc_yaml_kind_of(tags) == MMC_YAML_LIST && mmc_yaml_len(tags) == 2);
    CHECK(strcmp(mmc_yaml_scalar(mmc_yaml_item(tags, 1)), "chat") == 0);
    CHECK(mmc_yaml_line(mmc_yaml_item(tags, 1)) == 16);
    CHECK(mmc_yaml_get(y, "nope") == NULL && mmc_yaml_scalar(opt) == NULL);

    run_cfg c;
    defaults(&c);
    CHECK_OK(mmc_cfg_read(y, g_run, &c, FIX "run.yaml"));
    CHECK(c.model && strcmp(c.model, "qwen2-vl-2b") == 0);
    CHECK(c.seed == 42 && c.train.steps == 1000 && c.train.batch_size == 8 && c.train.bf16);
    CHECK(c.train.datasets.n == 2 && strcmp(c.train.datasets.items[1], "cc3m") == 0);
    CHECK(c.optimizer.name == 0 && c.optimizer.lr == 2e-5 && c.optimizer.weight_decay == 1.0e-4);
    CHECK(c.optimizer.betas_note && strcmp(c.optimizer.betas_note, "0.9, 0.95") == 0);
    CHECK(c.tags.n == 2 && strcmp(c.tags.items[0], "vision") == 0);

    /* overrides, then read again over the same struct (old strings are freed) */
    CHECK_OK(mmc_yaml_set(y, "optimizer.lr", "1e-4"));
    CHECK_OK(mmc_yaml_set(y, "optimizer.name", "lion"));
    CHECK_OK(mmc_yaml_set(y, "train.datasets", "[laion, 'coyo', \"x y\"]"));
    CHECK_OK(mmc_yaml_set(y, "model", "other"));
    CHECK_OK(mmc_yaml_set(y, "tags", "~"));
    CHECK_OK(mmc_cfg_read(y, g_run, &c, FIX "run.yaml"));
    CHECK(c.optimizer.lr == 1e-4 && c.optimizer.name == 2 && strcmp(c.model, "other") == 0);
    CHECK(c.train.datasets.n == 3 && strcmp(c.train.datasets.items[2], "x y") == 0);
    CHECK(c.tags.n == 0);
    CHECK(mmc_yaml_line(mmc_yaml_get(mmc_yaml_get(y, "optimizer"), "lr")) == 0);

    CHECK_ERR(mmc_yaml_set(y, "seed.x", "1"), MMC_ERR_INVALID);
    CHECK_MSG("'seed' is a scalar");
    CHECK_ERR(mmc_yaml_set(y, "a..b", "1"), MMC_ERR_INVALID);
    CHECK_ERR(mmc_yaml_set(y, "train.datasets", "[a, b"), MMC_ERR_FORMAT);
    CHECK_MSG("--set train.datasets");
    CHECK_OK(mmc_yaml_set(y, "optimizer.lr", "abc"));
    CHECK_ERR(mmc_cfg_read(y, g_run, &c, "run.yaml"), MMC_ERR_FORMAT);
    CHECK_MSG("run.yaml: --set optimizer.lr: expected a number, found \"abc\"");
    CHECK_OK(mmc_yaml_set(y, "optimizer.lr", "0.1"));
    CHECK_OK(mmc_yaml_set(y, "extra.deep.key", "1"));     /* creates maps */
    CHECK_ERR(mmc_cfg_read(y, g_run, &c, "run.yaml"), MMC_ERR_FORMAT);
    CHECK_MSG("--set: unknown key 'extra'");
    mmc_cfg_free(g_run, &c);
    CHECK(c.model == NULL && c.tags.items == NULL && c.train.datasets.n == 0);
    mmc_yaml_free(y);
}

/* Parse text as "run.yaml" and read it with the run schema; returns the status. */
static mmc_status read_text(const char *text, run_cfg *c) {
    defaults(c);
    mmc_yaml *y = NULL;
    mmc_status rc = mmc_yaml_parse(text, strlen(text), "run.yaml", &y);
    if (rc == MMC_OK) rc = mmc_cfg_read(y, g_run, c, "run.yaml");
    mmc_yaml_free(y);
    return rc;
}

static void test_errors(void) {
    static const struct { const char *text; mmc_status st; const char *msg; } cases[] = {
        {"optimizer:\n  name: sgd\n  lr: fast\n", MMC_ERR_FORMAT,
         "run.yaml:3: optimizer.lr: expected a number, found \"fast\""},
        {"optimizer:\n  lr: 1.5\n", MMC_ERR_INVALID, "run.yaml:2: optimizer.lr: 1.5 must be in [0, 1]"},
        {"optimizer:\n  lr: -.inf\n", MMC_ERR_INVALID, "must be in [0, 1]"},
        {"optimizer:\n  lr: .nan\n", MMC_ERR_INVALID, "must be in [0, 1]"},
        {"model: x\nseed: 3\noptimiser:\n  lr: 0.1\n", MMC_ERR_FORMAT,
         "run.yaml:3: unknown key 'optimiser' (did you mean 'optimizer'?)"},
        {"optimizer:\n  lrr: 0.1\n", MMC_ERR_FORMAT,
         "run.yaml:2: unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)"},
        {"zzzzzz: 1\n", MMC_ERR_FORMAT, "run.yaml:1: unknown key 'zzzzzz'"},
        {"optimizer:\n  name: adamx\n", MMC_ERR_INVALID,
         "run.yaml:2: optimizer.name: expected one of adamw, sgd, lion, found \"adamx\" (did you mean 'adamw'?)"},
        {"train:\n  bf16: maybe\n", MMC_ERR_FORMAT, "run.yaml:2: train.bf16: expected a boolean (true/false), found \"maybe\""},
        {"train:\n  steps: 1.5\n", MMC_ERR_FORMAT, "run.yaml:2: train.steps: expected an integer, found \"1.5\""},
        {"train:\n  steps: 0\n", MMC_ERR_INVALID, "train.steps: 0 must be in [1, 1000000000]"},
        {"train:\n  steps: 99999999999999999999\n", MMC_ERR_FORMAT, "out of the 64-bit integer range"},
        {"seed: [1, 2]\n", MMC_ERR_FORMAT, "run.yaml:1: seed: expected an integer, found a list"},
        {"seed:\n", MMC_ERR_FORMAT, "seed: expected an integer, found an empty value"},
        {"model: {a: 1}\n", MMC_ERR_FORMAT, "run.yaml:1: model: expected a string, found a map"},
        {"tags: [a, [b]]\n", MMC_ERR_FORMAT, "run.yaml:1: tags[1]: expected a string, found a list"},
        {"tags: a\n", MMC_ERR_FORMAT, "tags: expected a list of strings, found \"a\""},
        {"train: 5\n", MMC_ERR_FORMAT, "train: expected a map (section), found \"5\""},
        {"- a\n- b\n", MMC_ERR_FORMAT, "run.yaml:1: expected a map of settings at the top level"},
        {"seed: 1\nseed: 2\n", MMC_ERR_FORMAT, "run.yaml:2: duplicate key 'seed' (first at line 1)"},
        {"a: &x 1\nb: *x\n", MMC_ERR_UNSUPPORTED, "run.yaml:1: YAML anchors/aliases are not supported"},
        {"a: 1\n---\nb: 2\n", MMC_ERR_UNSUPPORTED, "more than one YAML document"},
        {"? [a, b]\n: 1\n", MMC_ERR_UNSUPPORTED, "only scalar map keys"},
        {"model: x\nseed: 1: 2\n", MMC_ERR_FORMAT, "run.yaml:2:"},
        {"train:\n  steps: 1\n bad: 2\n", MMC_ERR_FORMAT, "run.yaml:3:"},
        {"tags: [a, b\nseed: 3\n", MMC_ERR_FORMAT, "run.yaml:"},
        {"model: \"unterminated\n", MMC_ERR_FORMAT, "YAML syntax error"},
        {"train:\n\tsteps: 1\n", MMC_ERR_FORMAT, "run.yaml:2:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_cfg c;
        mmc_clear_error();
        mmc_status rc = read_text(cases[i].text, &c);
        CHECKF(rc == cases[i].st, "case %zu: got %d (%s), expected %d", i, rc, mmc_last_error(), cases[i].st);
        CHECKF(contains(mmc_last_error(), cases[i].msg), "case %zu: message '%s' lacks '%s'", i,
               mmc_last_error(), cases[i].msg);
        mmc_cfg_free(g_run, &c);
    }
}

static void test_styles(void) {
    run_cfg c;
    /* flow style, YAML booleans, number spellings */
    CHECK_OK(read_text("optimizer: {name: sgd, lr: 1.0e-4, weight_decay: -2E+1}\n"
                       "train: {bf16: No, steps: 1e3, batch_size: 0x10, datasets: []}\n"
                       "tags: [x, 'y z', \"w\"]\nseed: -7\n", &c));
    CHECK(c.optimizer.name == 1 && c.optimizer.lr == 1.0e-4 && c.optimizer.weight_decay == -20);
    CHECK(!c.train.bf16 && c.train.steps == 1000 && c.train.batch_size == 16 && c.train.datasets.n == 0);
    CHECK(c.tags.n == 3 && strcmp(c.tags.items[1], "y z") == 0 && c.seed == -7);
    mmc_cfg_free(g_run, &c);
    CHECK_OK(read_text("train:\n  bf16: true\n  datasets:\n    - a\n    - b\nmodel: |\n  two\n  lines\n", &c));
    CHECK(c.train.bf16 && c.train.datasets.n == 2 && strcmp(c.model, "two\nlines\n") == 0);
    mmc_cfg_free(g_run, &c);
    CHECK_OK(read_text("train: {bf16: yes}\noptimizer:\n", &c));    /* empty section */
    CHECK(c.train.bf16 && c.optimizer.lr == 1e-3 && c.train.steps == 10);   /* defaults kept */
    mmc_cfg_free(g_run, &c);
    CHECK_OK(read_text("", &c));                                    /* empty document */
    CHECK_OK(read_text("# only a comment\n", &c));
    CHECK_OK(read_text("model: ~\nseed: 5\n", &c));
    CHECK(c.model == NULL && c.seed == 5);
    mmc_cfg_free(g_run, &c);
    /* the tree of a flow document keeps lines */
    mmc_yaml *y = NULL;
    const char *t = "a:\n  b: [1,\n     2]\n";
    CHECK_OK(mmc_yaml_parse(t, strlen(t), "t.yaml", &y));
    const mmc_yaml *b = mmc_yaml_get(mmc_yaml_get(y, "a"), "b");
    CHECK(b && mmc_yaml_kind_of(b) == MMC_YAML_LIST && mmc_yaml_line(mmc_yaml_item(b, 1)) == 3);
    mmc_yaml_free(y);
    mmc_yaml *e = (mmc_yaml *)1;
    CHECK_ERR(mmc_yaml_load(FIX "missing.yaml", &e), MMC_ERR_NOT_FOUND);
    CHECK(e == NULL);
    CHECK_MSG("missing.yaml");
}

int main(void) {
    test_file();
    test_errors();
    test_styles();
    return test_done("test_yaml");
}
