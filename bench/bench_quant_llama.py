"""bench_quant_llama.py — llama.cpp's side of bench/bench_quant.sh: quantise a GGUF with llama.cpp's own
quantiser (llama_cpp.llama_model_quantize, as the llama-quantize tool does) and time single-stream greedy
decode in llama-cpp-python (the pinned llama.cpp), the same way bench_quant.sh times `mmc generate`:
the prompt (PROMPT fixed token ids, the same as bench_quant's) is evaluated, then NTOK tokens are decoded one at a time (each step: llama_decode of one token
and the argmax of its logits); tok/s = NTOK / the decode time, best of ROUNDS.
With CLOCK = cpu the decode time is this thread's CPU time (run it with THREADS = 1, where llama.cpp
computes in the calling thread), as bench_quant does with MMC_BENCH_CPU_CLOCK=1.
usage: bench_quant_llama.py quantize IN.gguf OUT.gguf q8_0|q4_k_m THREADS
       bench_quant_llama.py decode MODEL.gguf NTOK THREADS ROUNDS PROMPT_LEN [wall|cpu]
MMC_LLAMA_NO_EXTRA_BUFTS=1: load the model without llama.cpp's extra CPU buffer types (the AMX and
repacked-weight kernels; llama_model_params.use_extra_bufts = false). bench_quant.sh falls back to it when a
decode dies: llama-cpp-python 0.3.36 built with GGML_NATIVE on the Intel kind (AMX_INT8) segfaults in
llama_decode on Q8_0 and Q4_K_M GGUFs with them."""
import ctypes
import os
import sys
import time

import llama_cpp
import llama_cpp.llama
import numpy as np

if os.environ.get("MMC_LLAMA_NO_EXTRA_BUFTS") == "1":
    _default_params = llama_cpp.llama_model_default_params

    def _no_extra_bufts():
        p = _default_params()
        p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = _no_extra_bufts
    llama_cpp.llama.llama_cpp.llama_model_default_params = _no_extra_bufts

if sys.argv[1] == "quantize":
    src, dst, kind, threads = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[kind]
    p.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    sys.exit(1 if rc else 0)

path, ntok, threads, rounds, plen = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
llm = llama_cpp.Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=512, n_batch=512,
                      logits_all=False, verbose=False)
ids = [(i * 37 + 5) % 1000 for i in range(plen)]
clock = time.thread_time if len(sys.argv) > 7 and sys.argv[7] == "cpu" else time.perf_counter
best = 1e30
for _ in range(rounds):
    llm.reset()
    llm.eval(ids)
    tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    t0 = clock()
    for _ in range(ntok):
        llm.eval([tok])
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    best = min(best, clock() - t0)
print("%.6g" % (ntok / best))
