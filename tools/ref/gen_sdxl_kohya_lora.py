"""kohya / A1111 LoRA files for the tiny SDXL and SD 1.x pipelines (tests/test_sdxl_kohya_lora.c), read by diffusers'
own pipe.load_lora_weights (lora_pipeline.py: _maybe_map_sgm_blocks_to_diffusers, then
lora_conversion_utils._convert_non_diffusers_lora_to_diffusers), which gives the expected outputs.

Keys as kohya-ss sd-scripts writes them: "lora_unet_<module with '.' -> '_'>.lora_down.weight" [r, in],
".lora_up.weight" [out, r], ".alpha" (a scalar; scale alpha / r), and "lora_te1_" / "lora_te2_" ("lora_te_" for SD 1.x)
for the text encoders' "text_model.encoder.layers.N.self_attn.q_proj" ... "mlp.fc1" modules. SDXL LoRAs come in two
spellings of the UNet: the diffusers module names (down_blocks_1_attentions_0_...) and the SGM ones kohya uses for
SDXL (input_blocks_4_1_..., middle_block_1_..., output_blocks_N_1_...), both written here. The ranks differ per module
(2 and 4; one alpha, 3, so the scale alpha / r differs too), and up weights are non-zero, so every module
contributes.

tests/fixtures/sdxl_kohya/
  sdxl_diffusers_names.safetensors   UNet (transformer linears, proj_in / proj_out, time embedding) + both text
                                     encoders, diffusers module names for the UNet
  sdxl_sgm_names.safetensors         the same tensors with the SGM block names, plus label_emb (add_embedding)
  sd15.safetensors                   SD 1.x: the UNet's attention / feed-forward linears and its 1x1-conv proj_in /
                                     proj_out (4-d lora_down / lora_up) + "lora_te_" text encoder
  expected.safetensors
    unet_x / unet_t / unet_ctx / unet_text_embeds / unet_time_ids / unet_out: the SDXL UNet with the SGM-named LoRA
        loaded; unet_out_diffusers_names: with the other file (no add_embedding adapter: see below)
    prompt_embeds / pooled: SDXL encode_prompt with it (both text encoders adapted); latents / image: the pipeline,
        CFG 5 (zero negative), 3 steps
    sd_unet_x / sd_unet_ctx / sd_unet_out, sd_prompt_embeds, sd_latents / sd_image: SD 1.x likewise (DDIM, CFG 7.5)

Run: /work/main/.venv-ref/bin/python tools/ref/gen_sdxl_kohya_lora.py (after gen_sdxl.py)
"""
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from safetensors.torch import save_file

import diffusers
from diffusers import DDIMScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
SDXL_DIR, SD_DIR = os.path.join(FIX, "sdxl"), os.path.join(FIX, "sd15_pipe")
OUT = os.path.join(FIX, "sdxl_kohya")
torch.set_num_threads(2)
torch.manual_seed(0)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(21)


def linears(module, keep):
    return [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.Linear) and keep(n)]


def lora_tensors(prefix, mods, seed_shift):
    """kohya tensors for each (diffusers module name, nn.Linear): rank 2 or 4, alpha 3 (so alpha / r differs).

    One alpha for every module, as kohya's network_alpha writes it: diffusers 0.42 turns differing alphas into a
    PEFT alpha_pattern whose keys (".processor.to_q_lora...") match no module, so PEFT warns and applies the most
    common alpha everywhere, where kohya's and A1111's loaders (and mmc) apply each module's own."""
    out = {}
    for i, (name, lin) in enumerate(mods):
        r = 4 if (i + seed_shift) % 3 == 0 else 2
        k = prefix + name.replace(".", "_")
        conv = isinstance(lin, torch.nn.Conv2d)    # a 1x1 convolution: kohya's [r, in, 1, 1] / [out, r, 1, 1]
        fin, fout = (lin.in_channels, lin.out_channels) if conv else (lin.in_features, lin.out_features)
        tail = (1, 1) if conv else ()
        out[k + ".lora_down.weight"] = torch.randn(r, fin, *tail, generator=g) / fin ** 0.5
        out[k + ".lora_up.weight"] = 0.5 * torch.randn(fout, r, *tail, generator=g) / r ** 0.5
        out[k + ".alpha"] = torch.tensor(3.0)
    return out


