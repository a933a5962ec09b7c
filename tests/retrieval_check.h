/* retrieval_check.h — what test_clip_model and test_siglip_model share: `mmc eval --task retrieval`'s
 * result (mmc_retrieval_eval) against the reference's expected.json — the image and caption counts,
 * every image's rank of its first caption and every caption's rank of its image (equal), and the
 * image->text / text->image recall@1/5/10 (within 1e-12: both are counts over the same n).
 * Include after test_util.h. */
#ifndef MMC_RETRIEVAL_CHECK_H
#define MMC_RETRIEVAL_CHECK_H

#include "mmc_embed.h"
#include "mmc_io.h"

static void check_retrieval(const mmc_json *exp, const mmc_retrieval_result *r) {
    int64_t ni = 0, nc = 0;
    CHECK_OK(mmc_json_int(exp, "retrieval.images", 0, &ni));
    CHECK_OK(mmc_json_int(exp, "retrieval.captions", 0, &nc));
    CHECK(r->images == ni && r->captions == nc);
    for (int64_t i = 0; i < r->images && i < ni; i++) {
        char key[48];
        int64_t want = -1;
        snprintf(key, sizeof key, "retrieval.i2t_rank.%lld", (long long)i);
        CHECK_OK(mmc_json_int(exp, key, -1, &want));
        CHECKF(r->i2t_rank[i] == want, "image %lld: rank %lld, transformers %lld", (long long)i,
               (long long)r->i2t_rank[i], (long long)want);
    }
    for (int64_t j = 0; j < r->captions && j < nc; j++) {
        char key[48];
        int64_t want = -1;
        snprintf(key, sizeof key, "retrieval.t2i_rank.%lld", (long long)j);
        CHECK_OK(mmc_json_int(exp, key, -1, &want));
        CHECKF(r->t2i_rank[j] == want, "caption %lld: rank %lld, transformers %lld", (long long)j,
               (long long)r->t2i_rank[j], (long long)want);
    }
    static const int K[3] = {1, 5, 10};
    for (int k = 0; k < 3; k++) {
        char key[48];
        double w = -1;
        snprintf(key, sizeof key, "retrieval.i2t_recall@%d", K[k]);
        CHECK_OK(mmc_json_num(exp, key, -1, &w));
        CHECK_NEAR(r->i2t_recall[k], w, 1e-12);
        snprintf(key, sizeof key, "retrieval.t2i_recall@%d", K[k]);
        CHECK_OK(mmc_json_num(exp, key, -1, &w));
        CHECK_NEAR(r->t2i_recall[k], w, 1e-12);
    }
}

#endif
