/* cpuinfo.c — the CPU mmc runs on (CPUID: vendor, model, ISA extensions; caches from sysfs or
 * CPUID leaf 4 / 0x8000001D) and the GEMM cache blocking derived from the caches.
 *
 * Blocking model (after Low, Igual, Smith, Quintana-Orti 2016, "Analytical Modeling Is Enough
 * for High-Performance BLIS"; our own formulation, no BLIS code). In gemm.c's loop nest a KC×NR
 * micro-panel of packed B is reused by every MR×KC micro-panel of the MC×KC packed A block,
 * the A block by every micro-panel of the KC×NC packed B block.
 *   KC, panel level 1 (BLIS's rule): the B micro-panel stays in L1 while A micro-panels
 *     stream through it. With W ways, N sets and L-byte lines, A's micro-panel gets
 *     C_A = floor((W - 1) / (1 + NR/MR)) ways (one way is left for the streamed C tile and
 *     whatever else passes through), B's the ways in proportion, and KC fills A's ways:
 *     KC = C_A · N · L / (MR · S). For 8-way 32 KiB L1 and a 6×8 f64 tile this is 256,
 *     BLIS's Haswell value.
 *   KC, panel level 2: the B micro-panel is kept in L2 and streamed into the registers from
 *     there. This is right for the AVX-512 14×32 kernel: each k step loads 184 bytes for 28
 *     FMAs (14 cycles on two FMA pipes), ~13 B/cycle, well within any L2's bandwidth, so L1
 *     residency buys nothing, while a long KC (1) covers common hidden sizes (896, 1024) in
 *     one K pass, so C is written once instead of read back per K block, and (2) amortizes
 *     the C tile's loads and stores over more FMAs (measured on Zen 5, 1 thread, alternating
 *     processes: BLIS's L1 rule, KC=208 with MC=420, runs x·Wᵀ at 205 GFLOP/s against 225 for
 *     this rule's KC=1024, MC=84; dy·W ties). The micro-panel gets 1/8 of L2 (two of
 *     16 ways): KC = (L2 / 8) / (NR · S), capped at KC_MAX = 1024. The cap is where the gain
 *     ends (measured on Zen 5: KC=1024 beats 512 by 1-3 %, the C traffic of a K block is then
 *     ~2 % of the operand traffic), and since KC fixes the f32 summation order, the cap also
 *     makes results the same on every machine with an L2 of 1 MiB or more.
 *   MC: the MC×KC A block takes a third of L2: the other two thirds hold the B micro-panel it
 *     is multiplied by, the C tiles, and the lines of the next B block's source that gemm.c
 *     prefetches into L2 while this block computes. MC = (L2 / 3) / (KC · S), rounded down to
 *     a multiple of MR.
 *   NC: the KC×NC B block takes a quarter of L3 (shared by the team of threads; the rest is
 *     for their A blocks on their way to L2, C, and other processes on a shared machine):
 *     NC = (L3 / 4) / (KC · S), rounded down to a multiple of NR and capped at NC_MAX = 4096
 *     (beyond, A is re-packed rarely enough not to matter; measured on Zen 5, 4096 columns run
 *     as fast as 2048, and the packed B buffer is KC·NC elements per calling thread).
 * On Zen 5 (L1d 48 KiB 12-way, L2 1 MiB 16-way, L3 32 MiB) the AVX-512 kernel gets MC=84,
 * KC=1024, NC=2048: the values measured best on that machine before this model existed.
 */
#include "cpuinfo.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define MMC_X86 1
#endif

#define KC_MAX 1024
#define NC_MAX 4096

/* ------------------------------------------------------------------ the blocking model */

/* A level, or `def` when the level is absent (size 0) or its fields are unusable. */
static mmc_cache_level level_or(const mmc_cache_level *l, mmc_cache_level def) {
    if (!l || l->size <= 0) return def;
    mmc_cache_level r = *l;
    if (r.line <= 0) r.line = 64;
    if (r.ways <= 0 || (int64_t)r.ways * r.line > r.size) r.ways = 8; /* unknown / fully assoc. */
    return r;
}

