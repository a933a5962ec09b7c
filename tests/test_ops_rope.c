/* test_ops_rope.c — mmc_rope (apply) gradcheck and PyTorch fixture; the cos/sin tables vs
 * transformers' Qwen2RotaryEmbedding, Qwen2VLRotaryEmbedding (M-RoPE) and
 * Qwen2VLVisionRotaryEmbedding + get_vision_position_ids (tools/ref/gen_rope.py). */
#include "test_util.h"

static mmc_tensor *g_cos, *g_sin;
static mmc_tensor *rope_fn(mmc_ctx *ctx, mmc_tensor **in, void *user) {
    (void)user;
    return mmc_rope(ctx, in[0], g_cos, g_sin);
}

static void test_gradcheck(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    for (int batched = 0; batched < 2; batched++) {
        mmc_tensor *pos = mmc_new(ctx, MMC_I32, batched ? 2 : 1, batched ? MMC_SHAPE(2, 5) : MMC_SHAPE(5));
        for (int64_t i = 0; i < mmc_numel(pos); i++) ((int32_t *)pos->data)[i] = (int32_t)(3 * i + 1);
        mmc_rope_table_1d(ctx, pos, 8, 10000.0, &g_cos, &g_sin);
        mmc_tensor *x = randn_param(5, 4, MMC_SHAPE(2, 5, 3, 8), 1.0f);
        /* linear op: central differences exact up to f32 rounding */
        gradcheck(batched ? "rope [B,T,D]" : "rope [T,D]", rope_fn, &x, 1, NULL, 1e-2, 1e-3, 1e-3, 500);
        mmc_tensor_free(x);
    }
    mmc_ctx_free(ctx);
}

/* x as a strided view (slice of a fused buffer) gives the same result as a contiguous x */
static void test_strided(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *pos = mmc_new(ctx, MMC_I64, 1, MMC_SHAPE(4));
    for (int i = 0; i < 4; i++) ((int64_t *)pos->data)[i] = 7 * i;
    mmc_tensor *c, *s;
    mmc_rope_table_1d(ctx, pos, 8, 10000.0, &c, &s);
    mmc_tensor *buf = randn_param(9, 4, MMC_SHAPE(1, 4, 5, 8), 1.0f);   /* heads 0..1 = "q" */
    mmc_tensor *view = mmc_alias(ctx, buf);
    view->shape[2] = 2;
    mmc_tensor *x = mmc_new(ctx, MMC_F32, 4, MMC_SHAPE(1, 4, 2, 8));
    for (int t = 0; t < 4; t++)
        for (int h = 0; h < 2; h++)
            memcpy((float *)x->data + (t * 2 + h) * 8, (float *)buf->data + (t * 5 + h) * 8, 32);
    CHECK(max_abs_diff(mmc_rope(ctx, view, c, s), mmc_rope(ctx, x, c, s)) == 0);
    mmc_tensor_free(buf);
    mmc_ctx_free(ctx);
}

static void test_apply_fixture(void) {
    mmc_st *st = fixture_open("rope/apply.safetensors");
    if (!st) return;
    mmc_tensor *x = fixture_tensor(st, "x", MMC_F32), *c = fixture_tensor(st, "cos", MMC_F32),
               *s = fixture_tensor(st, "sin", MMC_F32), *r = fixture_tensor(st, "r", MMC_F32),
               *out = fixture_tensor(st, "out", MMC_F32), *dx = fixture_tensor(st, "dx", MMC_F32);
    x->flags |= MMC_PARAM | MMC_REQUIRES_GRAD;
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *y = mmc_rope(ctx, x, c, s);
    memcpy(mmc_grad(ctx, y)->data, r->data, mmc_nbytes(r));
    mmc_backward_range(ctx, 0, mmc_tape_len(ctx));
    CHECK_CLOSE(y, out, 1e-6, 1e-6, "rope apply out");   /* same f32 formula */
    CHECK_CLOSE(x->grad, dx, 1e-6, 1e-6, "rope apply dx");
    mmc_ctx_free(ctx);
    mmc_tensor *all[] = {x, c, s, r, out, dx};
    for (int i = 0; i < 6; i++) mmc_tensor_free(all[i]);
    mmc_st_close(st);
}

