/* test_cpuinfo.c — the GEMM blocking model (mmc_gemm_blocking_derive, cpuinfo.c) on a table of
 * machines, and the CPU probe on this one.
 *  - Zen 5 (L1d 48 KiB 12-way, L2 1 MiB 16-way, L3 32 MiB): the AVX-512 14×32 kernel must get
 *    exactly the blocking measured best there before the model existed (84, 1024, 2048).
 *  - Intel Emerald Rapids (L1d 48 KiB 12-way, L2 2 MiB 16-way, L3 260 MiB), a small AVX2
 *    laptop (L1d 32 KiB 8-way, L2 256 KiB 4-way, L3 8 MiB), each kernel tile: the blocks fit
 *    the caches the model puts them in (B micro-panel in L1 with a way free, or in 1/8 of L2;
 *    A block in a third of L2; B block in a quarter of L3), are multiples of the tile, and
 *    equal the values worked out by hand from the formulas in cpuinfo.c.
 *  - Missing cache levels fall back to defaults; a nonsensical tile is MMC_ERR_INVALID.
 *  - The probe: caches are read (sysfs or CPUID; where both exist they agree) and the flags
 *    agree with the compiler's __builtin_cpu_supports. */
#include "test_util.h"
#include "cpuinfo.h"

typedef struct {
    const char *name;
    mmc_cache_desc c;
    mmc_gemm_tile t;
    int64_t mc, kc, nc; /* expected */
} row;

#define KiB(x) ((int64_t)(x) << 10)
#define MiB(x) ((int64_t)(x) << 20)
static const mmc_cache_desc ZEN5 = {{KiB(48), 12, 64, 1}, {MiB(1), 16, 64, 1}, {MiB(32), 16, 64, 16}};
static const mmc_cache_desc EMR = {{KiB(48), 12, 64, 2}, {MiB(2), 16, 64, 2}, {MiB(260), 15, 64, 120}};
static const mmc_cache_desc LAPTOP = {{KiB(32), 8, 64, 2}, {KiB(256), 4, 64, 2}, {MiB(8), 16, 64, 8}};
/* the kernels' tiles (gemm.c): AVX-512 f32 and bf16-dot keep the B micro-panel in L2 */
static const mmc_gemm_tile T_AVX512 = {14, 32, 4, 2}, T_BF16DOT = {14, 32, 2, 2}, T_AVX2 = {6, 16, 4, 1},
                           T_GENERIC = {4, 16, 4, 1};

static void check_fits(const row *r, const mmc_gemm_blocking *b) {
    const mmc_gemm_tile *t = &r->t;
    const int64_t S = t->elem_bytes;
    CHECKF(b->mc > 0 && b->kc > 0 && b->nc > 0, "%s: non-positive block", r->name);
    CHECKF(b->mc % t->mr == 0 && b->nc % t->nr == 0, "%s: mc %lld / nc %lld not multiples of the tile", r->name,
           (long long)b->mc, (long long)b->nc);
    if (t->panel_level == 1) { /* A and B micro-panels in L1, one way left free */
        const mmc_cache_level *l1 = &r->c.l1d;
        int64_t way = l1->size / l1->ways;
        CHECKF((t->mr + t->nr) * b->kc * S <= (l1->ways - 1) * way, "%s: micro-panels (%lld B) overflow L1 less a way",
               r->name, (long long)((t->mr + t->nr) * b->kc * S));
    } else {
        CHECKF(b->kc * t->nr * S <= r->c.l2.size / 8, "%s: B micro-panel over 1/8 of L2", r->name);
    }
    CHECKF(b->mc * b->kc * S <= r->c.l2.size / 3, "%s: A block %lld B over a third of L2", r->name,
           (long long)(b->mc * b->kc * S));
    CHECKF(b->mc * b->kc * S + b->kc * t->nr * S <= r->c.l2.size, "%s: A block + B micro-panel overflow L2", r->name);
    CHECKF(b->kc * b->nc * S <= r->c.l3.size / 4, "%s: B block over a quarter of L3", r->name);
}

