"""Single-file checkpoints of the tiny SDXL and SD 1.x pipelines (tests/test_sdxl_single_file.c): one .safetensors
each in the original SGM / LDM layout that users download from Civitai and the Hub, read back by diffusers' own
`from_single_file(..., config=<the fixture pipeline folder>, local_files_only=True)`, which supplies the configs and
tokenizers offline (diffusers would otherwise fetch them from the Hub repo it infers from the keys).

diffusers ships only the LDM -> diffusers direction (loaders/single_file_utils.py); the reverse written here follows
scripts/convert_diffusers_to_original_sdxl.py of its repository (not installed) and is checked by loading the file
back through from_single_file and comparing every tensor with the weights it was written from (exact, f16).

The weights are the fixture pipelines' (tests/fixtures/sdxl, sd15_pipe) re-drawn with other seeds, so a loader that
read the folder's own weights instead of the file's could not pass. Stored in f16, as the files users download are.

tests/fixtures/sdxl_single/
  sdxl.safetensors   model.diffusion_model.*, first_stage_model.*, conditioner.embedders.0.transformer.* (CLIP-L in
                     transformers' layout), conditioner.embedders.1.model.* (OpenCLIP: resblocks, fused in_proj,
                     text_projection [hidden, proj]), plus keys diffusers ignores (logit_scale, position_ids)
  sd15.safetensors   model.diffusion_model.*, first_stage_model.*, cond_stage_model.transformer.*
  expected.safetensors
    unet_x / unet_t / unet_ctx / unet_text_embeds / unet_time_ids / unet_out: the SDXL UNet as loaded by
        from_single_file on one input; sd_unet_*: the same for SD 1.x
    prompt_embeds / pooled: SDXL encode_prompt of two prompts; latents_a / image_a: the SDXL pipeline, CFG 5 (zero
        negative), 3 steps, batch 2; sd_prompt_embeds, sd_latents / sd_image: SD 1.x with its DDIM scheduler_ddim,
        CFG 7.5, 3 steps

Run: /work/main/.venv-ref/bin/python tools/ref/gen_sdxl_single_file.py (after gen_sdxl.py)
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

from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FIX = os.path.join(ROOT, "tests", "fixtures")
SDXL_DIR, SD_DIR = os.path.join(FIX, "sdxl"), os.path.join(FIX, "sd15_pipe")
OUT = os.path.join(FIX, "sdxl_single")
torch.set_num_threads(2)
torch.manual_seed(0)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)

RESNET = [("norm1", "in_layers.0"), ("conv1", "in_layers.2"), ("norm2", "out_layers.0"), ("conv2", "out_layers.3"),
          ("time_emb_proj", "emb_layers.1"), ("conv_shortcut", "skip_connection")]


def unet_to_ldm(sd, cfg):
    """diffusers UNet2DConditionModel names -> the LDM / SGM openaimodel names (model.diffusion_model.*)."""
    lpb = cfg["layers_per_block"]
    has_attn_up = ["CrossAttn" in t for t in cfg["up_block_types"]]
    out = {}
    for k, v in sd.items():
        p = k.split(".")
        if p[0] in ("time_embedding", "add_embedding"):
            n = "time_embed" if p[0] == "time_embedding" else "label_emb.0"
            new = "%s.%d.%s" % (n, 0 if p[1] == "linear_1" else 2, p[2])
        elif p[0] == "conv_in":
            new = "input_blocks.0.0." + p[1]
        elif p[0] == "conv_norm_out":
            new = "out.0." + p[1]
        elif p[0] == "conv_out":
            new = "out.2." + p[1]
        elif p[0] == "down_blocks":
            b, kind, l, rest = int(p[1]), p[2], int(p[3]), ".".join(p[4:])
            if kind == "resnets":
                for a, o in RESNET:
                    rest = rest.replace(a, o)
                new = "input_blocks.%d.0.%s" % (1 + b * (lpb + 1) + l, rest)
            elif kind == "attentions":
                new = "input_blocks.%d.1.%s" % (1 + b * (lpb + 1) + l, rest)
            else:   # downsamplers.0.conv.*
                new = "input_blocks.%d.0.op.%s" % (1 + b * (lpb + 1) + lpb, ".".join(p[5:]))
        elif p[0] == "mid_block":
            kind, l, rest = p[1], int(p[2]), ".".join(p[3:])
            if kind == "resnets":
                for a, o in RESNET:
                    rest = rest.replace(a, o)
                new = "middle_block.%d.%s" % (2 * l, rest)
            else:
                new = "middle_block.1." + rest
        elif p[0] == "up_blocks":
            b, kind, l, rest = int(p[1]), p[2], int(p[3]), ".".join(p[4:])
            if kind == "resnets":
                for a, o in RESNET:
                    rest = rest.replace(a, o)
                new = "output_blocks.%d.0.%s" % (b * (lpb + 1) + l, rest)
            elif kind == "attentions":
                new = "output_blocks.%d.1.%s" % (b * (lpb + 1) + l, rest)
            else:   # upsamplers.0.conv.*: after the attention when the block has one
                new = "output_blocks.%d.%d.conv.%s" % (b * (lpb + 1) + lpb, 2 if has_attn_up[b] else 1, p[-1])
        else:
            raise KeyError(k)
        out["model.diffusion_model." + new] = v
    return out


def vae_to_ldm(sd, cfg):
    """diffusers AutoencoderKL names -> the LDM first_stage_model.* names; the mid attention's linears become the
    1x1 convolutions the original checkpoints hold."""
    n_up = len(cfg["up_block_types"])
    out = {}
    for k, v in sd.items():
        p = k.split(".")
        new = k
        if p[1] in ("conv_norm_out",):
            new = "%s.norm_out.%s" % (p[0], p[2])
        elif p[1] == "down_blocks":
            if p[3] == "resnets":
                new = "encoder.down.%s.block.%s.%s" % (p[2], p[4], ".".join(p[5:]).replace("conv_shortcut", "nin_shortcut"))
            else:
                new = "encoder.down.%s.downsample.conv.%s" % (p[2], p[-1])
        elif p[1] == "up_blocks":
            i = n_up - 1 - int(p[2])
            if p[3] == "resnets":
                new = "decoder.up.%d.block.%s.%s" % (i, p[4], ".".join(p[5:]).replace("conv_shortcut", "nin_shortcut"))
            else:
                new = "decoder.up.%d.upsample.conv.%s" % (i, p[-1])
        elif p[1] == "mid_block":
            if p[2] == "resnets":
                new = "%s.mid.block_%d.%s" % (p[0], int(p[3]) + 1, ".".join(p[4:]).replace("conv_shortcut", "nin_shortcut"))
            else:
                m = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out"}[p[4]]
                new = "%s.mid.attn_1.%s.%s" % (p[0], m, p[-1])
                if v.ndim == 2:
                    v = v[:, :, None, None]
        out["first_stage_model." + new] = v
    return out


def open_clip_to_ldm(sd, prefix):
    """transformers CLIPTextModelWithProjection names -> OpenCLIP's (the SDXL conditioner.embedders.1.model.*)."""
    out, qkv = {}, {}
    for k, v in sd.items():
        if k == "text_projection.weight":
            out["text_projection"] = v.T.contiguous()
            continue
        k = k[len("text_model."):]
        if k == "embeddings.position_embedding.weight":
            out["positional_embedding"] = v
        elif k == "embeddings.token_embedding.weight":
            out["token_embedding.weight"] = v
        elif k.startswith("final_layer_norm."):
            out["ln_final." + k.split(".")[-1]] = v
        elif k.startswith("encoder.layers."):
            p = k.split(".")
            n, rest = int(p[2]), ".".join(p[3:])
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                qkv.setdefault((n, p[-1]), {})[rest.split(".")[1]] = v
                continue
            rest = (rest.replace("layer_norm1", "ln_1").replace("layer_norm2", "ln_2").replace("mlp.fc1", "mlp.c_fc")
                    .replace("mlp.fc2", "mlp.c_proj").replace("self_attn.", "attn."))
            out["transformer.resblocks.%d.%s" % (n, rest)] = v
        else:
            raise KeyError(k)
    for (n, wb), d in qkv.items():
        out["transformer.resblocks.%d.attn.in_proj_%s" % (n, wb)] = torch.cat([d["q_proj"], d["k_proj"], d["v_proj"]])
    out["logit_scale"] = torch.tensor(4.6052)   # present in the released files; no diffusers module takes it
    return {prefix + k: v for k, v in out.items()}


