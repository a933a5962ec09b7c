/* test_contrastive_loss.c — the contrastive losses (src/train/contrastive.c) against transformers
 * (tools/ref/gen_contrastive_loss.py, tests/fixtures/contrastive_loss): CLIPModel / SiglipModel
 * .forward(return_loss=True) on the clip_model / siglip_model fixtures' 4 image-text pairs; from the
 * same pooled projections the loss within 1e-5 and autograd's gradients w.r.t. the projections,
 * logit_scale and logit_bias within 1e-5 (relative to the largest, plus 1e-7); invalid arguments refused. */
#include "test_util.h"

#include <math.h>
#include <string.h>
#include "mmc_embed.h"

static double scalar(const mmc_st *st, const char *name) {
    mmc_tensor *t = fixture_tensor(st, name, MMC_F32);
    double v = t ? ((float *)t->data)[0] : NAN;
    mmc_tensor_free(t);
    return v;
}

static void check_family(const mmc_st *ref, const char *fam, mmc_contrastive_kind kind) {
    char k[64];
    snprintf(k, sizeof k, "%s_img", fam);
    mmc_tensor *img = fixture_tensor(ref, k, MMC_F32);
    snprintf(k, sizeof k, "%s_txt", fam);
    mmc_tensor *txt = fixture_tensor(ref, k, MMC_F32);
    snprintf(k, sizeof k, "%s_d_img", fam);
    mmc_tensor *want_di = fixture_tensor(ref, k, MMC_F32);
    snprintf(k, sizeof k, "%s_d_txt", fam);
    mmc_tensor *want_dt = fixture_tensor(ref, k, MMC_F32);
    if (!img || !txt || !want_di || !want_dt) { g_fail++; return; }
    const int64_t n = img->shape[0], D = img->shape[1];
    mmc_tensor *di = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(n, D)), *dt = mmc_tensor_new(MMC_F32, 2, MMC_SHAPE(n, D));
    snprintf(k, sizeof k, "%s_logit_scale", fam);
    const double s = scalar(ref, k);
    snprintf(k, sizeof k, "%s_logit_bias", fam);
    const double b = kind == MMC_CONTRASTIVE_SIGLIP ? scalar(ref, k) : 0.0;
    mmc_contrastive_out o = {.d_img = di->data, .d_txt = dt->data};
    CHECK_OK(mmc_contrastive_loss(kind, img->data, txt->data, n, D, s, b, &o));
    snprintf(k, sizeof k, "%s_loss", fam);
    const double want_loss = scalar(ref, k);
    CHECK_NEAR(o.loss, want_loss, 1e-5);
    snprintf(k, sizeof k, "%s_d_logit_scale", fam);
    const double want_ds = scalar(ref, k);
    CHECK_NEAR(o.d_logit_scale, want_ds, 1e-5);
    double want_db = 0;
    if (kind == MMC_CONTRASTIVE_SIGLIP) {
        snprintf(k, sizeof k, "%s_d_logit_bias", fam);
        want_db = scalar(ref, k);
        CHECK_NEAR(o.d_logit_bias, want_db, 1e-5);
    }
    CHECK_CLOSE(di, want_di, 1e-7, 1e-5, "d loss / d image projections");
    CHECK_CLOSE(dt, want_dt, 1e-7, 1e-5, "d loss / d text projections");
    printf("%s: loss %.7f (transformers %.7f), d logit_scale %.3g (%.3g), d logit_bias %.3g (%.3g), "
           "max|diff| d_img %.2g d_txt %.2g\n", fam, o.loss, want_loss, o.d_logit_scale, want_ds, o.d_logit_bias, want_db,
           max_abs_diff(di, want_di), max_abs_diff(dt, want_dt));
    mmc_tensor *all[] = {img, txt, want_di, want_dt, di, dt};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) mmc_tensor_free(all[i]);
}

int main(void) {
    mmc_st *ref = fixture_open("contrastive_loss/ref.safetensors");
    if (ref) {
        check_family(ref, "clip", MMC_CONTRASTIVE_CLIP);
        check_family(ref, "siglip", MMC_CONTRASTIVE_SIGLIP);
        mmc_st_close(ref);
    }
    float x[4] = {1, 0, 0, 1};
    mmc_contrastive_out o = {0};
    CHECK(mmc_contrastive_loss(MMC_CONTRASTIVE_CLIP, x, x, 0, 2, 0, 0, &o) == MMC_ERR_INVALID);
    CHECK(mmc_contrastive_loss((mmc_contrastive_kind)7, x, x, 2, 2, 0, 0, &o) == MMC_ERR_INVALID);
    /* a perfectly separated batch at a large scale: the CLIP loss tends to 0 */
    CHECK_OK(mmc_contrastive_loss(MMC_CONTRASTIVE_CLIP, x, x, 2, 2, log(100.0), 0, &o));
    CHECK(o.loss >= 0 && o.loss < 1e-20);
    return test_done("test_contrastive_loss");
}
