"""Short synthetic audio files and transformers' WhisperFeatureExtractor output, for tests/test_audio.c.

Writes tests/fixtures/audio/:
  tone.wav        1.0 s, 44.1 kHz stereo 16-bit PCM (python's wave module): a chirp on the left, two tones
                  and a little noise on the right (seeded)
  tone48.wav      1.0 s, 48 kHz mono 16-bit: the same mix, for the 48 -> 16 kHz resampler figure
  tone.flac       tone.wav through FFmpeg's FLAC encoder (PyAV), lossless
  speech.mp3      1.0 s, 44.1 kHz stereo, libmp3lame 96 kb/s
  speech.opus     1.0 s, 48 kHz stereo, libopus 64 kb/s in Ogg
  speech.m4a      1.0 s, 44.1 kHz stereo, AAC 96 kb/s in MP4 (m4a)
  video.mp4       1.0 s of 32x32 H.264 video with a 44.1 kHz stereo AAC track
  silent.mp4      the same video without an audio track (error case)
  fe80/           WhisperFeatureExtractor(feature_size=80).save_pretrained (untouched preprocessor_config.json)
  fe128/          WhisperFeatureExtractor(feature_size=128, return_attention_mask=True), as Whisper-large-v3 /
                  Qwen2.5-Omni use, saved the same way
  fe128_nested/   the same settings as transformers 5's processor_config.json holds them (under
                  "feature_extractor"), written from fe128's to_dict()
  ref.safetensors
    wav_16k_soxr    [16000] tone.wav's mono mean (L + R) / 2 / 32768 (librosa.load(sr=None); test_audio.c checks
                    the 44.1 kHz decode against the WAV's own samples) resampled 44.1 -> 16 kHz with soxr HQ (librosa.load(sr=16000), transformers'
                    load_audio with the soundfile backend)
    wav_16k_swr     [n] the same through PyAV's AudioResampler (libswresample defaults: torchcodec, PyAV users)
    w48_16k_soxr    [16000] the 48 kHz clip through soxr HQ to 16 kHz
    mp3_mono, opus_mono, m4a_mono, mp4_mono  PyAV's decode of each lossy file (native rate), channels averaged,
                    every 4th sample (to keep the fixture small); *_n: the full sample count
    fe_pcm          [20800] a 1.3 s 16 kHz clip (feature input)
    fe80, fe128     [n_mels, 160] the first 160 frames of WhisperFeatureExtractor(fe_pcm, sampling_rate=16000)
                    (numpy path, padded to 30 s); fe80_pad / fe128_pad: the value of every later frame (the
                    generator asserts they are all equal); it prints the numpy path's distance to the torch path
    mask128         [3000] attention_mask (int32)
    mel80, mel128   [201, n_mels] fe.mel_filters (float64 in transformers) as float32
"""
import json
import os
import sys
import wave

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import av
import numpy as np
import soxr
import torch
from safetensors.numpy import save_file
from transformers import WhisperFeatureExtractor

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "audio")
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(15)


def mix(sr, secs, stereo=True):
    t = np.arange(int(sr * secs)) / sr
    left = 0.5 * np.sin(2 * np.pi * (200 * t + 1500 * t * t))                       # chirp 200 Hz -> ~3.2 kHz/s
    right = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.2 * np.sin(2 * np.pi * 3100 * t + 0.5)
    right = right * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)) + 0.02 * rng.standard_normal(t.size)
    x = np.stack([left, right], 1) if stereo else (0.5 * (left + right))[:, None]
    return np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)


