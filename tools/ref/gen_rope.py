"""gen_rope.py — fixtures for mmc_rope and the rope tables (tests/test_ops_rope.c), produced
by transformers' own code paths on tiny configs:

  apply.safetensors   x [B,T,H,D], cos/sin, r -> out = apply_rotary_pos_emb (unsqueeze_dim=2,
                      mmc's [B,T,H,D] layout) and dx = grad of sum(out * r)
  table_1d.safetensors   Qwen2RotaryEmbedding (head_dim 16, theta 1e6) at pos [2, 7]
  table_mrope.safetensors Qwen2VLRotaryEmbedding (head_dim 32, mrope_section [4, 6, 6],
                      theta 1e4) at pos [3, 2, 9]
  table_vision.safetensors Qwen2VLVisionRotaryEmbedding (embed_dim 64 / 4 heads -> D 16) at
                      get_vision_position_ids(grid_thw [[1,4,6],[2,2,4]], spatial_merge 2)
"""
import os

import torch
from safetensors.torch import save_file
from transformers.models.qwen2.configuration_qwen2 import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding, apply_rotary_pos_emb
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig
from transformers.models.qwen2_vl.modeling_qwen2_vl import (Qwen2VLRotaryEmbedding,
                                                            Qwen2VLVisionRotaryEmbedding)
from transformers.vision_utils import get_vision_position_ids

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "rope")


def save(name, d):
    save_file({k: v.contiguous() for k, v in d.items()}, os.path.join(OUT, name + ".safetensors"))


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(0)

    # 1-D table (Qwen2: hidden 64 / 4 heads -> head_dim 16, theta 1e6)
    cfg = Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    rot = Qwen2RotaryEmbedding(cfg)
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [5, 9, 17, 100, 1000, 4095, 32000]])
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = rot(x, pos)
    save("table_1d", {"pos": pos, "cos": cos, "sin": sin})

    # apply op with those tables: x [2, 7, 3, 16]
    xq = torch.randn(2, 7, 3, 16, generator=g, requires_grad=True)
    r = torch.rand(2, 7, 3, 16, generator=g) * 2 - 1
    out, _ = apply_rotary_pos_emb(xq, xq.detach(), cos, sin, unsqueeze_dim=2)
    (out * r).sum().backward()
    save("apply", {"x": xq.detach(), "cos": cos, "sin": sin, "r": r, "out": out.detach(), "dx": xq.grad})

    # M-RoPE (Qwen2-VL text model): head_dim 32, mrope_section [4, 6, 6]
    tcfg = Qwen2VLTextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "mrope_section": [4, 6, 6]})
    mrot = Qwen2VLRotaryEmbedding(tcfg)
    mpos = torch.randint(0, 60, (3, 2, 9), generator=g)
    mcos, msin = mrot(x, mpos)
    save("table_mrope", {"pos": mpos, "cos": mcos, "sin": msin})

    # 2-D vision rope: D = 64 / 4 = 16, spatial_merge 2
    vcfg = Qwen2VLVisionConfig(embed_dim=64, num_heads=4, depth=1, spatial_merge_size=2)
    vrot = Qwen2VLVisionRotaryEmbedding(vcfg)
    grid = torch.tensor([[1, 4, 6], [2, 2, 4]])
    vpos = get_vision_position_ids(grid, 2)
    vcos, vsin = vrot(x, vpos)
    save("table_vision", {"grid_thw": grid, "cos": vcos, "sin": vsin})


if __name__ == "__main__":
    main()
