"""Tiny random Qwen2.5-Omni thinker checkpoints and what transformers 5.23 computes on them, for
tests/test_omni.c and tests/test_omni_cli.sh.

Writes tests/fixtures/omni/:
  thinker/   Qwen2_5OmniThinkerForConditionalGeneration.save_pretrained + Qwen2_5OmniProcessor.save_pretrained,
             untouched. Audio encoder: 128 mel bins, d_model 32, 2 heads, 2 layers, n_window 8 (chunks of 16
             feature frames, so a 0.5 s clip is 3 full chunks and a 2-frame tail); vision encoder Qwen2.5-VL
             style (separate q/k/v), 2 blocks, hidden 16, patch 14, window 56, full attention in block 1;
             Qwen2 text model hidden 16, 2 heads of 8 (1 kv head), mrope_section [1, 1, 2].
  full/      Qwen2_5OmniForConditionalGeneration with the same thinker weights (thinker.* prefix) and a tiny
             talker / token2wav (speech output, which mmc does not run).
  audio.wav  0.5 s, 16 kHz mono 16-bit PCM: two tones and a chirp (seeded noise).
  video_audio.wav, frame_00.png .. frame_05.png  a 2.2 s track and six 28x28 frames: the "video" case
             (use_audio_in_video: audio and video interleaved in 2 s chunks, see below).
  image.png  56x56 RGB (4 image tokens after the merger).
  ref.safetensors, per case c in {audio, image_audio} (and video: ids, audio_out, pos, logits_last4 (the last
  4 positions, to keep the fixture small), greedy, grid, second_per_grid, pixel_values_videos_sum):
    c.ids [1, T] the processor's input_ids (the chat template applied, placeholders expanded)
    c.feats [128, L] input_features[0, :, :L] (L = feature_attention_mask.sum(): the frames the model uses)
    c.audio_out [n, 16]  the audio tower's output (get_audio_features)
    c.pos [3, 1, T] position ids (get_rope_index), c.logits [1, T, V], c.greedy [1, 8] greedy new tokens
    image_audio.pixel_values, image_audio.grid [1, 3]
  expected.json   prompts, templated text, greedy ids/text per case (for the shell test).
The tokenizer is the fixture tokenizer (tests/fixtures/tokenizer) with Qwen2.5-Omni's special tokens added.
Run: .venv-ref/bin/python tools/ref/gen_omni.py
"""
import json
import os
import shutil
import sys
import wave

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file
from transformers import (AutoTokenizer, Qwen2VLImageProcessor, Qwen2VLVideoProcessor, WhisperFeatureExtractor,
                          Qwen2_5OmniProcessor, Qwen2_5OmniThinkerConfig, Qwen2_5OmniThinkerForConditionalGeneration,
                          Qwen2_5OmniConfig, Qwen2_5OmniForConditionalGeneration)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "omni")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(23)
rng = np.random.default_rng(23)

SPECIAL = ["<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<|vision_bos|>",
           "<|vision_eos|>"]
tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "tokenizer"),
                                    extra_special_tokens={"audio_token": "<|AUDIO|>", "image_token": "<|IMAGE|>",
                                                          "video_token": "<|VIDEO|>",
                                                          "vision_bos_token": "<|vision_bos|>",
                                                          "vision_eos_token": "<|vision_eos|>",
                                                          "audio_bos_token": "<|audio_bos|>",
                                                          "audio_eos_token": "<|audio_eos|>"})
ID = {s: tok.convert_tokens_to_ids(s) for s in SPECIAL}
assert all(v is not None and v >= 1377 for v in ID.values()), ID
V = len(tok)
EOS = tok.convert_tokens_to_ids("<|im_end|>")

# Qwen2.5-Omni's chat template, reduced: audio / image / video placeholders in the user turn
TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
            "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
            "{% for content in message['content'] %}"
            "{% if content['type'] == 'audio' %}{{ '<|audio_bos|><|AUDIO|><|audio_eos|>' }}"
            "{% elif content['type'] == 'image' %}{{ '<|vision_bos|><|IMAGE|><|vision_eos|>' }}"
            "{% elif content['type'] == 'video' %}{{ '<|vision_bos|><|VIDEO|><|vision_eos|>' }}"
            "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
            "{{ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def thinker_config():
    audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                 max_source_positions=1500, n_window=8, output_dim=16)
    vision = dict(depth=2, hidden_size=16, intermediate_size=32, num_heads=2, in_channels=3, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, out_hidden_size=16,
                  fullatt_block_indexes=[1], hidden_act="silu")
    text = dict(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=4096, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]},
                eos_token_id=EOS, tie_word_embeddings=False)
    return Qwen2_5OmniThinkerConfig(audio_config=audio, vision_config=vision, text_config=text,
                                    audio_token_index=ID["<|AUDIO|>"], image_token_index=ID["<|IMAGE|>"],
                                    video_token_index=ID["<|VIDEO|>"], audio_start_token_id=ID["<|audio_bos|>"],
                                    audio_end_token_id=ID["<|audio_eos|>"],
                                    vision_start_token_id=ID["<|vision_bos|>"], position_id_per_seconds=25,
                                    seconds_per_chunk=2)


