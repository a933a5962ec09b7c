"""Fixtures for Whisper (tests/test_whisper.c, tests/test_transcribe_cli.sh), written by transformers
itself (the version pinned in requirements.txt) with save_pretrained, untouched:

tests/fixtures/whisper/model/: a tiny random WhisperForConditionalGeneration (d_model 32, 4 heads,
2 encoder + 2 decoder layers, ffn 64, 80 mel bins, max_source_positions 1500 so the encoder takes
the real 3000 frames, max_target_positions 448), its generation_config.json shaped like
openai/whisper-*'s (decoder_start_token_id, lang_to_id, task_to_id, no_timestamps_token_id,
suppress_tokens, begin_suppress_tokens, max_initial_timestamp_index, forced_decoder_ids ...), and a
WhisperTokenizer / WhisperFeatureExtractor saved through WhisperProcessor.save_pretrained. The
tokenizer has the real structure: a byte-level BPE (learnt here with HF tokenizers on a few English
sentences) whose vocabulary ends with <|endoftext|>, then the added special tokens
<|startoftranscript|>, 12 language tokens, <|translate|>, <|transcribe|>, <|startoflm|>,
<|startofprev|>, <|nospeech|>, <|notimestamps|>, then the 1501 timestamp tokens <|0.00|> .. <|30.00|>.

tests/fixtures/whisper/expected.safetensors:
  input_features [1, 80, 3000] (float16 on disk: random log-mel-like values, the reference ran on
    them upcast to float32), encoder_last_hidden_state [1, 1500, 32],
  prompt_ids [T] and logits [T, V]: the decoder's logits for a prompt (sot, <|en|>, transcribe,
    notimestamps, a few text tokens) over those features,
  gen_<case> (int64): generate(input_features, ...)'s output ids for the cases in cases.json (with
    their text, tokenizer.decode(ids, skip_special_tokens=True))
    (forced language / detected language / timestamps / translate / the generation config's
    max_length / long-form over 4500 frames = cat(features, features[:, :, :1500])), on the
    features ("x") or their negation ("neg").
The random weights give the cross-attention a large scale so that the tokens depend on the
features and the model emits timestamp pairs, several segments per window and EOS.

tests/fixtures/whisper/tones_8s.flac, tones_40s.flac: 16 kHz mono 16-bit FLAC (lossless, so every
decoder yields the same samples, int16 / 32768) of tone bursts between silences, written with PyAV;
audio_expected.json: for each, the ids of generate() on WhisperProcessor's features of those
samples, as a user calls it: processor(audio) for the 8 s clip (padded to 30 s),
processor(audio, truncation=False, padding="longest") for the 40 s one (long-form), with the
options given there.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_whisper.py
"""
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (GenerationConfig, WhisperConfig, WhisperFeatureExtractor,  # noqa: E402
                          WhisperForConditionalGeneration, WhisperProcessor, WhisperTokenizer)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "whisper")
MODEL = os.path.join(OUT, "model")

torch.manual_seed(0)
torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(MODEL)

CORPUS = [
    "He has grave doubts whether Sir Frederick Leighton's work is really Greek after all.",
    "Mister Quilter is the apostle of the middle classes, and we are glad to welcome his gospel.",
    "Nor is Mister Quilter's manner less interesting than his matter.",
    "The quick brown fox jumps over the lazy dog; what colour is the square? It is red.",
    "Linnell's pictures are a sort of up guards and at em paintings, and Mason's exquisite idylls.",
    "Speech recognition turns audio into text, one token at a time, 0123456789!",
] * 4
LANGS = ["en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca"]

