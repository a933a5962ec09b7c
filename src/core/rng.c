/* rng.c — Philox-4x32-10 counter-based random numbers (Salmon et al., 2011). Value k of
 * a stream is philox(key = seed, counter = offset + k/4), so any element can be computed
 * independently: fills are identical for every thread count and resumable by offset. */
#include "mmc.h"

#include <math.h>

void mmc_philox4x32(uint64_t key, uint64_t ctr_lo, uint64_t ctr_hi, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32), c2 = (uint32_t)ctr_hi,
             c3 = (uint32_t)(ctr_hi >> 32);
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1, n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

static inline void philox(uint64_t seed, uint64_t ctr, uint32_t out[4]) { mmc_philox4x32(seed, ctr, 0, out); }

void mmc_rng_init(mmc_rng *r, uint64_t seed) { r->seed = seed; r->offset = 0; }

static inline float u01(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

void mmc_rng_uniform(mmc_rng *r, float *out, int64_t n, float lo, float hi) {
    uint64_t base = r->offset;
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < (n + 3) / 4; b++) {
        uint32_t v[4];
        philox(r->seed, base + (uint64_t)b, v);
        for (int j = 0; j < 4 && 4 * b + j < n; j++) out[4 * b + j] = lo + (hi - lo) * u01(v[j]);
    }
    r->offset += (uint64_t)(n + 3) / 4;
}

void mmc_rng_normal(mmc_rng *r, float *out, int64_t n, float mean, float std) {
    uint64_t base = r->offset;
    /* Box-Muller: each counter yields 4 uniforms -> 4 normals */
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < (n + 3) / 4; b++) {
        uint32_t v[4];
        philox(r->seed, base + (uint64_t)b, v);
        float z[4];
        for (int j = 0; j < 4; j += 2) {
            float u1 = ((float)(v[j] >> 8) + 1.0f) * (1.0f / 16777217.0f);  /* (0, 1] */
            float u2 = u01(v[j + 1]);
            float rad = sqrtf(-2.0f * logf(u1));
            z[j] = rad * cosf(6.28318530718f * u2);
            z[j + 1] = rad * sinf(6.28318530718f * u2);
        }
        for (int j = 0; j < 4 && 4 * b + j < n; j++) out[4 * b + j] = mean + std * z[j];
    }
    r->offset += (uint64_t)(n + 3) / 4;
}

uint64_t mmc_rng_u64(mmc_rng *r) {
    uint32_t v[4];
    philox(r->seed, r->offset++, v);
    return ((uint64_t)v[0] << 32) | v[1];
}