def hf_clip_to_ldm(sd, prefix):
    """CLIP-L stays in transformers' layout under the prefix, with the text_model. level the released files have."""
    out = {prefix + ("" if k.startswith("text_model.") else "text_model.") + k: v for k, v in sd.items()}
    out[prefix + "text_model.embeddings.position_ids"] = torch.arange(77, dtype=torch.int64)[None]
    return out


def f16(d):
    return {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in d.items()}


def check_loaded(name, module, want):
    got = module.state_dict()
    for k, v in want.items():
        g = got[k] if k in got else got[k.removeprefix("text_model.")]
        assert torch.equal(g.float(), v.float()), (name, k)


# ---------------------------------------------------------------- SDXL
xl = StableDiffusionXLPipeline.from_pretrained(SDXL_DIR, torch_dtype=torch.float32, add_watermarker=False)
for i, m in enumerate((xl.unet, xl.vae, xl.text_encoder, xl.text_encoder_2)):
    rand_init(m, 100 + i)
w = {n: {k: v.half().float() for k, v in getattr(xl, n).state_dict().items()}
     for n in ("unet", "vae", "text_encoder", "text_encoder_2")}
ckpt = {}
ckpt.update(unet_to_ldm(w["unet"], xl.unet.config))
ckpt.update(vae_to_ldm(w["vae"], xl.vae.config))
ckpt.update(hf_clip_to_ldm(w["text_encoder"], "conditioner.embedders.0.transformer."))
ckpt.update(open_clip_to_ldm(w["text_encoder_2"], "conditioner.embedders.1.model."))
XL_FILE = os.path.join(OUT, "sdxl.safetensors")
save_file(f16(ckpt), XL_FILE)
del xl

