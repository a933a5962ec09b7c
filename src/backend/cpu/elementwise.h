/* elementwise.h — CPU kernels for the elementwise, activation, softmax, reduction and
 * strided-copy ops (src/ops/elementwise.c, view.c, shape.c). All buffers are f32 and
 * contiguous unless a stride array says otherwise. Functions named *_acc ACCUMULATE (+=)
 * into their first argument (backward rules); the others overwrite. Every kernel is
 * deterministic for any thread count. */
#ifndef MMC_CPU_ELEMENTWISE_H
#define MMC_CPU_ELEMENTWISE_H
#include <stddef.h>
#include <stdint.h>

/* ---- binary, same shape: y = a op b */
void ew_add_f32(float *y, const float *a, const float *b, int64_t n);
void ew_mul_f32(float *y, const float *a, const float *b, int64_t n);
void ew_scale_f32(float *y, const float *x, float s, int64_t n);
/* dst += s * src */
void ew_axpy_acc_f32(float *dst, const float *src, float s, int64_t n);
/* dst += a * b */
void ew_mul_acc_f32(float *dst, const float *a, const float *b, int64_t n);

/* ---- bias-like broadcast: a [R, C], b [C] (b_is_scalar: b [1] broadcast to all) */
void ew_add_bias_f32(float *y, const float *a, const float *b, int64_t R, int64_t C);
void ew_mul_bias_f32(float *y, const float *a, const float *b, int64_t R, int64_t C);
/* ga [R, C] += g [R, C] * b [C] */
void ew_mul_bias_acc_f32(float *ga, const float *g, const float *b, int64_t R, int64_t C);
/* gb [C] += sum_r g[r, c] (* a[r, c] when a != NULL), summed in double */
void ew_colsum_acc_f32(float *gb, const float *g, const float *a, int64_t R, int64_t C);
/* backward of y = f + bias: gf [R, C] += g (gf may be NULL), gb [C] += sum_r g[r, c] in
 * double — one pass over g */
void ew_add_bias_bwd_acc_f32(float *gf, float *gb, const float *g, int64_t R, int64_t C);

/* ---- activations (n elements); *_bwd: gx += g * f'(x) */
void ew_gelu_f32(float *y, const float *x, int64_t n);
void ew_gelu_bwd_acc_f32(float *gx, const float *x, const float *g, int64_t n);
void ew_gelu_tanh_f32(float *y, const float *x, int64_t n);
void ew_gelu_tanh_bwd_acc_f32(float *gx, const float *x, const float *g, int64_t n);
/* x * sigmoid(k x): silu k = 1, quick_gelu k = 1.702 */
void ew_xsigmoid_f32(float *y, const float *x, float k, int64_t n);
/* the same on the calling thread alone (inside a parallel region); the same values element by element */
void ew_xsigmoid_f32_serial(float *y, const float *x, float k, int64_t n);
void ew_xsigmoid_bwd_acc_f32(float *gx, const float *x, const float *g, float k, int64_t n);
/* y = silu(gate) * up; ggate/gup may be NULL */
void ew_swiglu_f32(float *y, const float *gate, const float *up, int64_t n);
void ew_swiglu_bwd_acc_f32(float *ggate, float *gup, const float *gate, const float *up,
                           const float *g, int64_t n);

/* ---- softmax over rows: x, y [R, C]; gx += y * (g - sum(g * y)) */
void ew_softmax_f32(float *y, const float *x, int64_t R, int64_t C);
void ew_softmax_bwd_acc_f32(float *gx, const float *y, const float *g, int64_t R, int64_t C);

/* ---- reduction: sum of x in double, in fixed blocks reduced in order (deterministic) */
double ew_sum_f64(const float *x, int64_t n);
/* dst[i] += s for all i */
void ew_add_scalar_acc_f32(float *dst, float s, int64_t n);

/* ---- strided layout: iterate a logical shape [ndim], element strides given */
/* dst (strided, element size esz) = src (strided) */
void ew_strided_copy(void *dst, const int64_t *dst_stride, const void *src,
                     const int64_t *src_stride, const int64_t *shape, int ndim, size_t esz);
/* dst (strided f32) += src (contiguous f32) */
void ew_strided_add_acc_f32(float *dst, const int64_t *dst_stride, const float *src,
                            const int64_t *shape, int ndim);

/* scalar reference functions (also used by tests) */
float ew_erf_ref(float x);
#endif
