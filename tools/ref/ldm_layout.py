"""The original LDM / SGM single-file layout of Stable Diffusion 1.x / SDXL checkpoints, written from diffusers /
transformers state dicts: the reverse of diffusers' loaders/single_file_utils.py conversion (diffusers ships only the
LDM -> diffusers direction; this follows scripts/convert_diffusers_to_original_sdxl.py of its repository, which is not
installed). Used by gen_sdxl_single_file.py and gen_sdxl_img2img.py, which check every tensor diffusers'
from_single_file reads back against the weights written."""
import torch

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