pipe = StableDiffusionXLPipeline.from_single_file(XL_FILE, config=SDXL_DIR, local_files_only=True,
                                                  torch_dtype=torch.float32, add_watermarker=False)
for n in w:
    check_loaded(n, getattr(pipe, n), w[n])
exp = {}
g = torch.Generator().manual_seed(11)
prompts = ["a photo of a red circle", "a blue square on the left"]
with torch.no_grad():
    x = torch.randn(2, 4, 8, 12, generator=g)
    t = torch.tensor([999.0, 421.0])
    ctx = torch.randn(2, 5, 40, generator=g)
    te = torch.randn(2, 12, generator=g)
    ids = torch.tensor([[16.0, 24.0, 0.0, 0.0, 16.0, 24.0], [32.0, 32.0, 4.0, 2.0, 16.0, 24.0]])
    out = pipe.unet(x, t, encoder_hidden_states=ctx, added_cond_kwargs={"text_embeds": te, "time_ids": ids}).sample
    exp.update(unet_x=x, unet_t=t, unet_ctx=ctx, unet_text_embeds=te, unet_time_ids=ids, unet_out=out)
    pe, _, pp, _ = pipe.encode_prompt(prompts, do_classifier_free_guidance=False)
    exp.update(prompt_embeds=pe, pooled=pp)
    lat = torch.randn(2, 4, 8, 12, generator=g)
    exp["latents_a"] = lat
    exp["image_a"] = pipe(prompt=prompts, height=16, width=24, num_inference_steps=3, guidance_scale=5.0, latents=lat,
                          output_type="pt").images

# ---------------------------------------------------------------- SD 1.x
sd = StableDiffusionPipeline.from_pretrained(SD_DIR, torch_dtype=torch.float32)
for i, m in enumerate((sd.unet, sd.vae, sd.text_encoder)):
    rand_init(m, 200 + i)
w = {n: {k: v.half().float() for k, v in getattr(sd, n).state_dict().items()} for n in ("unet", "vae", "text_encoder")}
ckpt = {}
ckpt.update(unet_to_ldm(w["unet"], sd.unet.config))
ckpt.update(vae_to_ldm(w["vae"], sd.vae.config))
ckpt.update(hf_clip_to_ldm(w["text_encoder"], "cond_stage_model.transformer."))
SD_FILE = os.path.join(OUT, "sd15.safetensors")
save_file(f16(ckpt), SD_FILE)
del sd
sd = StableDiffusionPipeline.from_single_file(SD_FILE, config=SD_DIR, local_files_only=True, torch_dtype=torch.float32,
                                              safety_checker=None, requires_safety_checker=False)
for n in w:
    check_loaded(n, getattr(sd, n), w[n])
sd.scheduler = DDIMScheduler.from_pretrained(os.path.join(SD_DIR, "scheduler_ddim"))
with torch.no_grad():
    x = torch.randn(2, 4, 8, 12, generator=g)
    ctx = torch.randn(2, 5, 16, generator=g)
    out = sd.unet(x, t, encoder_hidden_states=ctx).sample
    exp.update(sd_unet_x=x, sd_unet_ctx=ctx, sd_unet_out=out)
    pe, _ = sd.encode_prompt(prompts, "cpu", 1, False, None)
    exp["sd_prompt_embeds"] = pe
    lat = torch.randn(1, 4, 8, 12, generator=g)
    exp["sd_latents"] = lat
    exp["sd_image"] = sd(prompt=prompts[0], height=16, width=24, num_inference_steps=3, guidance_scale=7.5,
                         latents=lat, output_type="pt").images
save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"))
print("single-file fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))
