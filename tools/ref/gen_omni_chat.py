"""A two-turn Qwen2.5-Omni conversation with audio in both user turns, as transformers 5.23's
Qwen2_5OmniProcessor.apply_chat_template + Qwen2_5OmniProcessor + generate give it, for
tests/test_chat_audio.sh (`mmc chat` with /audio) on the tiny thinker of tools/ref/gen_omni.py.

Reads tests/fixtures/omni/ (thinker/, audio.wav, video_audio.wav: run gen_omni.py first) and writes
tests/fixtures/omni_chat/expected.json (and expected.tsv: turnN_ids / turnN_greedy, tab, the ids):
  turn1  {"ids": the prompt ids of [user: audio.wav + "What did you hear?"], "greedy_ids": 8 greedy new tokens,
          "reply": tok.decode(greedy_ids, skip_special_tokens=True), the assistant message of turn 2}
  turn2  {"ids": the prompt ids of [user turn 1, assistant reply, user: video_audio.wav + "And this one?"]
          (both clips, in order), "greedy_ids": its 8 greedy new tokens}
The clips are read as a 16-bit WAV reader gives them (int16 / 32768), as mmc's reader does at 16 kHz.
Run: .venv-ref/bin/python tools/ref/gen_omni_chat.py
"""
import json
import os
import sys
import wave

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np
import torch
from transformers import Qwen2_5OmniProcessor, Qwen2_5OmniThinkerForConditionalGeneration

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
SRC = os.path.join(ROOT, "omni")
OUT = os.path.join(ROOT, "omni_chat")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)


def read_wav(path):
    with wave.open(path, "rb") as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2 and w.getframerate() == 16000
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768.0


d = os.path.join(SRC, "thinker")
proc = Qwen2_5OmniProcessor.from_pretrained(d)
tok = proc.tokenizer
m = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(d).float().eval()
a1, a2 = read_wav(os.path.join(SRC, "audio.wav")), read_wav(os.path.join(SRC, "video_audio.wav"))


def run(conv, audios):
    text = proc.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    inputs = proc(text=text, audio=audios, return_tensors="pt")
    T = inputs["input_ids"].shape[1]
    with torch.no_grad():
        g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    return text, inputs["input_ids"][0].tolist(), g[0, T:].tolist()


conv = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What did you hear?"}]}]
text1, ids1, g1 = run(conv, [a1])
reply = tok.decode(g1, skip_special_tokens=True)
conv += [{"role": "assistant", "content": reply},
         {"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "And this one?"}]}]
text2, ids2, g2 = run(conv, [a1, a2])
assert ids2[:len(ids1)] == ids1
expected = {"turn1": {"templated": text1, "ids": ids1, "greedy_ids": g1, "reply": reply},
            "turn2": {"templated": text2, "ids": ids2, "greedy_ids": g2}}
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(expected, f, indent=1)
with open(os.path.join(OUT, "expected.tsv"), "w") as f:   # for the shell test: name, space-separated ids
    for name, e in expected.items():
        f.write("%s_ids\t%s\n%s_greedy\t%s\n" % (name, " ".join(map(str, e["ids"])), name,
                                                 " ".join(map(str, e["greedy_ids"]))))
print("turn1", len(ids1), g1, repr(reply))
print("turn2", len(ids2), g2)