/* tables: float32 inv_freq, angles, cos/sin on both sides, computed the same way: they
 * agree to ~1 ulp even at position 32000 (a 1-ulp angle difference there would be ~2e-3) */
static void test_tables(void) {
    mmc_ctx *ctx = mmc_ctx_new();
    mmc_tensor *c, *s;
    mmc_st *st = fixture_open("rope/table_1d.safetensors");
    if (st) {
        mmc_tensor *pos = fixture_tensor(st, "pos", MMC_I64), *wc = fixture_tensor(st, "cos", MMC_F32),
                   *ws = fixture_tensor(st, "sin", MMC_F32);
        mmc_rope_table_1d(ctx, pos, 16, 1000000.0, &c, &s);
        CHECK_CLOSE(c, wc, 1e-6, 0, "table_1d cos");
        CHECK_CLOSE(s, ws, 1e-6, 0, "table_1d sin");
        /* small positions (row 0: 0..6) must match tightly */
        double m = 0;
        for (int i = 0; i < 7 * 16; i++)
            m = fmax(m, fabs(mmc_get_flat(c, i) - mmc_get_flat(wc, i)) + fabs(mmc_get_flat(s, i) - mmc_get_flat(ws, i)));
        CHECKF(m <= 1e-6, "table_1d small positions: max|diff| %.3g", m);
        /* 1-D positions [T] give [T, D] */
        mmc_tensor *p1 = mmc_new(ctx, MMC_I32, 1, MMC_SHAPE(7));
        for (int i = 0; i < 7; i++) ((int32_t *)p1->data)[i] = i;
        mmc_tensor *c1, *s1;
        mmc_rope_table_1d(ctx, p1, 16, 1000000.0, &c1, &s1);
        CHECK(c1->ndim == 2 && c1->shape[0] == 7 && c1->shape[1] == 16);
        CHECK(memcmp(c1->data, c->data, 7 * 16 * 4) == 0);
        mmc_tensor_free(pos); mmc_tensor_free(wc); mmc_tensor_free(ws);
        mmc_st_close(st);
    }
    st = fixture_open("rope/table_mrope.safetensors");
    if (st) {
        mmc_tensor *pos = fixture_tensor(st, "pos", MMC_I64), *wc = fixture_tensor(st, "cos", MMC_F32),
                   *ws = fixture_tensor(st, "sin", MMC_F32);
        static const int sec[3] = {4, 6, 6};
        mmc_rope_table_mrope(ctx, pos, sec, 32, 10000.0, &c, &s);
        CHECK_CLOSE(c, wc, 1e-6, 0, "table_mrope cos");   /* positions < 60 */
        CHECK_CLOSE(s, ws, 1e-6, 0, "table_mrope sin");
        mmc_tensor_free(pos); mmc_tensor_free(wc); mmc_tensor_free(ws);
        mmc_st_close(st);
    }
    st = fixture_open("rope/table_vision.safetensors");
    if (st) {
        mmc_tensor *wc = fixture_tensor(st, "cos", MMC_F32), *ws = fixture_tensor(st, "sin", MMC_F32);
        static const int64_t grid[6] = {1, 4, 6, 2, 2, 4};
        mmc_rope_table_vision2d(ctx, grid, 2, 2, 16, 10000.0, &c, &s);
        CHECK(c->shape[0] == 40 && c->shape[1] == 16);
        CHECK_CLOSE(c, wc, 1e-6, 0, "table_vision cos");
        CHECK_CLOSE(s, ws, 1e-6, 0, "table_vision sin");
        mmc_tensor_free(wc); mmc_tensor_free(ws);
        mmc_st_close(st);
    }
    mmc_ctx_free(ctx);
}

int main(void) {
    mmc_set_num_threads(2);
    test_gradcheck();
    test_strided();
    test_apply_fixture();
    test_tables();
    return test_done("test_ops_rope");
}
