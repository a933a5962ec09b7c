/* dtype.c — dtype metadata and conversions between f32, bf16, f16, f64 and integers. */
#include "mmc.h"

#include <string.h>
#include <strings.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static const struct { const char *name; size_t size; } g_dt[MMC_DTYPE_COUNT] = {
    [MMC_F32] = {"F32", 4}, [MMC_BF16] = {"BF16", 2}, [MMC_F16] = {"F16", 2},
    [MMC_F64] = {"F64", 8}, [MMC_I32] = {"I32", 4},  [MMC_I64] = {"I64", 8},
    [MMC_U8] = {"U8", 1},   [MMC_I8] = {"I8", 1},    [MMC_BOOL] = {"BOOL", 1},
    [MMC_NF4] = {"NF4", 0},
};

size_t mmc_dtype_size(mmc_dtype dt) { return (unsigned)dt < MMC_DTYPE_COUNT ? g_dt[dt].size : 0; }
const char *mmc_dtype_name(mmc_dtype dt) {
    return (unsigned)dt < MMC_DTYPE_COUNT ? g_dt[dt].name : "?";
}

mmc_status mmc_dtype_parse(const char *s, mmc_dtype *out) {
    static const struct { const char *s; mmc_dtype dt; } alias[] = {
        {"float32", MMC_F32}, {"fp32", MMC_F32}, {"bfloat16", MMC_BF16}, {"bf16", MMC_BF16},
        {"float16", MMC_F16}, {"fp16", MMC_F16}, {"half", MMC_F16},     {"float64", MMC_F64},
        {"int32", MMC_I32},   {"int64", MMC_I64}, {"uint8", MMC_U8},     {"int8", MMC_I8},
        {"bool", MMC_BOOL},   {"nf4", MMC_NF4},
    };
    for (int i = 0; i < MMC_DTYPE_COUNT; i++)
        if (strcmp(s, g_dt[i].name) == 0) { *out = (mmc_dtype)i; return MMC_OK; }
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (strcasecmp(s, alias[i].s) == 0) { *out = alias[i].dt; return MMC_OK; }
    return mmc_error(MMC_ERR_UNSUPPORTED,
                     "unknown dtype '%s' (expected one of F32, BF16, F16, F64, I32, I64, U8, "
                     "I8, BOOL)", s);
}

float mmc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do { e++; man <<= 1; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    union { uint32_t u; float f; } v = {.u = u};
    return v.f;
}

uint16_t mmc_f32_to_f16(float f) {
#if defined(__F16C__)
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    union { float f; uint32_t u; } v = {.f = f};
    uint32_t sign = (v.u >> 16) & 0x8000, x = v.u & 0x7fffffff;
    if (x > 0x7f800000) return (uint16_t)(sign | 0x7e00);
    if (x >= 0x477ff000) return (uint16_t)(sign | 0x7c00);          /* overflow -> inf */
    if (x < 0x38800000) {                                           /* subnormal/zero */
        if (x < 0x33000000) return (uint16_t)sign;
        uint32_t e = x >> 23, m = (x & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e, r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((x >> 13) - (112 << 10)), rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
#endif
}

static double load_as_f64(const void *p, mmc_dtype dt, int64_t i) {
    switch (dt) {
    case MMC_F32: return ((const float *)p)[i];
    case MMC_BF16: return mmc_bf16_to_f32(((const uint16_t *)p)[i]);
    case MMC_F16: return mmc_f16_to_f32(((const uint16_t *)p)[i]);
    case MMC_F64: return ((const double *)p)[i];
    case MMC_I32: return ((const int32_t *)p)[i];
    case MMC_I64: return (double)((const int64_t *)p)[i];
    case MMC_U8: case MMC_BOOL: return ((const uint8_t *)p)[i];
    case MMC_I8: return ((const int8_t *)p)[i];
    default: MMC_CHECK(0, "load_as_f64: unsupported dtype %s", mmc_dtype_name(dt));
    }
    return 0;
}

static void store_f64(void *p, mmc_dtype dt, int64_t i, double v) {
    switch (dt) {
    case MMC_F32: ((float *)p)[i] = (float)v; break;
    case MMC_BF16: ((uint16_t *)p)[i] = mmc_f32_to_bf16((float)v); break;
    case MMC_F16: ((uint16_t *)p)[i] = mmc_f32_to_f16((float)v); break;
    case MMC_F64: ((double *)p)[i] = v; break;
    case MMC_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case MMC_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case MMC_U8: case MMC_BOOL: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case MMC_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    default: MMC_CHECK(0, "store_f64: unsupported dtype %s", mmc_dtype_name(dt));
    }
}

void mmc_convert(void *dst, mmc_dtype ddt, const void *src, mmc_dtype sdt, int64_t n) {
    if (ddt == sdt) { memcpy(dst, src, (size_t)n * mmc_dtype_size(ddt)); return; }
    if (ddt == MMC_F32 && sdt == MMC_BF16) {
        const uint16_t *s = src; float *d = dst;
        int64_t i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= n; i += 16) {
            __m256i h = _mm256_loadu_si256((const __m256i *)(s + i));
            __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
            _mm512_storeu_ps(d + i, _mm512_castsi512_ps(w));
        }
#endif
        for (; i < n; i++) d[i] = mmc_bf16_to_f32(s[i]);
        return;
    }
    if (ddt == MMC_BF16 && sdt == MMC_F32) {
        const float *s = src; uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = mmc_f32_to_bf16(s[i]);
        return;
    }
    if (ddt == MMC_F32 && sdt == MMC_F16) {
        const uint16_t *s = src; float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = mmc_f16_to_f32(s[i]);
        return;
    }
    if (ddt == MMC_I64 && sdt == MMC_I32) {
        const int32_t *s = src; int64_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
        return;
    }
    for (int64_t i = 0; i < n; i++) store_f64(dst, ddt, i, load_as_f64(src, sdt, i));
}

/* used by tensor.c */
double mmc_load_f64_(const void *p, mmc_dtype dt, int64_t i) { return load_as_f64(p, dt, i); }
void mmc_store_f64_(void *p, mmc_dtype dt, int64_t i, double v) { store_f64(p, dt, i, v); }
