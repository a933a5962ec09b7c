/* fuzz_json.c — libFuzzer target for mmc_json_parse and the typed accessors. */
#include "mmc_io.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_json *j = NULL;
    if (mmc_json_parse((const char *)data, size, "fuzz.json", &j) != MMC_OK) return 0;
    static const char *keys[] = {"a", "a.b", "a.b.c", "hidden_size", "vision_config.depth",
                                 "rope_scaling.mrope_section", "layer_types.0", "x.1.y", "", "."};
    for (unsigned k = 0; k < sizeof keys / sizeof *keys; k++) {
        int64_t i;
        double d;
        bool b;
        const char *s;
        int64_t arr[8];
        int n = 8;
        mmc_json_int(j, keys[k], 0, &i);
        mmc_json_num(j, keys[k], 0, &d);
        mmc_json_bool(j, keys[k], false, &b);
        mmc_json_str(j, keys[k], "", &s);
        mmc_json_int_array(j, keys[k], arr, &n);
        (void)mmc_json_has(j, keys[k]);
    }
    mmc_json_free(j);
    return 0;
}