mmc_status mmc_gemm_blocking_derive(const mmc_cache_desc *c, const mmc_gemm_tile *t,
                                    mmc_gemm_blocking *out) {
    if (!c || !t || !out) return mmc_error(MMC_ERR_INVALID, "gemm blocking: NULL argument");
    if (t->mr < 1 || t->mr > 64 || t->nr < 1 || t->nr > 256 ||
        (t->elem_bytes != 2 && t->elem_bytes != 4) || (t->panel_level != 1 && t->panel_level != 2))
        return mmc_error(MMC_ERR_INVALID,
                         "gemm blocking: bad micro-kernel tile MR=%d NR=%d element bytes=%d panel level=%d "
                         "(want 1..64, 1..256, 2 or 4, 1 or 2)",
                         t->mr, t->nr, t->elem_bytes, t->panel_level);
    /* missing levels: a small 2010s core (32 KiB 8-way L1d, 256 KiB L2), L3 = 8 × L2 */
    const mmc_cache_level l1 = level_or(&c->l1d, (mmc_cache_level){32 << 10, 8, 64, 1});
    const mmc_cache_level l2 = level_or(&c->l2, (mmc_cache_level){256 << 10, 8, 64, 1});
    const mmc_cache_level l3 = level_or(&c->l3, (mmc_cache_level){8 * l2.size, 16, 64, 1});
    const int64_t mr = t->mr, nr = t->nr, S = t->elem_bytes;

    int64_t kc;
    if (t->panel_level == 1) {
        const int64_t sets = l1.size / ((int64_t)l1.ways * l1.line);
        int64_t ways_a = (int64_t)(l1.ways - 1) * mr / (mr + nr); /* floor((W-1) / (1 + NR/MR)) */
        if (ways_a < 1) ways_a = 1;
        kc = ways_a * sets * l1.line / (mr * S);
    } else {
        kc = l2.size / 8 / (nr * S);
        if (kc > KC_MAX) kc = KC_MAX;
    }
    kc = kc / 16 * 16; /* the packing routines transpose 16 k at a time */
    if (kc < 16) kc = 16;

    int64_t mc = l2.size / 3 / (kc * S) / mr * mr;
    if (mc < mr) mc = mr;

    int64_t nc = l3.size / 4 / (kc * S);
    if (nc > NC_MAX) nc = NC_MAX;
    nc = nc / nr * nr;
    if (nc < nr) nc = nr;

    *out = (mmc_gemm_blocking){mc, kc, nc};
    return MMC_OK;
}

/* ------------------------------------------------------------------ caches: sysfs */

/* First line of a small sysfs file into buf; false if unreadable. */
static bool read_line(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

/* "48K", "1024K", "32M" -> bytes */
static int64_t parse_size(const char *s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || v <= 0) return 0;
    while (*end == ' ') end++;
    switch (toupper((unsigned char)*end)) {
    case 'K': return (int64_t)v << 10;
    case 'M': return (int64_t)v << 20;
    case 'G': return (int64_t)v << 30;
    default: return (int64_t)v;
    }
}

/* "0-1", "0,2,4-7" -> number of CPUs listed */
static int count_cpu_list(const char *s) {
    int n = 0;
    while (*s) {
        char *end;
        long a = strtol(s, &end, 10);
        if (end == s) break;
        long b = a;
        if (*end == '-') {
            const char *p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p) break;
        }
        if (b >= a) n += (int)(b - a + 1);
        s = end;
        if (*s == ',') s++;
    }
    return n;
}

static bool caches_from_sysfs(mmc_cache_desc *c) {
    bool any = false;
    for (int i = 0; i < 16; i++) {
        char path[128], level[16], type[32], size[32], ways[16], line[16], shared[256];
        const char *base = "/sys/devices/system/cpu/cpu0/cache/index";
        snprintf(path, sizeof path, "%s%d/level", base, i);
        if (!read_line(path, level, sizeof level)) continue;
        snprintf(path, sizeof path, "%s%d/type", base, i);
        if (!read_line(path, type, sizeof type)) continue;
        snprintf(path, sizeof path, "%s%d/size", base, i);
        if (!read_line(path, size, sizeof size)) continue;
        mmc_cache_level l = {parse_size(size), 0, 64, 1};
        snprintf(path, sizeof path, "%s%d/ways_of_associativity", base, i);
        if (read_line(path, ways, sizeof ways)) l.ways = atoi(ways);
        snprintf(path, sizeof path, "%s%d/coherency_line_size", base, i);
        if (read_line(path, line, sizeof line) && atoi(line) > 0) l.line = atoi(line);
        snprintf(path, sizeof path, "%s%d/shared_cpu_list", base, i);
        if (read_line(path, shared, sizeof shared) && count_cpu_list(shared) > 0) l.shared_cpus = count_cpu_list(shared);
        if (l.size <= 0) continue;
        const int lv = atoi(level);
        const bool data = strcmp(type, "Data") == 0 || strcmp(type, "Unified") == 0;
        if (!data) continue;
        if (lv == 1) c->l1d = l;
        else if (lv == 2) c->l2 = l;
        else if (lv == 3) c->l3 = l;
        else continue;
        any = true;
    }
    return any && c->l1d.size > 0;
}

/* ------------------------------------------------------------------ CPUID */