def write_wav(path, pcm, sr):
    with wave.open(path, "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def encode(path, pcm, sr, codec, fmt=None, video=False, **opts):
    """pcm [n, 2] int16 -> file through PyAV (its bundled FFmpeg)."""
    c = av.open(path, "w", format=fmt, options={"fflags": "+bitexact"})   # no random Ogg serial
    if video:
        vs = c.add_stream("libx264", rate=10)
        vs.width, vs.height, vs.pix_fmt = 32, 32, "yuv420p"
        vs.options = {"x264-params": "threads=1"}
    a = c.add_stream(codec, rate=sr) if codec else None
    if a is not None:
        a.layout = "stereo"
        if "bit_rate" in opts:
            a.bit_rate = opts.pop("bit_rate")
        a.options = opts
        fr = a.codec_context.frame_size or 1024
        planar = pcm.T.copy()
        if a.codec_context.format.name in ("s16", "s16p"):
            data, fmtname = (planar if a.codec_context.format.is_planar else pcm.reshape(1, -1)), a.codec_context.format.name
        else:
            data, fmtname = (planar.astype(np.float32) / 32768.0), "fltp"
        for i in range(0, pcm.shape[0], fr):
            chunk = np.ascontiguousarray(data[:, i:i + fr] if fmtname != "s16" else pcm[i:i + fr].reshape(1, -1))
            f = av.AudioFrame.from_ndarray(chunk, format=fmtname, layout="stereo")
            f.sample_rate = sr
            f.pts = i
            for p in a.encode(f):
                c.mux(p)
        for p in a.encode():
            c.mux(p)
    if video:
        for i in range(10):
            img = np.full((32, 32, 3), 20 * i, np.uint8)
            for p in vs.encode(av.VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p")):
                c.mux(p)
        for p in vs.encode():
            c.mux(p)
    c.close()


def pyav_mono(path):
    """Every decoded frame (PyAV, FFmpeg's default decoder) as float in [-1, 1], channels averaged."""
    chunks = []
    with av.open(path) as c:
        s = c.streams.audio[0]
        for f in c.decode(s):
            a = f.to_ndarray()
            if not f.format.is_planar:
                a = a.reshape(-1, len(f.layout.channels)).T
            scale = {np.dtype(np.int16): 32768.0, np.dtype(np.int32): 2147483648.0}.get(a.dtype, 1.0)
            chunks.append(a.astype(np.float32) / np.float32(scale))
    x = np.concatenate(chunks, axis=1)
    return (x.sum(0) / np.float32(x.shape[0])).astype(np.float32) if x.shape[0] > 1 else x[0], s.rate


def pyav_resample(mono, sr, out_sr):
    """libswresample with its defaults, as PyAV's AudioResampler (and torchcodec) run it."""
    r = av.AudioResampler(format="flt", layout="mono", rate=out_sr)
    f = av.AudioFrame.from_ndarray(mono[None, :].astype(np.float32), format="flt", layout="mono")
    f.sample_rate = sr
    f.pts = 0
    out = [o.to_ndarray()[0] for o in r.resample(f)] + [o.to_ndarray()[0] for o in r.resample(None)]
    return np.concatenate(out).astype(np.float32)


ref = {}
# lossless: WAV and FLAC
st = mix(44100, 1.0)
write_wav(os.path.join(OUT, "tone.wav"), st, 44100)
encode(os.path.join(OUT, "tone.flac"), st, 44100, "flac")
mono = (st.astype(np.float32) / 32768.0).mean(1).astype(np.float32)
assert np.array_equal(mono, ((st[:, 0].astype(np.float32) / 32768) * 0.5 + (st[:, 1].astype(np.float32) / 32768) * 0.5))
ref["wav_16k_soxr"] = soxr.resample(mono, 44100, 16000, quality="HQ").astype(np.float32)
ref["wav_16k_swr"] = pyav_resample(mono, 44100, 16000)
m48 = mix(48000, 1.0, stereo=False)
write_wav(os.path.join(OUT, "tone48.wav"), m48, 48000)
w48_mono = m48[:, 0].astype(np.float32) / 32768.0
ref["w48_16k_soxr"] = soxr.resample(w48_mono, 48000, 16000, quality="HQ").astype(np.float32)
flac_mono, _ = pyav_mono(os.path.join(OUT, "tone.flac"))
assert np.array_equal(flac_mono, mono), "FLAC round trip is not exact"

# lossy formats and a video's audio track
sp = mix(44100, 1.0)
encode(os.path.join(OUT, "speech.mp3"), sp, 44100, "libmp3lame", bit_rate=96000)
sp48 = mix(48000, 1.0)
encode(os.path.join(OUT, "speech.opus"), sp48, 48000, "libopus", fmt="ogg", bit_rate=64000)
encode(os.path.join(OUT, "speech.m4a"), sp, 44100, "aac", fmt="ipod", bit_rate=96000)
encode(os.path.join(OUT, "video.mp4"), st, 44100, "aac", video=True, bit_rate=64000)
encode(os.path.join(OUT, "silent.mp4"), st, 44100, None, video=True)
for name, key in [("speech.mp3", "mp3_mono"), ("speech.opus", "opus_mono"), ("speech.m4a", "m4a_mono"),
                  ("video.mp4", "mp4_mono")]:
    x, rate = pyav_mono(os.path.join(OUT, name))
    ref[key] = np.ascontiguousarray(x[::4])
    ref[key + "_n"] = np.array([x.size], np.int64)
    print(f"{name}: {x.size} samples at {rate} Hz")

# Whisper features
t = np.arange(20800) / 16000
pcm = (0.4 * np.sin(2 * np.pi * 300 * t) * np.sin(2 * np.pi * 2 * t) + 0.2 * np.sin(2 * np.pi * 2500 * t * (1 + t))
       + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
ref["fe_pcm"] = pcm
KEEP = 160
for n_mels, mask in [(80, False), (128, True)]:
    fe = WhisperFeatureExtractor(feature_size=n_mels, return_attention_mask=mask)
    d = os.path.join(OUT, f"fe{n_mels}")
    fe.save_pretrained(d)
    fe = WhisperFeatureExtractor.from_pretrained(d)
    feats = fe._np_extract_fbank_features(
        np.pad(pcm, (0, fe.n_samples - pcm.size))[None, :], "cpu")[0]          # what __call__ runs, numpy path
    full = fe(pcm, sampling_rate=16000, return_tensors="np", return_attention_mask=True)
    torch_feats = full["input_features"][0]                                      # torch is installed: torch path
    assert feats.shape == (n_mels, 3000)
    tail = feats[:, KEEP:]
    assert np.all(tail == tail[0, 0]), "the padded frames are not all equal"
    print(f"fe{n_mels}: numpy vs torch path max |diff| {np.abs(feats - torch_feats).max():.2e}")
    ref[f"fe{n_mels}"] = np.ascontiguousarray(feats[:, :KEEP]).astype(np.float32)
    ref[f"fe{n_mels}_pad"] = np.array([tail[0, 0]], np.float32)
    ref[f"mel{n_mels}"] = fe.mel_filters.astype(np.float32)
    if mask:
        ref["mask128"] = full["attention_mask"][0].astype(np.int32)
        nd = os.path.join(OUT, "fe128_nested")
        os.makedirs(nd, exist_ok=True)
        with open(os.path.join(nd, "processor_config.json"), "w") as f:
            json.dump({"feature_extractor": fe.to_dict(), "processor_class": "WhisperProcessor"}, f, indent=2)

for k in ("wav_16k_soxr", "wav_16k_swr"):
    print(k, ref[k].size)
d = np.abs(ref["wav_16k_soxr"][:min(ref["wav_16k_soxr"].size, ref["wav_16k_swr"].size)] -
           ref["wav_16k_swr"][:min(ref["wav_16k_soxr"].size, ref["wav_16k_swr"].size)])
print(f"swr defaults vs soxr HQ (44.1k -> 16k): max |diff| {d.max():.2e}, interior {d[64:-64].max():.2e}")
save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, os.path.join(OUT, "ref.safetensors"))
total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
print(f"tests/fixtures/audio: {total / 1e6:.2f} MB")
