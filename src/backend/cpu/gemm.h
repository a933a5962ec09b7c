/* gemm.h — dense matrix multiply on the CPU, BLAS-style, row-major.
 *
 *   C[M, N] = alpha * op(A)[M, K] · op(B)[K, N] + beta * C
 *
 * op(A) = A [M, K] (lda >= K) or, with trans_a, Aᵀ where A is stored [K, M] (lda >= M);
 * op(B) = B [K, N] (ldb >= N) or, with trans_b, Bᵀ where B is stored [N, K] (ldb >= K).
 * The three layouts training needs:
 *   forward  y  = x · Wᵀ   : gemm(0, 1, M=tokens, N=out, K=in,  x, W)
 *   backward dx = dy · W   : gemm(0, 0, M=tokens, N=in,  K=out, dy, W)
 *   backward dW += dyᵀ · x : gemm(1, 0, M=out,    N=in,  K=tokens, dy, x, beta=1)
 * beta == 0 means C is written without being read (it may hold garbage/NaN).
 *
 * mmc_gemm_f32 is the fast path (packed, blocked, AVX-512/AVX2 micro-kernels picked at run
 * time, OpenMP over both cores); mmc_gemm_bf16 takes B as bf16 (weights) and widens it
 * in registers. mmc_gemm_ref is the plain triple loop kept as the test oracle.
 */
#ifndef MMC_CPU_GEMM_H
#define MMC_CPU_GEMM_H

#include <stddef.h>

#include <stdint.h>
#include <stdbool.h>

void mmc_gemm_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                  float *C, int64_t ldc);
void mmc_gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                   float *C, int64_t ldc);
/* mmc_gemm_bf16 for inference (no gradient will flow): the same result, unless the opt-in
 * AVX512_BF16 kernel is switched on (MMC_GEMM_BF16=dot / mmc_gemm_set_bf16_dot), which rounds A
 * to bf16 too (packed path, M > 4): about twice as fast, errors ~1e-3 relative instead of ~1e-7. */
void mmc_gemm_bf16_infer(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                         float *C, int64_t ldc);
void mmc_gemm_ref(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                  float *C, int64_t ldc);
void mmc_gemm_ref_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const uint16_t *B, int64_t ldb, float beta,
                       float *C, int64_t ldc);
/* Use the AVX512_BF16 kernel (vdpbf16ps; A rounded to bf16, so results change — see gemm.c)
 * for packed mmc_gemm_bf16_infer calls (M > 4), as MMC_GEMM_BF16=dot does; returns -1 if this CPU
 * lacks AVX512_BF16. Not thread-safe against running GEMMs. */
int mmc_gemm_set_bf16_dot(bool on);
/* Pick the inference bf16 kernel by name: "amx_bf16" (AMX tiles), "avx512_bf16" (vdpbf16ps) or
 * "f32" (exact: weights widened); returns -1 if this CPU cannot run it. MMC_GEMM_BF16=dot and
 * mmc_gemm_set_bf16_dot(true) take amx_bf16 where the CPU has AMX, else avx512_bf16. */
int mmc_gemm_set_bf16_kernel(const char *name);
/* The precision of f32 x f32 GEMMs (packed path, M > 4; training and inference), as PyTorch's
 * torch.set_float32_matmul_precision: "highest" (f32 products, the default), "high" (bf16x3 on AMX:
 * each operand split into bf16 hi + lo, three bf16 products summed in f32; ~1e-6 of sum |a||b|
 * measured, 3 2^-16 at worst, see gemm.c) or "medium" (one bf16 product on AMX, operands rounded;
 * also switches bf16-weight inference GEMMs to bf16 products, as --bf16-matmul). The environment's
 * MMC_MATMUL_PRECISION sets it at start-up. Returns 0, 1 when the name is taken but this CPU (or
 * the OS) offers no AMX (f32 GEMMs stay f32), -1 for an unknown name (nothing changes). Not
 * thread-safe against running GEMMs; weights pre-packed earlier keep the kernel they were packed for. */
int mmc_gemm_set_matmul_precision(const char *name);
const char *mmc_gemm_matmul_precision(void);   /* "highest", "high" or "medium" */

