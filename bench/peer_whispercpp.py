"""peer_whispercpp.py — whisper.cpp (the `pywhispercpp` package: its libwhisper and ggml CPU
backend as the wheel ships them) as the second peer of bench/bench_whisper.c, on the same
Whisper-small shapes with 2 of 12 layers (d_model 768, 12 heads, ffn 3072, 80 mel bins,
vocabulary 51865), in f16 (whisper.cpp's usual weights; the wheel's ggml cannot run an f32 file: its
im2col takes the convolution kernels only in f16, its loader wants them in the file's type), with
whisper.cpp's default flash attention and the bench's thread count:
  whisper_small2_encode_cross_30s_ms_whispercpp_f16: whisper_encode over one 30 s window
      (3000 mel frames -> 1500 positions). whisper.cpp's encode also projects the encoder states to
      every decoder layer's cross-attention keys and values; bench_whisper.c's figure under this
      name is likewise mmc's encode plus its decoder-state set-up (the same projections).
  whisper_small2_decode_step_ms_whispercpp_f16: after a 4-token prompt, 32 tokens one at a
      time through the KV cache (whisper_decode with n_past; logits of the new token over the whole
      vocabulary), the mean time of one such step.
The checkpoint is transformers' WhisperForConditionalGeneration at random init (seeded), written
in whisper.cpp's own model format (the ggml file its convert-h5-to-ggml.py writes: hparams, mel
filters, vocabulary, then each tensor under OpenAI's names) by write_ggml below, in a child process
(`--write PATH`): the timed process never loads PyTorch, whose OpenMP runtime would otherwise run
ggml's parallel regions. The vocabulary strings are placeholders (nothing is detokenised). Without
pywhispercpp the script says so and prints no case (1.5.1, a wheel, is pinned in
tools/ref/requirements.txt)."""
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

from peer_timing import median_time, report

THREADS = int(os.environ.get("MMC_BENCH_THREADS", "2"))
PROMPT = [50258, 50259, 50359, 50363]
STEPS = 32

# transformers' names -> whisper.cpp's (OpenAI's) names, inside a layer and outside
LAYER_MAP = {"self_attn.q_proj": "attn.query", "self_attn.k_proj": "attn.key", "self_attn.v_proj": "attn.value",
             "self_attn.out_proj": "attn.out", "self_attn_layer_norm": "attn_ln",
             "encoder_attn.q_proj": "cross_attn.query", "encoder_attn.k_proj": "cross_attn.key",
             "encoder_attn.v_proj": "cross_attn.value", "encoder_attn.out_proj": "cross_attn.out",
             "encoder_attn_layer_norm": "cross_attn_ln", "fc1": "mlp.0", "fc2": "mlp.2", "final_layer_norm": "mlp_ln"}
TOP_MAP = {"encoder.layer_norm.weight": "encoder.ln_post.weight", "encoder.layer_norm.bias": "encoder.ln_post.bias",
           "encoder.embed_positions.weight": "encoder.positional_embedding",
           "decoder.embed_positions.weight": "decoder.positional_embedding",
           "decoder.embed_tokens.weight": "decoder.token_embedding.weight",
           "decoder.layer_norm.weight": "decoder.ln.weight", "decoder.layer_norm.bias": "decoder.ln.bias"}


def ggml_name(hf):
    parts = hf.split(".")[1:]   # drop "model."
    if parts[1] == "layers":    # encoder.layers.N.<module>.<weight|bias>
        return ".".join([parts[0], "blocks", parts[2], LAYER_MAP[".".join(parts[3:-1])], parts[-1]])
    name = ".".join(parts)
    return TOP_MAP.get(name, name)


