/* fuzz_yaml.c — libFuzzer target for mmc_yaml_parse, mmc_yaml_set and mmc_cfg_read against
 * a run-config-like schema (ASan's leak check covers mmc_cfg_free). */
#include "mmc_io.h"

#include <stddef.h>

typedef struct { int64_t steps; bool bf16; mmc_str_list data; } sub_cfg;
typedef struct { char *model; int64_t seed; double lr; int opt; sub_cfg train; mmc_str_list tags; } cfg;
static const char *const g_opts[] = {"adamw", "sgd", NULL};
static const mmc_cfg_field g_sub[] = {
    {"steps", MMC_CFG_INT, offsetof(sub_cfg, steps), 1, 100, NULL, NULL, NULL},
    {"bf16", MMC_CFG_BOOL, offsetof(sub_cfg, bf16), 1, 0, NULL, NULL, NULL},
    {"data", MMC_CFG_STR_LIST, offsetof(sub_cfg, data), 1, 0, NULL, NULL, NULL},
    {0},
};
static const mmc_cfg_field g_fields[] = {
    {"model", MMC_CFG_STR, offsetof(cfg, model), 1, 0, NULL, NULL, NULL},
    {"seed", MMC_CFG_INT, offsetof(cfg, seed), 1, 0, NULL, NULL, NULL},
    {"lr", MMC_CFG_FLOAT, offsetof(cfg, lr), 0, 1, NULL, NULL, NULL},
    {"opt", MMC_CFG_ENUM, offsetof(cfg, opt), 1, 0, g_opts, NULL, NULL},
    {"train", MMC_CFG_SECTION, offsetof(cfg, train), 1, 0, NULL, g_sub, NULL},
    {"tags", MMC_CFG_STR_LIST, offsetof(cfg, tags), 1, 0, NULL, NULL, NULL},
    {0},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_yaml *y = NULL;
    if (mmc_yaml_parse((const char *)data, size, "fuzz.yaml", &y) != MMC_OK) return 0;
    cfg c = {0};
    mmc_cfg_read(y, g_fields, &c, "fuzz.yaml");
    if (mmc_yaml_kind_of(y) == MMC_YAML_MAP) {
        mmc_yaml_set(y, "train.steps", "5");
        mmc_yaml_set(y, "tags", "[a, b]");
        mmc_cfg_read(y, g_fields, &c, "fuzz.yaml");
    }
    for (int i = 0; i < mmc_yaml_len(y); i++) {
        (void)mmc_yaml_key(y, i);
        (void)mmc_yaml_line(mmc_yaml_item(y, i));
    }
    mmc_cfg_free(g_fields, &c);
    mmc_yaml_free(y);
    return 0;
}