def scale_params(m):
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias") or "norm" in n or "ln_" in n:
                p.add_(torch.randn_like(p) * 0.1)
            if "embed_tokens" in n or "lm_head" in n:
                p.mul_(8.0)
            elif p.ndim >= 2:
                p.mul_(3.0)


def processor():
    ip = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=28 * 28 * 64, patch_size=14, merge_size=2,
                               temporal_patch_size=2)
    vp = Qwen2VLVideoProcessor(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 64}, patch_size=14,
                               merge_size=2, temporal_patch_size=2)
    fe = WhisperFeatureExtractor(feature_size=128, return_attention_mask=True)
    return Qwen2_5OmniProcessor(image_processor=ip, video_processor=vp, feature_extractor=fe, tokenizer=tok,
                                chat_template=TEMPLATE)


def write_wav(path, pcm, sr):
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


# ---------------------------------------------------------------- inputs
sr = 16000
t = np.arange(int(sr * 0.5)) / sr
x = 0.3 * np.sin(2 * np.pi * 300 * t) + 0.2 * np.sin(2 * np.pi * (800 * t + 2000 * t * t)) \
    + 0.05 * rng.standard_normal(t.size)
pcm16 = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)
write_wav(os.path.join(OUT, "audio.wav"), pcm16, sr)
audio = pcm16.astype(np.float32) / 32768.0       # what a WAV reader gives (int16 / 32768)

img = np.zeros((56, 56, 3), np.uint8)
img[..., 0] = np.arange(56)[None, :] * 4
img[..., 1] = np.arange(56)[:, None] * 4
img[10:30, 20:44] = (250, 30, 40)
Image.fromarray(img).save(os.path.join(OUT, "image.png"))
image = Image.open(os.path.join(OUT, "image.png")).convert("RGB")

# ---------------------------------------------------------------- models
d = os.path.join(OUT, "thinker")
shutil.rmtree(d, ignore_errors=True)
m = Qwen2_5OmniThinkerForConditionalGeneration(thinker_config()).float().eval()
scale_params(m)
m.generation_config.do_sample = False
m.save_pretrained(d)
processor().save_pretrained(d)

proc = Qwen2_5OmniProcessor.from_pretrained(d)
m = Qwen2_5OmniThinkerForConditionalGeneration.from_pretrained(d).float().eval()

