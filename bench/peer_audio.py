"""Peer for bench/bench_audio.c: a 30 s 44.1 kHz stereo MP3 decoded and resampled to 16 kHz
mono, and transformers' WhisperFeatureExtractor on 30 s (80 and 128 mel bins).

Decode: PyAV (the FFmpeg a `pip install av` brings) with its AudioResampler to 16 kHz mono
float — libswresample's default filter, what torchcodec (transformers' default audio backend,
not installed here) runs too; and, as `audio_decode_mp3_30s_16k_soxr`, PyAV's decode averaged to
mono and resampled with soxr HQ, what librosa.load / transformers' soundfile backend compute
(mmc's output matches this one). Features: WhisperFeatureExtractor(raw, sampling_rate=16000)
as a user calls it (torch installed: its torch STFT path on CPU) and, as `..._vs_numpy`, its
numpy path (_np_extract_fbank_features, the one mmc reproduces exactly).

`python bench/peer_audio.py --make-clip PATH` writes the MP3 and exits."""
import os
import sys
import time

import numpy as np

CLIP = os.environ.get("MMC_BENCH_AUDIO", "build/bench/audio_30s.mp3")


def make_clip(path, sr=44100, seconds=30):
    import av
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    rng = np.random.RandomState(0)
    t = np.arange(sr * seconds) / sr
    left = 0.4 * np.sin(2 * np.pi * (220 + 30 * np.sin(2 * np.pi * 0.2 * t)) * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 1.5 * t))
    right = 0.3 * np.sin(2 * np.pi * 880 * t) + 0.05 * rng.standard_normal(t.size)
    x = np.stack([left, right]).astype(np.float32)
    c = av.open(path + ".tmp.mp3", "w", format="mp3")
    s = c.add_stream("libmp3lame", rate=sr)
    s.layout = "stereo"
    s.bit_rate = 128000
    fr = 1152
    for i in range(0, x.shape[1], fr):
        f = av.AudioFrame.from_ndarray(np.ascontiguousarray(x[:, i:i + fr]), format="fltp", layout="stereo")
        f.sample_rate = sr
        f.pts = i
        for p in s.encode(f):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
    os.replace(path + ".tmp.mp3", path)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--make-clip":
    make_clip(sys.argv[2])
    sys.exit(0)

sys.path.insert(0, os.path.dirname(__file__))
import av  # noqa: E402
from peer_util import median_time, report  # noqa: E402
from transformers import WhisperFeatureExtractor  # noqa: E402

if not os.path.exists(CLIP):
    make_clip(CLIP)


def decode_swr():
    r = av.AudioResampler(format="flt", layout="mono", rate=16000)
    out = []
    with av.open(CLIP) as c:
        for f in c.decode(audio=0):
            out += [o.to_ndarray()[0] for o in r.resample(f)]
    out += [o.to_ndarray()[0] for o in r.resample(None)]
    return np.concatenate(out)


def decode_soxr():
    import soxr
    with av.open(CLIP) as c:
        s = c.streams.audio[0]
        x = np.concatenate([f.to_ndarray() for f in c.decode(s)], axis=1)   # fltp [2, n]
        rate = s.rate
    return soxr.resample(x.mean(0), rate, 16000, quality="HQ")


report("audio_decode_mp3_30s_16k", 1.0 / median_time(decode_swr, min_s=1, min_iters=3), "clips/s")
try:
    report("audio_decode_mp3_30s_16k_soxr", 1.0 / median_time(decode_soxr, min_s=1, min_iters=3), "clips/s")
except ImportError:
    print("peer_audio: soxr not installed; the soxr case is skipped", file=sys.stderr)

pcm = decode_swr()[:480000].astype(np.float32)
pcm = np.pad(pcm, (0, 480000 - pcm.size))
for mels in (80, 128):
    fe = WhisperFeatureExtractor(feature_size=mels)
    report(f"audio_logmel{mels}_30s", 1.0 / median_time(lambda: fe(pcm, sampling_rate=16000, return_tensors="np"),
                                                        min_s=1, min_iters=5), "clips/s")
    # CPU time per clip, all threads of the process (bench_audio's audio_logmel*_30s_cpu_ms): on a
    # loaded host the wall clock mostly measures the other processes
    c0 = time.process_time()
    for _ in range(40):
        fe(pcm, sampling_rate=16000, return_tensors="np")
    report(f"audio_logmel{mels}_30s_cpu_ms", (time.process_time() - c0) / 40 * 1e3, "ms", higher=False)
    padded = pcm[None, :]
    report(f"audio_logmel{mels}_30s_vs_numpy",
           1.0 / median_time(lambda: fe._np_extract_fbank_features(padded, "cpu"), min_s=1, min_iters=3), "clips/s")