def write_ggml(model, cfg, mel_filters, path, f16):
    """whisper.cpp's model file: magic, 11 int32 hparams, the mel filters [n_mel, n_fft], the
    vocabulary (count, then length-prefixed bytes), then each tensor: n_dims, name length, type
    (0 f32, 1 f16), dims innermost first, name, data. Vectors, conv biases (as [n, 1]) and the
    positional embeddings stay f32 in an f16 file, as whisper.cpp expects."""
    with open(path, "wb") as f:
        f.write(struct.pack("i", 0x67676D6C))
        for v in (cfg.vocab_size, cfg.max_source_positions, cfg.d_model, cfg.encoder_attention_heads,
                  cfg.encoder_layers, cfg.max_target_positions, cfg.d_model, cfg.decoder_attention_heads,
                  cfg.decoder_layers, cfg.num_mel_bins, int(f16)):
            f.write(struct.pack("i", v))
        f.write(struct.pack("ii", *mel_filters.shape))
        f.write(mel_filters.astype(np.float32).tobytes())
        n_text = 50257   # byte-level BPE entries; whisper.cpp names the special tokens after them itself
        f.write(struct.pack("i", n_text))
        for i in range(n_text):
            b = b"t%d" % i
            f.write(struct.pack("i", len(b)) + b)
        for hf, t in model.state_dict().items():
            if hf == "proj_out.weight":   # tied to the token embedding
                continue
            name = ggml_name(hf)
            data = t.detach().float().numpy()
            if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
                data = data.reshape(-1, 1)
            keep32 = data.ndim < 2 or name.endswith("conv1.bias") or name.endswith("conv2.bias") or \
                name.endswith("positional_embedding")
            ftype = 1 if f16 and not keep32 else 0
            data = data.astype(np.float16 if ftype else np.float32)
            nb = name.encode()
            f.write(struct.pack("iii", data.ndim, len(nb), ftype))
            for d in reversed(data.shape):
                f.write(struct.pack("i", d))
            f.write(nb)
            f.write(np.ascontiguousarray(data).tobytes())


def write_model(path):
    """The bench's shapes at transformers' random init (seeded), in whisper.cpp's f16 file."""
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration
    cfg = WhisperConfig(vocab_size=51865, num_mel_bins=80, d_model=768, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=12, decoder_attention_heads=12, encoder_ffn_dim=3072,
                        decoder_ffn_dim=3072, max_source_positions=1500, max_target_positions=448)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg).eval()
    filters = WhisperFeatureExtractor(feature_size=80).mel_filters.T   # [n_mel, n_fft / 2 + 1]
    write_ggml(model, cfg, filters, path, True)


def main():
    try:
        import _pywhispercpp as pw
    except ImportError:
        print("peer_whispercpp: pywhispercpp is not installed (make fixtures installs it from "
              "tools/ref/requirements.txt); skipped", file=sys.stderr)
        return
    i = np.arange(80 * 3000, dtype=np.int64)
    feats = ((((i * 2654435761) % (1 << 32)) % 1000) / 700.0 - 0.6).astype(np.float32)   # bench_whisper's
    print("peer_whispercpp: " + pw.whisper_print_system_info().strip(), file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for tag in ("f16",):
            path = os.path.join(tmp, "ggml-%s.bin" % tag)
            subprocess.run([sys.executable, __file__, "--write", path], check=True)
            cp = pw.whisper_context_default_params()
            cp.use_gpu = False
            ctx = pw.whisper_init_from_file_with_params(path, cp)
            assert ctx is not None, "whisper.cpp did not load " + path
            assert pw.whisper_model_n_audio_layer(ctx) == 2 and pw.whisper_n_vocab(ctx) == 51865
            assert pw.whisper_set_mel(ctx, feats, 3000, 80) == 0

            def encode():
                assert pw.whisper_encode(ctx, 0, THREADS) == 0

            report("whisper_small2_encode_cross_30s_ms_whispercpp_" + tag, 1e3 * median_time(encode, 3.0, 3),
                   "ms", higher=False)
            encode()

            def steps():
                for k, tok in enumerate(PROMPT):   # the prompt as the binding takes it: one token a call
                    assert pw.whisper_decode(ctx, tok, 1, k, THREADS) == 0
                t0 = time.perf_counter()
                for t in range(STEPS):
                    assert pw.whisper_decode(ctx, (t * 7919 + 11) % 50000, 1, len(PROMPT) + t, THREADS) == 0
                return time.perf_counter() - t0

            steps()
            ts = sorted(steps() for _ in range(5))
            report("whisper_small2_decode_step_ms_whispercpp_" + tag, 1e3 * ts[len(ts) // 2] / STEPS, "ms",
                   higher=False)
            pw.whisper_free(ctx)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write_model(sys.argv[2])
    else:
        main()