int main(void) {
    const row rows[] = {
        /* the measured Zen 5 optimum for the kernel that runs there */
        {"zen5 avx512", ZEN5, T_AVX512, 84, 1024, 2048},
        /* KC capped at 1024; the 2-byte panels hold twice the rows */
        {"zen5 bf16dot", ZEN5, T_BF16DOT, 168, 1024, 4096},
        /* BLIS's rule: floor(11 / (1 + 16/6)) = 3 ways of 4 KiB for A: kc = 12288 / 24 */
        {"zen5 avx2", ZEN5, T_AVX2, 168, 512, 4096},
        {"zen5 generic", ZEN5, T_GENERIC, 168, 512, 4096},
        /* L2 2 MiB: KC hits the cap, A block 2 MiB/3 = 170 rows of 4 KiB -> 168; NC capped */
        {"emr avx512", EMR, T_AVX512, 168, 1024, 4096},
        {"emr bf16dot", EMR, T_BF16DOT, 336, 1024, 4096},
        {"emr avx2", EMR, T_AVX2, 336, 512, 4096},
        /* floor(7 / (1 + 16/6)) = 1 way of 4 KiB: kc = 4096 / 24 = 170 -> 160 (multiple of 16) */
        {"laptop avx2", LAPTOP, T_AVX2, 132, 160, 3264},
        /* floor(7 / (1 + 16/4)) = 1 way: kc = 4096 / 16 = 256 */
        {"laptop generic", LAPTOP, T_GENERIC, 84, 256, 2048},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const row *r = &rows[i];
        mmc_gemm_blocking b;
        CHECK_OK(mmc_gemm_blocking_derive(&r->c, &r->t, &b));
        printf("test_cpuinfo: %-15s mc=%lld kc=%lld nc=%lld\n", r->name, (long long)b.mc, (long long)b.kc,
               (long long)b.nc);
        CHECKF(b.mc == r->mc && b.kc == r->kc && b.nc == r->nc, "%s: got %lld/%lld/%lld, want %lld/%lld/%lld", r->name,
               (long long)b.mc, (long long)b.kc, (long long)b.nc, (long long)r->mc, (long long)r->kc, (long long)r->nc);
        check_fits(r, &b);
    }

    /* nothing known about the caches: the defaults (32 KiB L1, 256 KiB L2, 2 MiB L3) still fit */
    mmc_cache_desc none = {{0}, {0}, {0}};
    mmc_gemm_blocking b;
    CHECK_OK(mmc_gemm_blocking_derive(&none, &T_AVX512, &b));
    CHECK(b.mc >= 14 && b.mc % 14 == 0 && b.kc >= 16 && b.nc >= 32 && b.nc % 32 == 0);
    CHECK(b.mc * b.kc * 4 <= KiB(256) && b.kc * b.nc * 4 <= MiB(2));
    /* unknown associativity (0) is treated as 8-way, never a division by zero */
    mmc_cache_desc noways = ZEN5;
    noways.l1d.ways = 0;
    CHECK_OK(mmc_gemm_blocking_derive(&noways, &T_AVX2, &b));
    CHECK(b.kc >= 16);

    mmc_gemm_tile bad = {0, 32, 4, 2};
    CHECK_ERR(mmc_gemm_blocking_derive(&ZEN5, &bad, &b), MMC_ERR_INVALID);
    bad = (mmc_gemm_tile){14, 32, 3, 2};
    CHECK_ERR(mmc_gemm_blocking_derive(&ZEN5, &bad, &b), MMC_ERR_INVALID);
    CHECK(strstr(mmc_last_error(), "element bytes=3") != NULL);
    bad = (mmc_gemm_tile){14, 32, 4, 3};
    CHECK_ERR(mmc_gemm_blocking_derive(&ZEN5, &bad, &b), MMC_ERR_INVALID);

    /* this machine */
    const mmc_cpu_info *ci = mmc_cpu_info_get();
    printf("test_cpuinfo: this CPU: %s %s family %d model %d; caches from %s: L1d %lld KiB %d-way, L2 %lld KiB, "
           "L3 %lld KiB\n", ci->vendor, ci->brand, ci->family, ci->model, ci->cache_source,
           (long long)(ci->cache.l1d.size >> 10), ci->cache.l1d.ways, (long long)(ci->cache.l2.size >> 10),
           (long long)(ci->cache.l3.size >> 10));
    CHECK(ci == mmc_cpu_info_get());
#if defined(__x86_64__)
    __builtin_cpu_init();
    CHECK(ci->vendor[0] != 0);
    CHECK(strcmp(ci->cache_source, "default") != 0 && ci->cache.l1d.size >= KiB(16));
    CHECK(ci->avx2 == (bool)__builtin_cpu_supports("avx2"));
    CHECK(ci->fma == (bool)__builtin_cpu_supports("fma"));
    CHECK(ci->avx512f == (bool)__builtin_cpu_supports("avx512f"));
    CHECK(ci->avx512_bf16 == (bool)__builtin_cpu_supports("avx512bf16"));
    /* the CPUID fallback reads what Linux's sysfs reports (the kernel gets it from the same
     * leaves): sizes and associativity agree */
    mmc_cache_desc cc;
    if (mmc_cpu_caches_cpuid(&cc)) {
        printf("test_cpuinfo: CPUID caches: L1d %lld KiB %d-way, L2 %lld KiB %d-way, L3 %lld KiB %d-way\n",
               (long long)(cc.l1d.size >> 10), cc.l1d.ways, (long long)(cc.l2.size >> 10), cc.l2.ways,
               (long long)(cc.l3.size >> 10), cc.l3.ways);
        CHECK(cc.l1d.size >= KiB(16) && cc.l1d.line >= 32);
        if (!strcmp(ci->cache_source, "sysfs")) {
            CHECK(cc.l1d.size == ci->cache.l1d.size && cc.l1d.ways == ci->cache.l1d.ways);
            CHECK(cc.l2.size == ci->cache.l2.size && cc.l2.ways == ci->cache.l2.ways);
            CHECK(cc.l3.size == ci->cache.l3.size);
        }
    } else {
        printf("test_cpuinfo: no CPUID cache leaves on this CPU\n");
    }
#endif
    return test_done("test_cpuinfo");
}
