"""peer_sdcpp.py — stable-diffusion.cpp (the `stable-diffusion-cpp-python` package, built from
source with GGML_NATIVE: bench/bench_serve_requirements.txt) as the second peer of
bench/bench_diffusion.c, on the same Flux shapes, f32, with the bench's thread count:
  flux_step_512_t256_ms_sdcpp / flux_step_1024_t256_ms_sdcpp: one denoising step of the same
      FluxTransformer2DModel (8 heads of 128, 1 double- and 2 single-stream blocks, guidance
      embedder) at 512² / 1024²: stable-diffusion.cpp's own "sampling completed, taking T s" over
      N Euler steps at cfg 1 (one forward a step), divided by N, after a warm-up image.
      stable-diffusion.cpp conditions Flux on 256 text tokens whatever the model (its chunk length;
      here the zeros it uses without a T5 file), so bench_diffusion.c's figure under this name is
      its step with 256 text tokens (the flux_step_*_ms cases use FLUX.1-dev's 512);
  vae_decode_256_ms_sdcpp: its "decode_first_stage completed, taking T s" for a 256² image with
      FLUX.1's VAE (the same AutoencoderKL configuration as bench_diffusion.c's).
The checkpoints are diffusers' / transformers' random init (seeded): the transformer converted to
Black Forest Labs' original layout (the package's stable-diffusion.cpp recognises Flux only by those
names; to_bfl below), the VAE as diffusers' save_pretrained writes it, a CLIP-L text model (stable-diffusion.cpp's Flux conditioner needs one of its two encoders; CLIP-L's
shape is fixed in it). They are written by a child process (`--write DIR`) so the timed process
never loads PyTorch (its OpenMP runtime would run ggml's parallel regions). Its timings have a
10 ms resolution, hence several steps. Without the package the script says so and prints nothing."""
import contextlib
import ctypes
import os
import re
import subprocess
import sys
import tempfile

from peer_timing import report

THREADS = int(os.environ.get("MMC_BENCH_THREADS", "2"))


def to_bfl(sd):
    """diffusers' FluxTransformer2DModel state dict in Black Forest Labs' original layout (what
    diffusers' single-file loader converts from): q/k/v fused, the single blocks' q/k/v/mlp fused
    into linear1, the final modulation's halves in (shift, scale) order."""
    import torch
    out = {}
    cat = lambda *k: torch.cat([sd.pop(x) for x in k])   # noqa: E731
    ren = {"x_embedder": "img_in", "context_embedder": "txt_in",
           "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
           "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
           "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
           "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
           "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
           "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer", "proj_out": "final_layer.linear"}
    for a, b in ren.items():
        for wb in ("weight", "bias"):
            out[f"{b}.{wb}"] = sd.pop(f"{a}.{wb}")
    for wb in ("weight", "bias"):
        scale, shift = sd.pop(f"norm_out.linear.{wb}").chunk(2)
        out[f"final_layer.adaLN_modulation.1.{wb}"] = torch.cat([shift, scale])
    n_double = len({k.split(".")[1] for k in sd if k.startswith("transformer_blocks.")})
    n_single = len({k.split(".")[1] for k in sd if k.startswith("single_transformer_blocks.")})
    for i in range(n_double):
        p, q = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for wb in ("weight", "bias"):
            out[q + "img_mod.lin." + wb] = sd.pop(p + "norm1.linear." + wb)
            out[q + "txt_mod.lin." + wb] = sd.pop(p + "norm1_context.linear." + wb)
            out[q + "img_attn.qkv." + wb] = cat(*(p + f"attn.to_{x}.{wb}" for x in "qkv"))
            out[q + "txt_attn.qkv." + wb] = cat(*(p + f"attn.add_{x}_proj.{wb}" for x in "qkv"))
            out[q + "img_attn.proj." + wb] = sd.pop(p + "attn.to_out.0." + wb)
            out[q + "txt_attn.proj." + wb] = sd.pop(p + "attn.to_add_out." + wb)
            out[q + "img_mlp.0." + wb] = sd.pop(p + "ff.net.0.proj." + wb)
            out[q + "img_mlp.2." + wb] = sd.pop(p + "ff.net.2." + wb)
            out[q + "txt_mlp.0." + wb] = sd.pop(p + "ff_context.net.0.proj." + wb)
            out[q + "txt_mlp.2." + wb] = sd.pop(p + "ff_context.net.2." + wb)
        out[q + "img_attn.norm.query_norm.scale"] = sd.pop(p + "attn.norm_q.weight")
        out[q + "img_attn.norm.key_norm.scale"] = sd.pop(p + "attn.norm_k.weight")
        out[q + "txt_attn.norm.query_norm.scale"] = sd.pop(p + "attn.norm_added_q.weight")
        out[q + "txt_attn.norm.key_norm.scale"] = sd.pop(p + "attn.norm_added_k.weight")
    for i in range(n_single):
        p, q = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for wb in ("weight", "bias"):
            out[q + "modulation.lin." + wb] = sd.pop(p + "norm.linear." + wb)
            out[q + "linear1." + wb] = cat(*(p + f"attn.to_{x}.{wb}" for x in "qkv"), p + "proj_mlp." + wb)
            out[q + "linear2." + wb] = sd.pop(p + "proj_out." + wb)
        out[q + "norm.query_norm.scale"] = sd.pop(p + "attn.norm_q.weight")
        out[q + "norm.key_norm.scale"] = sd.pop(p + "attn.norm_k.weight")
    assert not sd, "unconverted: %s" % sorted(sd)
    return {k: v.contiguous() for k, v in out.items()}