# -- tokenizer: byte-level BPE, <|endoftext|> closing the vocabulary, then the added tokens
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
trainer = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
bpe.train_from_iterator(CORPUS, trainer)
tj = json.loads(bpe.to_str())
vocab = dict(tj["model"]["vocab"])
merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in tj["model"]["merges"]]
eot = len(vocab)
vocab["<|endoftext|>"] = eot
specials = ["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{lang}|>" for lang in LANGS] + [
    "<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
tok = WhisperTokenizer(vocab=vocab, merges=merges, model_max_length=448)
tok.add_special_tokens({"additional_special_tokens": specials[1:]})
tok.add_tokens([f"<|{i * 0.02:.2f}|>" for i in range(1501)])
ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
assert ids["<|endoftext|>"] == eot and ids["<|startoftranscript|>"] == eot + 1
V = len(tok)
no_ts = ids["<|notimestamps|>"]
assert tok.convert_tokens_to_ids("<|0.00|>") == no_ts + 1 and tok.convert_tokens_to_ids("<|30.00|>") == V - 1
fe = WhisperFeatureExtractor(feature_size=80)
WhisperProcessor(feature_extractor=fe, tokenizer=tok).save_pretrained(MODEL)

# -- model
cfg = WhisperConfig(vocab_size=V, num_mel_bins=80, d_model=32, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                    max_source_positions=1500, max_target_positions=448, decoder_start_token_id=eot + 1,
                    pad_token_id=eot, bos_token_id=eot, eos_token_id=eot, scale_embedding=False)
model = WhisperForConditionalGeneration(cfg).eval()
g = torch.Generator().manual_seed(1)
with torch.no_grad():
    for name, p in model.named_parameters():
        if "layer_norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        elif "embed_positions" in name:
            p.copy_(0.5 * torch.randn(p.shape, generator=g))
        elif "embed_tokens" in name:
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
        elif "encoder_attn.v_proj" in name or "encoder_attn.out_proj" in name:
            # a strong cross-attention path: the random model's tokens then depend on the audio and
            # it emits timestamp pairs, several segments per window and EOS
            p.copy_(3.0 * torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
        else:
            p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
space = tok.convert_tokens_to_ids("\u0120")
suppress = sorted({tok.convert_tokens_to_ids(t) for t in ["!", "\"", "#", "(", ")", "*", "-", ":", ";", "?"]}
                  | {ids[t] for t in ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>",
                                      "<|nospeech|>"]})
gc = GenerationConfig(
    bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, decoder_start_token_id=eot + 1, max_length=448,
    begin_suppress_tokens=[space, eot], suppress_tokens=suppress,
    forced_decoder_ids=[[1, None], [2, ids["<|transcribe|>"]]],
    is_multilingual=True, lang_to_id={f"<|{lang}|>": ids[f"<|{lang}|>"] for lang in LANGS},
    task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
    no_timestamps_token_id=no_ts, prev_sot_token_id=ids["<|startofprev|>"], max_initial_timestamp_index=50,
    return_timestamps=False)
model.generation_config = gc
model.save_pretrained(MODEL)

# -- inputs: log-mel-like values (the extractor's range is [max - 8, max] / 4 + 1), as float16
feats = (torch.rand(1, 80, 3000, generator=g) * 1.6 - 0.6)
t = torch.arange(3000)
feats = feats + 0.3 * torch.sin(t / 37.0)[None, None] * torch.linspace(0, 1, 80)[None, :, None]
feats = feats.clamp(-1.0, 1.5).half()
x = feats.float()

model = WhisperForConditionalGeneration.from_pretrained(MODEL).eval()
out = {"input_features": feats.contiguous()}
with torch.no_grad():
    enc = model.model.encoder(x).last_hidden_state
    out["encoder_last_hidden_state"] = enc.contiguous()
    text = tok(" the quick brown fox is red", add_special_tokens=False).input_ids
    prompt = [eot + 1, ids["<|en|>"], ids["<|transcribe|>"], no_ts] + text
    logits = model(input_features=x, decoder_input_ids=torch.tensor([prompt])).logits[0]
    out["prompt_ids"] = torch.tensor(prompt, dtype=torch.int32)
    out["logits"] = logits.contiguous()

INPUTS = {"x": x, "neg": -x, "long": torch.cat([x, x[:, :, :1500]], dim=-1)}
CASES = {
    "en": ("x", dict(language="en", task="transcribe", max_new_tokens=24)),
    "detect": ("x", dict(max_new_tokens=24)),
    "timestamps": ("x", dict(language="en", return_timestamps=True, max_new_tokens=40)),
    "translate_ts": ("x", dict(language="de", task="translate", return_timestamps=True, max_new_tokens=32)),
    "detect_ts": ("x", dict(return_timestamps=True, max_new_tokens=32)),
    "neg": ("neg", dict(language="en", max_new_tokens=40)),
    "neg_ts": ("neg", dict(language="fr", return_timestamps=True, max_new_tokens=60)),
    "neg_default": ("neg", dict(return_timestamps=True)),
    "long": ("long", dict(language="en", return_timestamps=True, max_new_tokens=24)),
}
cases = {}
for name, (inp_name, kw) in CASES.items():
    inp = INPUTS[inp_name]
    with torch.no_grad():
        seq = model.generate(input_features=inp, **kw)
    seq = seq[0] if not isinstance(seq, dict) else seq["sequences"][0]
    out["gen_" + name] = seq.to(torch.int64).contiguous()
    # the transcription as a user reads it: WhisperTokenizer.decode drops timestamps and specials
    cases[name] = dict(kw, input=inp_name, frames=inp.shape[-1], text=tok.decode(seq, skip_special_tokens=True))
    print(name, len(seq), seq.tolist()[:60])
# language detection alone (what generate does at the first step)
with torch.no_grad():
    lang = model.detect_language(input_features=x, generation_config=model.generation_config)
out["detected_language"] = lang.to(torch.int64)
print("detected", tok.convert_ids_to_tokens(lang.tolist()))
save_file(out, os.path.join(OUT, "expected.safetensors"))
with open(os.path.join(OUT, "cases.json"), "w") as f:
    json.dump(cases, f, indent=1)
print("vocab", V, "eot", eot, "no_timestamps", no_ts)


# -- audio files and end-to-end references (mmc transcribe FILE)
import av  # noqa: E402
import numpy as np  # noqa: E402


def tones(seconds, bursts):
    """int16 samples at 16 kHz: silence with (start s, length s, Hz, amplitude) tone bursts, faded."""
    sr = 16000
    y = np.zeros(seconds * sr)
    for start, length, hz, amp in bursts:
        t = np.arange(int(length * sr)) / sr
        env = np.minimum(1.0, np.minimum(t, length - t) / 0.05)
        seg = amp * env * (np.sin(2 * np.pi * hz * t) + 0.3 * np.sin(2 * np.pi * 2.5 * hz * t))
        i = int(start * sr)
        y[i:i + len(seg)] += seg
    return np.clip(np.round(y * 32767), -32768, 32767).astype(np.int16)


def write_flac(path, pcm):
    with av.open(path, "w", format="flac") as f:
        st = f.add_stream("flac", rate=16000, layout="mono")
        st.format = "s16"
        for i in range(0, len(pcm), 4096):
            fr = av.AudioFrame.from_ndarray(pcm[None, i:i + 4096], format="s16", layout="mono")
            fr.sample_rate = 16000
            for pkt in st.encode(fr):
                f.mux(pkt)
        for pkt in st.encode(None):
            f.mux(pkt)


proc = WhisperProcessor.from_pretrained(MODEL)
AUDIO = {
    "tones_8s": (tones(8, [(0.5, 1.5, 300, 0.3), (3.0, 2.0, 550, 0.2), (6.0, 1.0, 900, 0.4)]),
                 dict(language="en", return_timestamps=True, max_new_tokens=40), False),
    "tones_40s": (tones(40, [(1.0, 2.0, 350, 0.3), (12.0, 3.0, 700, 0.2), (31.0, 2.5, 450, 0.35)]),
                  dict(language="en", return_timestamps=True, max_new_tokens=40), True),
}
audio_ref = {}
for name, (pcm, kw, longform) in AUDIO.items():
    path = os.path.join(OUT, name + ".flac")
    write_flac(path, pcm)
    with av.open(path) as f:   # the samples every decoder gets back
        back = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])
    assert np.array_equal(back, pcm), name
    audio = pcm.astype(np.float32) / 32768.0
    if longform:
        inp = proc(audio, sampling_rate=16000, return_tensors="pt", truncation=False, padding="longest",
                   return_attention_mask=True)
    else:
        inp = proc(audio, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        seq = model.generate(input_features=inp.input_features, **kw)
    seq = seq[0] if not isinstance(seq, dict) else seq["sequences"][0]
    audio_ref[name] = dict(kw, frames=int(inp.input_features.shape[-1]), tokens=seq.tolist())
    print(name, os.path.getsize(path), "bytes", inp.input_features.shape, seq.tolist())
with open(os.path.join(OUT, "audio_expected.json"), "w") as f:
    json.dump(audio_ref, f)   # one line: the shell test greps it
