/* cpuinfo.h — what the CPU is (vendor, model, the ISA extensions mmc's kernels use, the
 * cache hierarchy) and the GEMM cache blocking derived from it.
 *
 * mmc_cpu_info_get() reads the caches from sysfs (/sys/devices/system/cpu/cpu0/cache/index*),
 * falling back to CPUID leaf 4 (Intel) / 0x8000001D (AMD), then to a generic guess.
 * mmc_gemm_blocking_derive() is a pure function (cache description + micro-kernel tile ->
 * MC/KC/NC) so tests can feed it other machines' caches; see cpuinfo.c for the model.
 */
#ifndef MMC_CPU_CPUINFO_H
#define MMC_CPU_CPUINFO_H

#include "mmc.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t size;     /* bytes; 0 = this level is absent or unknown */
    int ways;         /* associativity (0 = unknown, treated as fully associative) */
    int line;         /* coherency line size, bytes */
    int shared_cpus;  /* logical CPUs sharing this cache (1 = private) */
} mmc_cache_level;

typedef struct {
    mmc_cache_level l1d, l2, l3;
} mmc_cache_desc;

typedef struct {
    char vendor[16];       /* "AuthenticAMD", "GenuineIntel", ... ("" off x86) */
    char brand[64];        /* CPUID brand string, e.g. "AMD EPYC 9B45 ..." */
    int family, model, stepping;  /* display family/model (extended fields folded in) */
    /* ISA extensions mmc's kernels dispatch on (CPUID bits, AVX-512/AMX only with OS support) */
    bool avx2, fma, avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, amx_tile, amx_bf16;
    mmc_cache_desc cache;
    const char *cache_source; /* "sysfs", "cpuid" or "default" (nothing readable) */
} mmc_cpu_info;

/* The process's CPU description (probed once, then cached; thread-safe). */
const mmc_cpu_info *mmc_cpu_info_get(void);

/* The caches as CPUID describes them (leaf 0x8000001D on AMD, else leaf 4), bypassing sysfs;
 * false where CPUID has no cache leaves (then *out is untouched). For tests and diagnostics. */
bool mmc_cpu_caches_cpuid(mmc_cache_desc *out);

/* What the blocking model needs to know about a micro-kernel. */
typedef struct {
    int mr, nr;       /* register tile: MR rows of A × NR columns of B */
    int elem_bytes;   /* bytes per packed element (4: f32 panels, 2: bf16 panels) */
    int panel_level;  /* cache level the KC×NR B micro-panel is kept in: 1 (BLIS's rule) or 2 */
} mmc_gemm_tile;

typedef struct {
    int64_t mc, kc, nc; /* mc % mr == 0, nc % nr == 0 */
} mmc_gemm_blocking;

/* MC/KC/NC for `tile` on caches `c`. MMC_ERR_INVALID (with a message) for a nonsensical tile;
 * missing cache levels are replaced by conservative defaults, never an error. */
mmc_status mmc_gemm_blocking_derive(const mmc_cache_desc *c, const mmc_gemm_tile *tile,
                                    mmc_gemm_blocking *out);

#endif
