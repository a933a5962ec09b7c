/* weights.c — binding checkpoint tensors to model fields, shared by every model file.
 * Problems are appended to an error buffer so a loader can report every missing or
 * mis-shaped tensor at once, not just the first. */
#include "mmc_models.h"

#include <stdio.h>
#include <string.h>

mmc_status mmc_model_bind(const mmc_st *st, const char *full, int ndim, const int64_t *shape,
                          bool trainable, mmc_tensor **slot, char *errs, size_t errcap) {
    const mmc_st_entry *e = mmc_st_find(st, full);
    size_t used = strlen(errs);
    if (!e) {
        snprintf(errs + used, errcap - used, "\n  missing tensor '%s'", full);
        return MMC_ERR_NOT_FOUND;
    }
    bool ok = e->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = e->shape[d] == shape[d];
    if (!ok) {
        mmc_tensor want = {.ndim = ndim}, found = {.ndim = e->ndim};
        memcpy(want.shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(found.shape, e->shape, sizeof found.shape);
        char a[96], b[96];
        snprintf(errs + used, errcap - used, "\n  tensor '%s': expected shape %s, found %s", full,
                 mmc_shape_str(&want, a, sizeof a), mmc_shape_str(&found, b, sizeof b));
        return MMC_ERR_SHAPE;
    }
    if (e->dtype != MMC_F32 && e->dtype != MMC_BF16 && e->dtype != MMC_F16) {
        snprintf(errs + used, errcap - used, "\n  tensor '%s': dtype %s is not a float type", full,
                 mmc_dtype_name(e->dtype));
        return MMC_ERR_UNSUPPORTED;
    }
    mmc_tensor *t;
    /* inference: f32 tensors and bf16 matrices stay in the mapping (zero-copy) */
    bool zero_copy = e->dtype == MMC_F32 || (e->dtype == MMC_BF16 && ndim >= 2);
    size_t align = e->dtype == MMC_F32 ? 4 : 2;
    if (!trainable && zero_copy && ((uintptr_t)e->data % align) == 0) {
        t = mmc_tensor_wrap(e->dtype, ndim, shape, (void *)e->data);
    } else {
        /* vectors (norms, biases) always f32; matrices keep bf16 for inference */
        mmc_dtype dt = trainable || ndim == 1 || e->dtype == MMC_F16 ? MMC_F32 : e->dtype;
        t = mmc_tensor_new(dt, ndim, shape);
        if (t) mmc_convert(t->data, dt, e->data, e->dtype, mmc_numel(t));
    }
    if (!t) return MMC_ERR_OOM;
    if (trainable) t->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    snprintf(t->name, sizeof t->name, "%.*s", (int)sizeof t->name - 1, full);
    *slot = t;
    return MMC_OK;
}
