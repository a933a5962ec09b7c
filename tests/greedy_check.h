/* greedy_check.h — the VLM tests' check that mmc_generate, driving a model through its decoder
 * interface from the prompt ids [1, T] (int64), gives transformers' greedy tokens `greedy` [1, n]
 * (int64). Include after test_util.h. */
#ifndef MMC_TEST_GREEDY_CHECK_H
#define MMC_TEST_GREEDY_CHECK_H

#include <stdlib.h>

#include "mmc_infer.h"

static void check_greedy(mmc_decoder *dec, const mmc_tensor *ids, const mmc_tensor *greedy, const char *what) {
    const int64_t T = ids->shape[1];
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)T), out[64];
    if (!prompt) { g_fail++; return; }
    for (int64_t t = 0; t < T; t++) prompt[t] = (int32_t)((int64_t *)ids->data)[t];
    int n = 0;
    mmc_gen_opts o = {.max_new_tokens = (int)greedy->shape[1]};
    mmc_sampler_defaults(&o.sampler);
    CHECK_OK(mmc_generate(dec, prompt, T, &o, out, &n));
    bool same = n == greedy->shape[1];
    for (int i = 0; i < n && same; i++) same = out[i] == ((int64_t *)greedy->data)[i];
    CHECKF(same, "%s: greedy tokens differ from transformers' (%d tokens)", what, n);
    free(prompt);
}

#endif