def sgm_name(name, lpb):
    """diffusers UNet module name -> the SGM / LDM one (kohya's SDXL spelling)."""
    p = name.split(".")
    if p[0] == "down_blocks":
        return "input_blocks.%d.1.%s" % (1 + int(p[1]) * (lpb + 1) + int(p[3]), ".".join(p[4:]))
    if p[0] == "mid_block":
        return "middle_block.1." + ".".join(p[3:])
    if p[0] == "up_blocks":
        return "output_blocks.%d.1.%s" % (int(p[1]) * (lpb + 1) + int(p[3]), ".".join(p[4:]))
    return {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
            "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2"}[name]


def te_mods(te):
    # kohya names the CLIP modules with the text_model. level (transformers' CLIPTextModel of its time)
    base = te.text_model if hasattr(te, "text_model") else te
    return [("text_model." + n, m) for n, m in linears(base, lambda n: "encoder.layers." in n)]


def unet_mods(unet, attn_only):
    keep = (lambda n: "attentions" in n and ("transformer_blocks" in n)) if attn_only else \
        (lambda n: "attentions" in n or n.startswith(("time_embedding.", "add_embedding.")))
    return linears(unet, keep)


# ---------------------------------------------------------------- SDXL
xl = StableDiffusionXLPipeline.from_pretrained(SDXL_DIR, torch_dtype=torch.float32, add_watermarker=False)
lpb = xl.unet.config.layers_per_block
unet_l = unet_mods(xl.unet, False)
sd_unet = lora_tensors("lora_unet_", unet_l, 0)
sd_te = {**lora_tensors("lora_te1_", te_mods(xl.text_encoder), 1), **lora_tensors("lora_te2_", te_mods(xl.text_encoder_2), 2)}
# add_embedding in the diffusers spelling is left out of that file: diffusers' _convert_unet_lora_key strips the
# trailing index of every "emb" key, so add_embedding_linear_1 and _2 collapse into one name (kohya writes SDXL's
# as label_emb_0_0 / label_emb_0_2, the SGM file below, which converts correctly)
save_file({**{k: v for k, v in sd_unet.items() if "add_embedding" not in k}, **sd_te},
          os.path.join(OUT, "sdxl_diffusers_names.safetensors"))
sgm = {}
for k, v in sd_unet.items():
    mod, suffix = k.split(".", 1)
    name = dict((n.replace(".", "_"), n) for n, _ in unet_l)[mod[len("lora_unet_"):]]
    sgm["lora_unet_" + sgm_name(name, lpb).replace(".", "_") + "." + suffix] = v
save_file({**sgm, **sd_te}, os.path.join(OUT, "sdxl_sgm_names.safetensors"))