/* Pre-packed weights (inference): W [N, K] (row stride ldw, f32 or bf16) packed once into the
 * panels the packed path's micro-kernel reads for x·Wᵀ — the kernel and blocking of this process
 * (f32 panels for the f32 kernels; for bf16 with infer, bf16 pair panels when --bf16-matmul /
 * MMC_GEMM_BF16=dot selected a bf16-product kernel (AMX tiles or vdpbf16ps) at packing time, else
 * f32 panels widened from bf16, twice the bytes). mmc_gemm_xwt_packed then computes
 *   C[M, N] = alpha * A[M, K] · Wᵀ + beta * C
 * without packing B: the same panels in the same order as mmc_gemm_f32 / mmc_gemm_bf16_infer(false,
 * true, ...) with M > 4, so the same bits; M <= 4 runs the packed path too (not the unpacked
 * matvec: the original weight may be freed), whose sums differ from the matvec's by rounding.
 * The packed weight keeps the kernel it was packed for. NULL with mmc_last_error on bad sizes /
 * OOM. Size: N rounded up to the register tile's NR (and, for AMX, K to whole 32-k steps). */
typedef struct mmc_gemm_packed_b mmc_gemm_packed_b;
mmc_gemm_packed_b *mmc_gemm_pack_b(const void *W, bool w_bf16, int64_t N, int64_t K, int64_t ldw, bool infer);
void mmc_gemm_packed_b_free(mmc_gemm_packed_b *pb);
size_t mmc_gemm_packed_b_bytes(const mmc_gemm_packed_b *pb);
const char *mmc_gemm_packed_b_kernel(const mmc_gemm_packed_b *pb);
int64_t mmc_gemm_packed_b_rows(const mmc_gemm_packed_b *pb);   /* N */
int64_t mmc_gemm_packed_b_cols(const mmc_gemm_packed_b *pb);   /* K */
void mmc_gemm_xwt_packed(int64_t M, float alpha, const float *A, int64_t lda, const mmc_gemm_packed_b *W,
                         float beta, float *C, int64_t ldc);

/* What a GEMM runs on this machine (for `mmc info --system` and benchmark reports). */
typedef struct {
    const char *kernel;    /* micro-kernel name */
    int mr, nr;            /* register tile */
    int64_t mc, kc, nc;    /* cache blocking */
} mmc_gemm_path;
typedef struct {
    mmc_gemm_path f32, bf16;     /* packed path per B dtype (bf16: training, backward) */
    mmc_gemm_path bf16_infer;    /* mmc_gemm_bf16_infer's packed path */
    bool bf16_dot;               /* bf16_infer runs a bf16-product kernel: vdpbf16ps or AMX
                                  * (else = bf16) */
    bool bf16_dot_available;     /* the CPU has AVX512_BF16 */
    bool amx_available;          /* ... and AMX-BF16 tiles the OS lets this process use */
    int f32_b_prefetch;          /* the AVX-512 kernel prefetches B this many k steps ahead
                                  * (0: not; Intel CPUs, MMC_GEMM_UKR=plain|bpf) */
    int small_m;                 /* M <= small_m runs the unpacked matvec path */
    const char *small_m_kernel;  /* "avx512" or "generic" */
    const char *blocking_source; /* "model" (from the caches) or the env variable that set it */
    const char *split;           /* how threads share a packed GEMM: "auto", "slices" or "shared"
                                  * (MMC_GEMM_SPLIT; see gemm.c's gemm_packed) */
    const char *matmul_precision; /* "highest", "high" or "medium" (MMC_MATMUL_PRECISION) */
    mmc_gemm_path f32_matmul;    /* the packed path f32 x f32 GEMMs run under it: = f32, or
                                  * amx_bf16x3 (high) / amx_bf16x1 (medium) */
} mmc_gemm_info;
void mmc_gemm_describe(mmc_gemm_info *out);

/* Name of the micro-kernel chosen for this CPU ("avx512", "avx2", "generic"). */
const char *mmc_gemm_kernel_name(void);
/* bench_gemm's micro-kernel probe: the f32 kernel's register tile, and `calls` calls of it in the
 * GEMM's order on A tiles Ap [na][kc][mr] against B panels Bp [nb][kc][nr] (64-byte aligned),
 * accumulating into C [mr][nr] (alpha = beta = 1) */
void mmc_gemm_ukr_tile(int *mr, int *nr);
void mmc_gemm_ukr_loop(int64_t kc, const float *Ap, int64_t na, const float *Bp, int64_t nb, float *C, int64_t calls);
/* Force the micro-kernel ("avx512", "avx2", "generic") for tests/benchmarks; returns -1 if
 * this CPU cannot run it (the choice is unchanged then). Not thread-safe against running GEMMs. */
int mmc_gemm_set_kernel(const char *name);

#endif
