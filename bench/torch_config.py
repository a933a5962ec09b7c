"""torch_config.py — what the PyTorch peers run on, for results.json's "peers" object (bench/run.sh).

Prints one JSON object: torch's version, the CPU capability its ATen kernels dispatch to
(torch.backends.cpu.get_cpu_capability(): "AVX512", "AVX2", ...), the BLAS and oneDNN lines of
torch.__config__.show() (f32 matmul goes to the BLAS, bf16 matmul and F.linear to oneDNN),
the thread count, and the versions of the other peers' libraries where they import
(transformers, tokenizers, diffusers, torchvision, PIL), and the OpenBLAS that bench/peer_gemm_blas.py
times (version, the core it selects here). Not named peer_*.py: run.sh runs
those as benchmarks."""
import json
import re

out = {}
try:
    import torch
    cfg = torch.__config__.show()
    t = {"version": torch.__version__, "threads": torch.get_num_threads()}
    try:
        t["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception as e:  # older torch
        t["cpu_capability"] = f"unknown ({type(e).__name__})"
    m = re.search(r"BLAS_INFO=([^,\n]+)", cfg)
    t["blas"] = m.group(1).strip() if m else None
    lines = [ln.strip() for ln in cfg.splitlines()]
    # the library line of the BLAS f32 matmul calls (MKL / OpenBLAS / ...), as show() words it
    t["blas_line"] = next((ln.lstrip("- ") for ln in lines
                           if re.search(r"Math Kernel Library|OpenBLAS|BLIS|Accelerate", ln)), None)
    t["onednn"] = next((ln.lstrip("- ") for ln in lines if "oneDNN" in ln or "MKL-DNN" in ln), None)
    t["mkldnn_enabled"] = bool(torch.backends.mkldnn.is_available())
    # the kernel paths MKL and oneDNN take on this CPU, as they report them themselves: a child
    # runs one f32 matmul (MKL sgemm) and one bf16 matmul (oneDNN) with their verbose modes on
    import subprocess
    import sys
    try:
        env = dict(__import__("os").environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
        code = ("import torch; a = torch.randn(64, 64); (a @ a); b = a.bfloat16(); (b @ b)")
        v = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        vl = (v.stdout + v.stderr).splitlines()
        t["mkl_verbose"] = next((ln.strip() for ln in vl if ln.startswith("MKL_VERBOSE") and "SGEMM" not in ln), None)
        t["mkl_sgemm"] = next((ln.strip()[:160] for ln in vl if ln.startswith("MKL_VERBOSE") and "SGEMM" in ln), None)
        t["onednn_isa"] = next((ln.split("isa:", 1)[1].strip() for ln in vl if "onednn_verbose" in ln and "isa:" in ln), None)
        t["onednn_bf16_matmul"] = next((ln.split(",")[6] for ln in vl
                                         if "onednn_verbose" in ln and ",exec," in ln and "matmul" in ln), None)
    except Exception as e:
        t["mkl_verbose"] = f"not read ({type(e).__name__})"
    out["torch"] = t
except ImportError as e:
    out["torch"] = {"error": str(e)}
for mod in ("transformers", "tokenizers", "diffusers", "torchvision", "PIL"):
    try:
        out[mod] = {"version": __import__(mod).__version__}
    except Exception:
        pass
# the best BLAS of the machine, bench_gemm's second peer (bench/peer_gemm_blas.py): OpenBLAS and
# the core it selects on this CPU, checked at run time
try:
    import peer_gemm_blas
    out["openblas"] = peer_gemm_blas.describe()
except Exception as e:
    out["openblas"] = {"error": f"{type(e).__name__}: {e}"}
print(json.dumps(out))
