"""peer_util.py — what the PyTorch peer scripts share: the thread count the C benches use
(MMC_BENCH_THREADS), the timing estimator and the JSON line each case prints (peer_timing.py,
re-exported here), the memory baseline (as bench_util.h's bench_mem_baseline: RSS after
start-up and imports, before the model; figures are peak RSS minus it), and the training-step
timer of the 7B-shaped VLM peers (as bench_vlm7b.h's)."""
import os
import time

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


def run_train_modes(train_case, default):
    """train_case(mode) for each of full, lora named in MMC_BENCH_VLM7B_TRAIN (default: default), each
    in a spawned process of its own (a fresh peak RSS; the memory freed between them)."""
    import multiprocessing as mp
    modes = os.environ.get("MMC_BENCH_VLM7B_TRAIN", default).split(",")
    ctx = mp.get_context("spawn")
    for m in ("full", "lora"):
        if m in modes:
            p = ctx.Process(target=train_case, args=(m,))
            p.start()
            p.join()


def time_train_steps(step, tokens, prefix, base):
    """One warm-up call of step(), then MMC_BENCH_VLM7B_TRAIN_STEPS (3) timed ones: reports
    PREFIX_tokens_per_s (tokens / the median wall time), PREFIX_cpu_s_per_step (the median CPU
    time of the process, all threads) and PREFIX_peak_mem_MiB (peak RSS - base); returns the
    median wall time."""
    step()
    ts, cs = [], []
    for _ in range(max(1, int(os.environ.get("MMC_BENCH_VLM7B_TRAIN_STEPS", "3")))):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    ts.sort()
    cs.sort()
    report(f"{prefix}_tokens_per_s", tokens / ts[len(ts) // 2], "tokens/s")
    report(f"{prefix}_cpu_s_per_step", cs[len(cs) // 2], "CPU s", False)
    report(f"{prefix}_peak_mem_MiB", peak_rss_mib() - base, "MiB", False)
    return ts[len(ts) // 2]
