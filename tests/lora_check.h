/* lora_check.h — a trained adapter against the reference's (diffusers / PEFT training fixtures of
 * test_flux, test_sd3, test_unet, test_wan, test_hunyuan): the worst over every adapted module's
 * lora_A and lora_B of max |mmc - reference| / max(max |reference|, 1e-6), the reference's tensors
 * named prefix + module + ".lora_A.weight" / ".lora_B.weight". Include after test_util.h. */
#ifndef MMC_TEST_LORA_CHECK_H
#define MMC_TEST_LORA_CHECK_H

#include "mmc_lora.h"

static double lora_max_rel_diff(const mmc_st *ref, const char *prefix, const mmc_lora_set *s) {
    double worst = 0;
    for (int i = 0; ref && i < s->n; i++)
        for (int ab = 0; ab < 2; ab++) {
            char k[320];
            snprintf(k, sizeof k, "%s%s.lora_%c.weight", prefix, s->names[i], ab ? 'B' : 'A');
            mmc_tensor *want = fixture_tensor(ref, k, MMC_F32), *got = ab ? s->adapters[i].B : s->adapters[i].A;
            worst = fmax(worst, max_abs_diff(got, want) / fmax(max_abs(want), 1e-6));
            mmc_tensor_free(want);
        }
    return worst;
}

#endif