cases = {
    "audio": ([{"type": "audio"}, {"type": "text", "text": "What did you hear?"}], None),
    "image_audio": ([{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Describe both."}], image),
}
ref, expected = {}, {}
for name, (content, im) in cases.items():
    conv = [{"role": "user", "content": content}]
    text = proc.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    kw = dict(text=text, audio=[audio], return_tensors="pt")
    if im is not None:
        kw["images"] = im
    inputs = proc(**kw)
    ids = inputs["input_ids"]
    T = ids.shape[1]
    L = int(inputs["feature_attention_mask"].sum())
    with torch.no_grad():
        aout = m.model.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"],
                                          return_dict=True).last_hidden_state
        pos, _ = m.model.get_rope_index(ids, inputs.get("image_grid_thw"), None, inputs["attention_mask"], False,
                                        inputs["feature_attention_mask"].sum(1), None)
        out = m(**inputs)
        g = m.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    ref[name + ".ids"] = ids.to(torch.int64)
    if name == "audio":   # image_audio's are the same (same clip)
        ref[name + ".feats"] = inputs["input_features"][0, :, :L].float().contiguous()
    ref[name + ".audio_out"] = aout.float().contiguous()
    ref[name + ".pos"] = pos.to(torch.int64).contiguous()
    ref[name + ".logits"] = out.logits.float().contiguous()
    ref[name + ".greedy"] = g[:, T:].to(torch.int64).contiguous()
    if im is not None:
        ref[name + ".pixel_values"] = inputs["pixel_values"].float().contiguous()
        ref[name + ".grid"] = inputs["image_grid_thw"].to(torch.int64)
    expected[name] = {"templated": text, "n_prompt": T, "n_frames": L, "greedy_ids": g[0, T:].tolist(),
                      "greedy_text": tok.decode(g[0, T:]), "prompt": content[-1]["text"]}
    print(name, "T", T, "frames", L, "audio tokens", aout.shape[0], "greedy", g[0, T:].tolist())

# ---------------------------------------------------------------- video with its audio track (use_audio_in_video)
# 6 frames of 28x28 (3 temporal patches of 1 merged token each, second_per_grid = 2 / fps 2.0 = 1 s, so
# temporal positions 0, 25, 50) and a 2.2 s track (55 audio tokens): TMRoPE's 2 s chunks interleave
# [video 0, 25 | audio 0..49] [video 50 | audio 50..54]. The audio is given decoded (audio_from_video_indices),
# as vLLM does, so no torchcodec is needed; the frames are frame_00.png .. frame_05.png.
t2 = np.arange(int(sr * 2.2)) / sr
x2 = 0.25 * np.sin(2 * np.pi * 500 * t2) + 0.15 * np.sin(2 * np.pi * (300 * t2 + 400 * t2 * t2)) \
    + 0.05 * rng.standard_normal(t2.size)
pcm2 = np.clip(np.round(x2 * 32767), -32768, 32767).astype(np.int16)
write_wav(os.path.join(OUT, "video_audio.wav"), pcm2, sr)
audio2 = pcm2.astype(np.float32) / 32768.0
frames = []
for i in range(6):
    f = np.zeros((28, 28, 3), np.uint8)
    f[..., 0] = 40 * i
    f[4 + 3 * i:12 + 3 * i, 6:20] = (20, 220, 90)
    f[..., 2] = np.arange(28)[None, :] * 9
    Image.fromarray(f).save(os.path.join(OUT, "frame_%02d.png" % i))
    frames.append(np.asarray(Image.open(os.path.join(OUT, "frame_%02d.png" % i)).convert("RGB")))
video = np.stack(frames)
conv = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
text = proc.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
inputs = proc(text=text, videos=[video], audio=[audio2], audio_from_video_indices=[0], load_audio_from_video=True,
              videos_kwargs={"size": {"shortest_edge": 28 * 28, "longest_edge": 28 * 28 * 64}}, return_tensors="pt")
ids = inputs["input_ids"]
T = ids.shape[1]
spg = inputs["video_second_per_grid"]
with torch.no_grad():
    aout = m.model.get_audio_features(inputs["input_features"], inputs["feature_attention_mask"],
                                      return_dict=True).last_hidden_state
    pos, _ = m.model.get_rope_index(ids, None, inputs["video_grid_thw"], inputs["attention_mask"], True,
                                    inputs["feature_attention_mask"].sum(1), spg)
    out = m(**inputs, use_audio_in_video=True)
    g = m.generate(**inputs, use_audio_in_video=True, max_new_tokens=8, min_new_tokens=8, do_sample=False)
ref["video.ids"] = ids.to(torch.int64)
ref["video.audio_out"] = aout.float().contiguous()
ref["video.pos"] = pos.to(torch.int64).contiguous()
ref["video.logits_last4"] = out.logits[:, -4:].float().contiguous()
ref["video.greedy"] = g[:, T:].to(torch.int64).contiguous()
ref["video.pixel_values_videos_sum"] = inputs["pixel_values_videos"].double().sum().reshape(1).float()
ref["video.grid"] = inputs["video_grid_thw"].to(torch.int64)
ref["video.second_per_grid"] = torch.tensor([float(x) for x in spg], dtype=torch.float32)
expected["video"] = {"templated": text, "n_prompt": T, "n_frames": int(inputs["feature_attention_mask"].sum()),
                     "greedy_ids": g[0, T:].tolist(), "greedy_text": tok.decode(g[0, T:]), "prompt": "What happens?"}
print("video T", T, "grid", inputs["video_grid_thw"].tolist(), "spg", spg, "audio tokens", aout.shape[0],
      "greedy", g[0, T:].tolist())
print(ids[0].tolist())
print(pos[0, 0].tolist())

# ---------------------------------------------------------------- the CLI's video file with its audio track
# tests/fixtures/audio/video.mp4 (10 frames 32x32 at 10 fps, 1 s AAC 44.1 kHz stereo): every frame (the saved
# video processor has do_sample_frames false) read with PyAV, the track decoded with PyAV (channels averaged)
# and resampled to 16 kHz with soxr HQ (librosa's path, what mmc's reader does), given as the video's audio.
import av
import soxr
VFILE = os.path.join(ROOT, "audio", "video.mp4")
c = av.open(VFILE)
vframes = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
c.close()
c = av.open(VFILE)
chunks = [f.to_ndarray() for f in c.decode(audio=0)]
arate = c.streams.audio[0].rate
c.close()
pcm = np.concatenate([x if x.ndim == 2 else x[None] for x in chunks], axis=1).astype(np.float64).mean(0)
track = soxr.resample(pcm, arate, 16000, quality="HQ").astype(np.float32)
conv = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What happens?"}]}]
text = proc.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
inputs = proc(text=text, videos=[vframes], audio=[track], audio_from_video_indices=[0], load_audio_from_video=True,
              return_tensors="pt")
T = inputs["input_ids"].shape[1]
with torch.no_grad():
    g = m.generate(**inputs, use_audio_in_video=True, max_new_tokens=8, min_new_tokens=8, do_sample=False)
expected["cli_video"] = {"templated": text, "n_prompt": T, "n_frames": int(inputs["feature_attention_mask"].sum()),
                         "grid": inputs["video_grid_thw"][0].tolist(), "greedy_ids": g[0, T:].tolist(),
                         "prompt": "What happens?"}
print("cli_video T", T, "grid", inputs["video_grid_thw"].tolist(), "frames", vframes.shape, "track", track.shape,
      "greedy", g[0, T:].tolist())

# ---------------------------------------------------------------- full checkpoint (thinker + talker + token2wav)
df = os.path.join(OUT, "full")
shutil.rmtree(df, ignore_errors=True)
talker = dict(vocab_size=64, embedding_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1, head_dim=16, tts_codec_start_token_id=60,
              tts_codec_end_token_id=61, tts_codec_pad_token_id=62, tts_codec_mask_token_id=63,
              tts_text_start_token_id=ID["<|audio_bos|>"], tts_text_end_token_id=ID["<|audio_eos|>"],
              tts_text_pad_token_id=0, audio_token_index=ID["<|AUDIO|>"], image_token_index=ID["<|IMAGE|>"],
              video_token_index=ID["<|VIDEO|>"], vision_start_token_id=ID["<|vision_bos|>"],
              vision_end_token_id=ID["<|vision_eos|>"], audio_start_token_id=ID["<|audio_bos|>"],
              audio_end_token_id=ID["<|audio_eos|>"],
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 3, 3]})
token2wav = dict(dit_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ff_mult=1, emb_dim=8,
                                 head_dim=8, num_embeds=64, mel_dim=8, enc_emb_dim=8, enc_dim=8,
                                 enc_channels=[8, 8, 8, 8, 24], enc_attention_channels=4, enc_se_channels=4,
                                 look_ahead_layers=[0], look_backward_layers=[0]),
                 bigvgan_config=dict(mel_dim=8, upsample_initial_channel=8, resblock_kernel_sizes=[3],
                                     resblock_dilation_sizes=[[1, 3, 5]], upsample_rates=[2],
                                     upsample_kernel_sizes=[4]))
fcfg = Qwen2_5OmniConfig(thinker_config=thinker_config().to_dict(), talker_config=talker, token2wav_config=token2wav)
full = Qwen2_5OmniForConditionalGeneration(fcfg).float().eval()
full.thinker.load_state_dict(m.state_dict())
full.save_pretrained(df)
processor().save_pretrained(df)
# (from_pretrained of the full model wants the speaker file spk_dict.pt, which mmc does not need: compare the
# saved thinker.* weights with the thinker checkpoint's instead)
from safetensors.torch import load_file
fw, tw = load_file(os.path.join(df, "model.safetensors")), load_file(os.path.join(d, "model.safetensors"))
for k, v in tw.items():
    assert torch.equal(fw["thinker." + k], v), k

save_file(ref, os.path.join(OUT, "ref.safetensors"))
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(expected, f, indent=1)
with open(os.path.join(OUT, "expected.tsv"), "w") as f:
    for name, e in expected.items():
        if name == "video":   # frames and a WAV: test_omni.c only
            continue
        f.write("%s\t%s\n" % (name, " ".join(map(str, e["greedy_ids"]))))
print("ok", V, ID)
