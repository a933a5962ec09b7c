/* fuzz_plan_calib.c — libFuzzer target for the planner's calibration cache parser
 * (mmc_plan_calib_parse): any bytes give an error naming the line or a cache, never a crash
 * (ASan's leak check covers mmc_plan_calib_free). Nothing is measured: only the parsed network
 * constants are read back. */
#include "mmc_plan.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_plan_calib *c = NULL;
    if (mmc_plan_calib_parse((const char *)data, size, "fuzz.txt", &c) != MMC_OK) return 0;
    mmc_plan_net n;
    (void)mmc_plan_calib_net(c, &n);
    mmc_plan_calib_free(c);
    return 0;
}