#ifdef MMC_X86
/* Deterministic cache parameters (Intel leaf 4, AMD leaf 0x8000001D share the layout). */
static bool caches_from_cpuid(unsigned leaf, mmc_cache_desc *c) {
    bool any = false;
    for (unsigned i = 0; i < 16; i++) {
        unsigned a, b, cx, d;
        if (!__get_cpuid_count(leaf, i, &a, &b, &cx, &d)) return false;
        const unsigned type = a & 31, lv = (a >> 5) & 7;
        if (type == 0) break;
        if (type == 2) continue; /* instruction cache */
        mmc_cache_level l;
        l.line = (int)(b & 0xfff) + 1;
        const int parts = (int)((b >> 12) & 0x3ff) + 1;
        l.ways = (a >> 9) & 1 ? 0 : (int)(b >> 22) + 1; /* bit 9: fully associative */
        const int64_t sets = (int64_t)cx + 1;
        l.size = (int64_t)((b >> 22) + 1) * parts * l.line * sets;
        l.shared_cpus = (int)((a >> 14) & 0xfff) + 1;
        if (lv == 1) c->l1d = l;
        else if (lv == 2) c->l2 = l;
        else if (lv == 3) c->l3 = l;
        else continue;
        any = true;
    }
    return any && c->l1d.size > 0;
}

static unsigned long long xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void probe_cpuid(mmc_cpu_info *ci) {
    unsigned a = 0, b = 0, c = 0, d = 0, max_leaf = 0, max_ext;
    if (!__get_cpuid(0, &max_leaf, &b, &c, &d)) return;
    memcpy(ci->vendor, &b, 4);
    memcpy(ci->vendor + 4, &d, 4);
    memcpy(ci->vendor + 8, &c, 4);
    ci->vendor[12] = 0;
    __get_cpuid(1, &a, &b, &c, &d);
    const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
    ci->family = (int)base_family + (base_family == 0xf ? (int)((a >> 20) & 0xff) : 0);
    ci->model = (int)base_model + (base_family == 0x6 || base_family == 0xf ? (int)((a >> 16) & 0xf) << 4 : 0);
    ci->stepping = (int)(a & 0xf);
    const bool fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
    /* the OS must save the registers: XCR0 bits 1-2 (SSE, AVX), 5-7 (AVX-512), 17-18 (AMX) */
    const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    const bool os_avx = (xcr0 & 0x6) == 0x6, os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0,
               os_amx = (xcr0 & 0x60000) == 0x60000;
    ci->fma = fma && avx && os_avx;
    if (max_leaf >= 7) {
        __get_cpuid_count(7, 0, &a, &b, &c, &d);
        ci->avx2 = os_avx && ((b >> 5) & 1);
        ci->avx512f = os_avx512 && ((b >> 16) & 1);
        ci->avx512dq = ci->avx512f && ((b >> 17) & 1);
        ci->avx512bw = ci->avx512f && ((b >> 30) & 1);
        ci->avx512vl = ci->avx512f && ((b >> 31) & 1);
        ci->amx_bf16 = os_amx && ((d >> 22) & 1);
        ci->amx_tile = os_amx && ((d >> 24) & 1);
        unsigned eax1 = 0;
        if (a >= 1) __get_cpuid_count(7, 1, &eax1, &b, &c, &d);
        ci->avx512_bf16 = ci->avx512f && ((eax1 >> 5) & 1);
    }
    max_ext = __get_cpuid_max(0x80000000u, NULL);
    if (max_ext >= 0x80000004u) {
        unsigned r[12];
        for (unsigned i = 0; i < 3; i++) __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char s[49];
        memcpy(s, r, 48);
        s[48] = 0;
        const char *p = s;
        while (*p == ' ') p++;
        snprintf(ci->brand, sizeof ci->brand, "%s", p);
        for (size_t n = strlen(ci->brand); n > 0 && ci->brand[n - 1] == ' '; n--) ci->brand[n - 1] = 0;
    }
    if (!ci->cache_source && mmc_cpu_caches_cpuid(&ci->cache)) ci->cache_source = "cpuid";
}
#endif

bool mmc_cpu_caches_cpuid(mmc_cache_desc *out) {
#ifdef MMC_X86
    unsigned a, b, c, d;
    const unsigned max_leaf = __get_cpuid_max(0, NULL), max_ext = __get_cpuid_max(0x80000000u, NULL);
    mmc_cache_desc cd = {0};
    bool amd_topoext = false;
    if (max_ext >= 0x8000001du && __get_cpuid(0x80000001u, &a, &b, &c, &d)) amd_topoext = (c >> 22) & 1;
    if ((amd_topoext && caches_from_cpuid(0x8000001du, &cd)) || (max_leaf >= 4 && caches_from_cpuid(4, &cd))) {
        *out = cd;
        return true;
    }
#else
    (void)out;
#endif
    return false;
}

static mmc_cpu_info g_info;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void probe(void) {
    mmc_cpu_info *ci = &g_info;
    mmc_cache_desc cd = {0};
    if (caches_from_sysfs(&cd)) {
        ci->cache = cd;
        ci->cache_source = "sysfs";
    }
#ifdef MMC_X86
    probe_cpuid(ci);
#endif
    if (!ci->cache_source) ci->cache_source = "default"; /* the model's defaults fill in */
}

const mmc_cpu_info *mmc_cpu_info_get(void) {
    pthread_once(&g_once, probe);
    return &g_info;
}
