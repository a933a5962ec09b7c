"""peer_util.py — what the PyTorch peer scripts share: the thread count the C benches use
(MMC_BENCH_THREADS), the timing estimator and the JSON line each case prints (peer_timing.py,
re-exported here), and the memory baseline (as bench_util.h's bench_mem_baseline: RSS after
start-up and imports, before the model; figures are peak RSS minus it)."""
import os

import torch

from peer_timing import median_time, report  # noqa: F401 (re-exported)

torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))


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
