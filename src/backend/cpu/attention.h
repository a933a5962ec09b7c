/* attention.h — CPU flash-attention kernels (f32): tiled forward with an online softmax
 * that saves the per-row logsumexp, and the matching backward that recomputes P per tile
 * (FlashAttention-2, Dao 2023). The op front end is src/ops/attention.c.
 *
 * Layouts: q [B, T, Hq, D], k [B, S, Hkv, D], v [B, S, Hkv, Dv] given by base pointers and
 * (b, t, h) strides in elements (the last dim must be contiguous); out [B, T, Hq, Dv] and
 * the gradients are contiguous; lse [B, Hq, T] (natural log of sum exp(scale * q·k); -inf
 * for a row that sees no key).
 *
 * Masks: every query row sees one contiguous interval of keys, so a mask is a list of
 * segments (query range, key range) — one segment [0, T) x [0, S) without cu_seqlens, one
 * per packed sequence with them — and, if causal, query t of a segment sees key s of it
 * when s <= t + (S_seg - T_seg) (bottom-right aligned).
 *
 * Both passes are deterministic for any thread count: every output element is produced by
 * exactly one work unit, in a fixed order.
 */
#ifndef MMC_CPU_ATTENTION_H
#define MMC_CPU_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int B, T, S, Hq, Hkv, D, Dv;
    const float *q, *k, *v;
    int64_t sq[3], sk[3], sv[3]; /* strides of dims (batch, time, head), in elements */
    float scale;
    bool causal;
    const int32_t *cu_seqlens; /* NULL or n_seqs + 1 offsets (B == 1, T == S) */
    int n_seqs;
} mmc_attn_args;

/* Scratch bytes the kernels need with nthreads threads (64-byte aligned buffer). */
size_t mmc_attn_fwd_scratch(const mmc_attn_args *a, int nthreads);
size_t mmc_attn_bwd_scratch(const mmc_attn_args *a, int nthreads, bool need_dk, bool need_dv);

/* out [B, T, Hq, Dv] (written), lse [B, Hq, T] (written; may be NULL). */
void mmc_attn_fwd_f32(const mmc_attn_args *a, float *out, float *lse, void *scratch);

/* Accumulates (+=) into dq [B, T, Hq, D], dk [B, S, Hkv, D], dv [B, S, Hkv, Dv]
 * (contiguous; each may be NULL when not wanted). out, dout [B, T, Hq, Dv] contiguous. */
void mmc_attn_bwd_f32(const mmc_attn_args *a, const float *out, const float *dout,
                      const float *lse, float *dq, float *dk, float *dv, void *scratch);

/* Query rows x keys per tile of the forward and of the backward pass for head dims D, Dv on
 * caches of l1d and l2 bytes per core (0 = unknown: a 32 KiB / 256 KiB core is assumed);
 * attention.c describes the model. A pure function, so tests can feed it other machines'
 * caches; the kernels call it with mmc_cpu_info_get()'s caches unless the environment sets
 * MMC_ATTN_TILES=fwd_br,fwd_bc,bwd_br,bwd_bc. */
typedef struct { int fwd_br, fwd_bc, bwd_br, bwd_bc; } mmc_attn_tiling;
mmc_attn_tiling mmc_attn_tiles(int D, int Dv, int64_t l1d, int64_t l2);

/* Tests and benchmarks: make every later call use tiling *t (each field >= 1), or the
 * derived / MMC_ATTN_TILES tiling again with NULL. Not thread-safe against running kernels:
 * call it between attention calls, and size scratch after it. */
void mmc_attn_force_tiles(const mmc_attn_tiling *t);

/* y[i] = 2^x[i] by the kernels' vectorised polynomial (error bound in attention.c), for x <= 0;
 * exported so tests can measure the bound. */
void mmc_attn_exp2_f32(const float *x, float *y, int64_t n);

#endif
