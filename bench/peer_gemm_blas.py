"""peer_gemm_blas.py — the best BLAS of this machine as a second peer of bench/bench_gemm.c's f32 GEMMs.

The BLAS is OpenBLAS as numpy ships it (the scipy-openblas64 wheel's library in numpy.libs, a
DYNAMIC_ARCH build), called through ctypes (cblas_sgemm, row-major, the same transposes, leading
dimensions and beta as bench_gemm.c: no copies, no Python in the timed call). OpenBLAS picks its
kernels ("core") from CPUID at load time; on CPUs it does not know it falls back to an older core
(e.g. "Haswell", AVX2, on Zen 5), so the core is checked (scipy_openblas_get_corename64_), not
assumed, and each case is also timed with the AVX-512 cores forced where the CPU has AVX-512
(OPENBLAS_CORETYPE=SkylakeX / Cooperlake, in a child process: the core is fixed at load). The
fastest core per case is reported; its "peer_note" names the library, version and core, and which
core OpenBLAS chose by itself.

Cases (names = bench_gemm.c's figure + "_openblas": bench_gemm.c repeats its own figure under the
same name, so merge.py puts mmc and OpenBLAS on one row):
  gemm_f32_{xWt,dyW,dyTx,sq1024}_openblas      all threads (MMC_BENCH_THREADS), wall clock
  gemm_f32_{xWt,dyW,dyTx,sq1024}_1t_openblas   one thread, its CPU-time clock
Every figure is the best call of a ~1 s run, as in bench_gemm.c.
Usage: peer_gemm_blas.py             (runs the children, prints JSON lines)
       peer_gemm_blas.py --child     (one core as set in the environment; prints one JSON object)
       peer_gemm_blas.py --describe  (library, version, self-selected core: results.json "peers")"""
import ctypes
import glob
import json
import os
import subprocess
import sys
import time

CASES = [  # name, trans_a, trans_b, M, N, K, beta (bench_gemm.c's cases)
    ("xWt", False, True, 512, 4864, 896, 0.0),
    ("dyW", False, False, 512, 896, 4864, 0.0),
    ("dyTx", True, False, 4864, 896, 512, 1.0),
    ("sq1024", False, False, 1024, 1024, 1024, 0.0),
]


def load_openblas():
    """numpy's bundled OpenBLAS: (ctypes library, symbol suffix, path)."""
    import numpy
    root = os.path.dirname(os.path.dirname(numpy.__file__))
    for path in sorted(glob.glob(os.path.join(root, "numpy.libs", "libscipy_openblas*.so*"))) + \
            sorted(glob.glob(os.path.join(root, "scipy_openblas*", "lib", "libscipy_openblas*.so*"))):
        lib = ctypes.CDLL(path)
        for sfx in ("64_", ""):
            if hasattr(lib, "scipy_cblas_sgemm" + sfx):
                return lib, sfx, path
    raise RuntimeError("no OpenBLAS found in numpy.libs (numpy without a bundled OpenBLAS?)")


