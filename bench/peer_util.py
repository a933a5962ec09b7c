"""peer_util.py — what the PyTorch peer scripts share: the thread count the C benches use
(MMC_BENCH_THREADS), the timing estimator (the median call of a timed run, after one warm-up),
the JSON line each case prints for bench/merge.py, and the memory baseline (as bench_util.h's
bench_mem_baseline: RSS after start-up and imports, before the model; figures are peak RSS
minus it)."""
import json
import os
import time

import torch

torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))


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


def _status_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return float(line.split()[1]) / 1024
    return 0.0


def mem_baseline():
    """Resets VmHWM (Linux >= 4.0) and returns the RSS now, in MiB: call after the imports,
    before the model."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    return _status_mib("VmRSS:")


def peak_rss_mib():
    """Peak RSS since mem_baseline() (VmHWM), in MiB."""
    return _status_mib("VmHWM:")
