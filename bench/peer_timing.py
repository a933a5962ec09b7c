"""peer_timing.py — the timing estimator of every peer script (the median call of a timed run,
after one warm-up), the JSON line each case prints for bench/merge.py and the size of the buffer
that evicts the caches before a DRAM-bound case. Free of PyTorch, so
peers of other runtimes (whisper.cpp, llama.cpp) time without torch's OpenMP runtime loaded;
peer_util.py re-exports both."""
import json
import time


def median_time(fn, min_s=1.0, min_iters=3):
    """Median seconds per call of fn over at least min_iters calls and min_s seconds."""
    fn()
    ts, start = [], time.perf_counter()
    while len(ts) < 1000 and (len(ts) < min_iters or time.perf_counter() - start < min_s):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def report(name, value, unit, higher=True):
    print(json.dumps({"name": name, "peer": value, "unit": unit, "better": "higher" if higher else "lower"}),
          flush=True)


def evict_floats():
    """floats in 512 MiB or twice the L3 where that is bigger (bench_gemm.c's DRAM probe buffer)"""
    l3 = 0
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            txt = f.read().strip()
        l3 = int(txt[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[txt[-1]] if txt[-1] in "KMG" else int(txt)
    except (OSError, ValueError, KeyError, IndexError):
        pass
    return max(512 << 20, 2 * l3) // 4