def write_models(d):
    import torch
    from diffusers import AutoencoderKL, FluxTransformer2DModel
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel
    torch.manual_seed(0)
    flux = FluxTransformer2DModel(patch_size=1, in_channels=64, out_channels=None, num_layers=1, num_single_layers=2,
                                  attention_head_dim=128, num_attention_heads=8, joint_attention_dim=4096,
                                  pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))
    save_file(to_bfl(dict(flux.state_dict())), os.path.join(d, "flux_bfl.safetensors"))
    AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                  up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                  layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=1024,
                  scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
                  mid_block_add_attention=True).save_pretrained(os.path.join(d, "vae"))
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072,
                                        num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=77,
                                        hidden_act="quick_gelu", projection_dim=768))
    # under "text_model." as the released CLIP-L files have it (transformers 5 saves the bare names)
    sd = {k if k.startswith("text_model.") else "text_model." + k: v.contiguous() for k, v in clip.state_dict().items()}
    save_file(sd, os.path.join(d, "clip_l.safetensors"))


def main():
    try:
        import stable_diffusion_cpp as sdc
        from stable_diffusion_cpp import StableDiffusion
    except ImportError:
        print("peer_sdcpp: stable-diffusion-cpp-python is not installed (bench/bench_serve_requirements.txt); "
              "skipped", file=sys.stderr)
        return
    # stable-diffusion.cpp (C printf) and its Python wrapper (print) write progress bars and system info
    # on standard output: all of that to stderr, the case lines alone to the real standard output
    sys.stdout.flush()
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def emit(*a, **k):
        with contextlib.redirect_stdout(real_stdout):
            report(*a, **k)
    log = []

    @sdc.sd_log_callback
    def keep(level, text, data):
        log.append(text.decode("utf-8", errors="replace"))


    def taking(what):
        """seconds of the last "<what> completed, taking T s" line since the log was cleared"""
        hits = [float(m.group(1)) for line in log for m in [re.search(what + r" completed, taking ([0-9.]+)s", line)]
                if m]
        if not hits:
            raise RuntimeError("stable-diffusion.cpp logged no '%s completed' line:\n%s" % (what, "".join(log[-20:])))
        return hits[-1]

    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, __file__, "--write", d], check=True)
        sd = StableDiffusion(diffusion_model_path=os.path.join(d, "flux_bfl.safetensors"),
                             vae_path=os.path.join(d, "vae", "diffusion_pytorch_model.safetensors"),
                             clip_l_path=os.path.join(d, "clip_l.safetensors"), n_threads=THREADS,
                             wtype="f32", verbose=True)
        sdc.sd_set_log_callback(keep, ctypes.c_void_p(0))   # after the constructor, which sets its own

        def image(px, steps):
            log.clear()
            try:
                sd.generate_image(prompt="a red cat", width=px, height=px, cfg_scale=1.0, guidance=3.5,
                                  sample_method="euler", sample_steps=steps, seed=0)
            except ValueError as e:   # no image back: the log says why
                raise RuntimeError("stable-diffusion.cpp failed:\n" + "".join(log[-30:])) from e

        image(256, 1)   # warm-up (graph allocation, first-touch memory)
        image(256, 1)
        emit("vae_decode_256_ms_sdcpp", 1e3 * taking("decode_first_stage"), "ms", higher=False)
        for px, steps in ((512, 4), (1024, 2)):
            image(px, 1)
            image(px, steps)
            emit("flux_step_%d_t256_ms_sdcpp" % px, 1e3 * taking("sampling") / steps, "ms", higher=False)
        print("peer_sdcpp: " + sdc.sd_get_system_info().decode().strip(), file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        write_models(sys.argv[2])
    else:
        main()