exp = {}
prompts = ["a photo of a red circle", "a blue square on the left"]
with torch.no_grad():
    x = torch.randn(2, 4, 8, 12, generator=g)
    t = torch.tensor([999.0, 421.0])
    ctx = torch.randn(2, 5, 40, generator=g)
    te = torch.randn(2, 12, generator=g)
    ids = torch.tensor([[16.0, 24.0, 0.0, 0.0, 16.0, 24.0], [32.0, 32.0, 4.0, 2.0, 16.0, 24.0]])
    base_out = xl.unet(x, t, encoder_hidden_states=ctx, added_cond_kwargs={"text_embeds": te, "time_ids": ids}).sample
    base_pe, _, base_pp, _ = xl.encode_prompt(prompts, do_classifier_free_guidance=False)
    outs = []
    for f in ("sdxl_diffusers_names.safetensors", "sdxl_sgm_names.safetensors"):
        xl.load_lora_weights(os.path.join(OUT, f), adapter_name=f.split(".")[0])
        xl.set_adapters([f.split(".")[0]])
        out = xl.unet(x, t, encoder_hidden_states=ctx, added_cond_kwargs={"text_embeds": te, "time_ids": ids}).sample
        pe, _, pp, _ = xl.encode_prompt(prompts, do_classifier_free_guidance=False)
        outs.append((out, pe, pp))
        xl.delete_adapters(f.split(".")[0])
    # both spellings load the same text-encoder adapters; the SGM one adds label_emb; each part changes its output
    for a, b in zip(outs[0][1:], outs[1][1:]):
        assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()
    exp["unet_out_diffusers_names"] = outs[0][0]
    out, pe, pp = outs[1]
    assert (out - outs[0][0]).abs().max() > 1e-3 and (outs[0][0] - base_out).abs().max() > 1e-2
    assert (pe[..., :16] - base_pe[..., :16]).abs().max() > 1e-2, "text_encoder LoRA not applied"
    assert (pe[..., 16:] - base_pe[..., 16:]).abs().max() > 1e-2, "text_encoder_2 LoRA not applied"
    exp.update(unet_x=x, unet_t=t, unet_ctx=ctx, unet_text_embeds=te, unet_time_ids=ids, unet_out=out,
               prompt_embeds=pe, pooled=pp)
    xl.load_lora_weights(os.path.join(OUT, "sdxl_sgm_names.safetensors"))
    lat = torch.randn(2, 4, 8, 12, generator=g)
    exp["latents"] = lat
    exp["image"] = xl(prompt=prompts, height=16, width=24, num_inference_steps=3, guidance_scale=5.0, latents=lat,
                      output_type="pt").images

# ---------------------------------------------------------------- SD 1.x: its proj_in / proj_out are 1x1 convolutions, adapted too
sd = StableDiffusionPipeline.from_pretrained(SD_DIR, torch_dtype=torch.float32)
sd.scheduler = DDIMScheduler.from_pretrained(os.path.join(SD_DIR, "scheduler_ddim"))
convs = [(n, m) for n, m in sd.unet.named_modules() if isinstance(m, torch.nn.Conv2d) and n.endswith(("proj_in", "proj_out"))]
assert convs and all(m.kernel_size == (1, 1) for _, m in convs)
tens = {**lora_tensors("lora_unet_", unet_mods(sd.unet, True) + convs, 0),
        **lora_tensors("lora_te_", te_mods(sd.text_encoder), 1)}
save_file(tens, os.path.join(OUT, "sd15.safetensors"))
with torch.no_grad():
    x = torch.randn(2, 4, 8, 12, generator=g)
    ctx = torch.randn(2, 5, 16, generator=g)
    base = sd.unet(x, t, encoder_hidden_states=ctx).sample
    base_pe, _ = sd.encode_prompt(prompts, "cpu", 1, False, None)
    sd.load_lora_weights(os.path.join(OUT, "sd15.safetensors"))
    out = sd.unet(x, t, encoder_hidden_states=ctx).sample
    pe, _ = sd.encode_prompt(prompts, "cpu", 1, False, None)
    assert (out - base).abs().max() > 1e-2 and (pe - base_pe).abs().max() > 1e-2
    exp.update(sd_unet_x=x, sd_unet_ctx=ctx, sd_unet_out=out, sd_prompt_embeds=pe)
    lat = torch.randn(1, 4, 8, 12, generator=g)
    exp["sd_latents"] = lat
    exp["sd_image"] = sd(prompt=prompts[0], height=16, width=24, num_inference_steps=3, guidance_scale=7.5,
                         latents=lat, output_type="pt").images
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
print("kohya LoRA fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
