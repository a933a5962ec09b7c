"""Spoken questions made with espeak-ng (the Debian package, 1.51) and what transformers 5.23 makes of them,
for tests/test_spoken.sh: mmc on real synthetic speech at espeak-ng's 22050 Hz (resampled to 16 kHz on
the way in), through Whisper and the Qwen2.5-Omni thinker.

Writes tests/fixtures/spoken/:
  colour.wav  "What colour is the square?"   espeak-ng -v en-us -s 160 (22050 Hz mono 16-bit, as written)
  count.wav   "How many shapes are there?"   espeak-ng -v en-gb-scotland -s 190
  ref.safetensors, per clip c:
    c.samples [n]        the 16 kHz samples (below)
    c.whisper80 [80, F]  WhisperProcessor's input_features of the whisper fixture (80 mel bins), the F frames of
                         real audio (attention mask ones)
    c.omni128 [128, L]   Qwen2_5OmniProcessor's input_features (128 bins) [0, :, :L], L = feature_attention_mask.sum()
  expected.json, per clip:
    seconds     its length
    whisper     {"tokens"}: WhisperForConditionalGeneration.generate(language="en", max_new_tokens=24) on
                WhisperProcessor's features of the 16 kHz samples, with the tiny random checkpoint
                tests/fixtures/whisper/model (tools/ref/gen_whisper.py)
    omni        {"n_prompt", "greedy_ids"}: the thinker of tests/fixtures/omni (tools/ref/gen_omni.py) on
                [user: tests/fixtures/omni/image.png, the clip, "Answer the spoken question."]: the prompt length
                (Qwen2_5OmniProcessor) and 8 greedy new tokens
The 16 kHz samples are what librosa.load(path, sr=16000) gives: int16 / 32768 resampled with soxr HQ, the path
mmc's reader takes (src/io/audio.c). The models are random, so the words are not recognised; the check is
that mmc computes what transformers computes on such speech.
Run: .venv-ref/bin/python tools/ref/gen_spoken.py (needs espeak-ng on PATH)
"""
import json
import os
import subprocess
import sys
import wave

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np
import soxr
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (Qwen2_5OmniProcessor, Qwen2_5OmniThinkerForConditionalGeneration, WhisperProcessor,
                          WhisperForConditionalGeneration)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "spoken")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)

CLIPS = {"colour": ("What colour is the square?", "en-us", 160),
         "count": ("How many shapes are there?", "en-gb-scotland", 190)}

wproc = WhisperProcessor.from_pretrained(os.path.join(ROOT, "whisper", "model"))
wmodel = WhisperForConditionalGeneration.from_pretrained(os.path.join(ROOT, "whisper", "model")).float().eval()
od = os.path.join(ROOT, "omni", "thinker")
oproc = Qwen2_5OmniProcessor.from_pretrained(od)
omodel = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(od).float().eval()
image = Image.open(os.path.join(ROOT, "omni", "image.png")).convert("RGB")

expected, ref = {}, {}
for name, (text, voice, speed) in CLIPS.items():
    path = os.path.join(OUT, name + ".wav")
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", path, text], check=True)
    with wave.open(path, "rb") as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2, path
        sr = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    x = soxr.resample(pcm.astype(np.float64) / 32768.0, sr, 16000, quality="HQ").astype(np.float32)
    inp = wproc(x, sampling_rate=16000, return_tensors="pt", return_attention_mask=True)
    F = int(inp.attention_mask.sum())
    ref[name + ".samples"] = torch.from_numpy(x.copy())
    ref[name + ".whisper80"] = inp.input_features[0, :, :F].float().contiguous()
    with torch.no_grad():
        seq = wmodel.generate(input_features=inp.input_features, language="en", max_new_tokens=24)
    conv = [{"role": "user", "content": [{"type": "image"}, {"type": "audio"},
                                         {"type": "text", "text": "Answer the spoken question."}]}]
    prompt = oproc.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    oin = oproc(text=prompt, images=image, audio=[x], return_tensors="pt")
    T = oin["input_ids"].shape[1]
    L = int(oin["feature_attention_mask"].sum())
    ref[name + ".omni128"] = oin["input_features"][0, :, :L].float().contiguous()
    with torch.no_grad():
        g = omodel.generate(**oin, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    expected[name] = {"text": text, "voice": voice, "speed": speed, "rate": sr, "seconds": len(pcm) / sr,
                      "whisper": {"tokens": seq[0].tolist()},
                      "omni": {"n_prompt": T, "greedy_ids": g[0, T:].tolist()}}
    print(name, sr, len(pcm) / sr, "s", os.path.getsize(path), "bytes", seq[0].tolist(), T, g[0, T:].tolist())
save_file(ref, os.path.join(OUT, "ref.safetensors"))
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(expected, f)   # one line: the shell test greps it
subprocess.run(["espeak-ng", "--version"], check=True)