def child():
    import numpy as np
    lib, sfx, path = load_openblas()
    get = lambda n: getattr(lib, "scipy_openblas_" + n + sfx)  # noqa: E731
    get("get_corename").restype = ctypes.c_char_p
    get("get_config").restype = ctypes.c_char_p
    core = get("get_corename")().decode()
    config = get("get_config")().decode()
    ilp = ctypes.c_int64 if "USE64BITINT" in config else ctypes.c_int
    sgemm = getattr(lib, "scipy_cblas_sgemm" + sfx)
    sgemm.restype = None
    sgemm.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ilp, ilp, ilp, ctypes.c_float,
                      ctypes.c_void_p, ilp, ctypes.c_void_p, ilp, ctypes.c_float, ctypes.c_void_p, ilp]
    set_threads = get("set_num_threads")
    set_threads.argtypes = [ctypes.c_int]
    out = {"core": core, "config": config, "library": os.path.basename(path), "cases": {}}
    rng = np.random.default_rng(0)
    threads = int(os.environ.get("MMC_BENCH_THREADS", "2"))
    for sfx_case, nth, clock in (("", threads, time.perf_counter), ("_1t", 1, time.thread_time)):
        set_threads(nth)
        for name, ta, tb, M, N, K, beta in CASES:
            A = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
            B = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
            C = rng.standard_normal((M, N), dtype=np.float32)
            lda, ldb = (M if ta else K), (K if tb else N)
            args = (101, 112 if ta else 111, 112 if tb else 111, M, N, K, 1.0,
                    A.ctypes.data, lda, B.ctypes.data, ldb, beta, C.ctypes.data, N)
            sgemm(*args)
            best, start, n = 1e30, time.perf_counter(), 0
            while n < 5 or time.perf_counter() - start < 1.0:
                t0 = clock()
                sgemm(*args)
                best = min(best, clock() - t0)
                n += 1
            out["cases"][f"gemm_f32_{name}{sfx_case}_openblas"] = 2.0 * M * N * K / best * 1e-9
    print(json.dumps(out))


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def main():
    flags = cpu_flags()
    forced = []
    if "avx512f" in flags:
        forced.append("SkylakeX")
        if "avx512_bf16" in flags:
            forced.append("Cooperlake")
    runs = []
    # the library as it configures itself: OPENBLAS_* settings inherited from the shell (e.g. a
    # CORETYPE or L2_SIZE set for some other program) are dropped, noted in peer_note
    inherited = sorted(k + "=" + v for k, v in os.environ.items() if k.startswith("OPENBLAS_"))
    for coretype in [None] + forced:
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
        if coretype:
            env["OPENBLAS_CORETYPE"] = coretype
        env["OPENBLAS_NUM_THREADS"] = env.get("MMC_BENCH_THREADS", "2")
        r = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"peer_gemm_blas: OpenBLAS core {coretype or 'auto'} failed: {r.stderr.strip()[-500:]}",
                  file=sys.stderr)
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        if any(r["core"] == res["core"] for r in runs):  # e.g. Cooperlake runs SkylakeX's sgemm
            continue
        if coretype and res["core"].lower() != coretype.lower():  # the CPU could not run it
            print(f"peer_gemm_blas: OPENBLAS_CORETYPE={coretype} gave core {res['core']}; not used",
                  file=sys.stderr)
            continue
        res["forced"] = coretype is not None
        runs.append(res)
    if not runs:
        sys.exit(1)
    auto = next((r["core"] for r in runs if not r["forced"]), "?")
    version = runs[0]["config"].split()[1] if len(runs[0]["config"].split()) > 1 else "?"
    for name in runs[0]["cases"]:
        best = max(runs, key=lambda r: r["cases"].get(name, 0))
        how = "forced by OPENBLAS_CORETYPE" if best["forced"] else "its own choice"
        note = (f"OpenBLAS {version} ({best['library']}, numpy's), core {best['core']} ({how}; "
                f"auto-selected: {auto}); cores timed: " +
                ", ".join(f"{r['core']} {r['cases'].get(name, 0):.1f}" for r in runs) +
                (f"; not inherited: {' '.join(inherited)}" if inherited else ""))
        print(json.dumps({"name": name, "peer": best["cases"][name], "unit": "GFLOP/s", "better": "higher",
                          "peer_note": note}), flush=True)


def describe():
    """The OpenBLAS peer for results.json's "peers" (bench/torch_config.py): library, version,
    the core it selects by itself (clean environment, no timing)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    code = ("import ctypes, json, sys; sys.path.insert(0, %r); import peer_gemm_blas as p; "
            "lib, sfx, path = p.load_openblas(); g = lambda n: getattr(lib, 'scipy_openblas_' + n + sfx); "
            "g('get_corename').restype = g('get_config').restype = ctypes.c_char_p; "
            "print(json.dumps({'library': path, 'config': g('get_config')().decode(), "
            "'core_auto': g('get_corename')().decode()}))") % os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-300:]}
    d = json.loads(r.stdout)
    d["version"] = d["config"].split()[1] if len(d["config"].split()) > 1 else None
    d["cores_timed"] = "core_auto, plus SkylakeX (forced) where the CPU has AVX-512; fastest per case"
    return d


if __name__ == "__main__":
    if "--child" in sys.argv:
        child()
    elif "--describe" in sys.argv:
        print(json.dumps(describe()))
    else:
        main()
