"""check_internvl_chat_train.py FULL_CKPT LORA_CKPT FULL_FWD [LLM] — mmc's internvl_chat checkpoints in OpenGVLab's own
code (tests/test_internvl_chat_train.sh; the environment of tools/ref/gen_internvl_chat_train.py: .venv-internlm2 and
MMC_INTERNVL_CODE):
  FULL_CKPT  mmc's full fine-tuning checkpoint: InternVLChatModel.from_pretrained loads it with no missing or
             unexpected keys and every tensor as saved; its logits on FULL_FWD's input_ids and
             tests/fixtures/internvl_train/wide.png's tiles (dynamic_preprocess, as the generator makes them) equal
             `mmc forward`'s on the same checkpoint (FULL_FWD) within 1e-4
  LORA_CKPT  mmc's LoRA checkpoint: PeftModel.from_pretrained puts every adapter tensor on the fixture's base as saved
  LLM        internlm2 (default) or qwen2: which fixture (gen_internvl_chat_train.py --llm) the checkpoints come from
"""
import os
import sys

import gen_internvl_chat_train as g  # noqa: E402  (sets up the paths to OpenGVLab's code)
import torch  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

full, lora, fwd = sys.argv[1:4]
g.select(sys.argv[4] if len(sys.argv) > 4 else "internlm2")
m, info = g.InternVLChatModel.from_pretrained(full, torch_dtype=torch.float32, use_flash_attn=False,
                                              output_loading_info=True)
assert not any(info.values()), info
sd = load_file(os.path.join(full, "model.safetensors"))
got = m.state_dict()
assert sorted(got) == sorted(sd), (sorted(set(got) ^ set(sd)))
for k, v in sd.items():
    assert torch.equal(got[k], v), k
m = m.float().eval()
f = load_file(fwd)
ids = f["input_ids"].long()[None]
ns = g.opengvlab_tiling()
sample = {"messages": [{"role": "user", "content": "<image>What is in the picture?"}], "images": ["../internvl_train/wide.png"]}
want_ids, _, pv, flags, ctx = g.build_samples(ns, m.num_image_token, [sample], generation_prompt=True)[0]
assert torch.equal(want_ids[0], ids[0]), "mmc forward built other input_ids than chat() would"
m.img_context_token_id = ctx
with torch.no_grad():
    lg = m(pixel_values=pv, input_ids=ids, image_flags=flags).logits[0]
d = float((lg - f["logits"]).abs().max())
print("OpenGVLab's InternVLChatModel on mmc's full checkpoint vs mmc forward: max |logit diff| = %.3g" % d)
assert d <= 1e-4, d

base = g.InternVLChatModel.from_pretrained(g.TINY, torch_dtype=torch.float32, use_flash_attn=False)
pm = PeftModel.from_pretrained(base, lora)
ad = load_file(os.path.join(lora, "adapter_model.safetensors"))
got = {n: p for n, p in pm.named_parameters() if "lora_" in n}
assert len(got) == len(ad) and len(ad) > 0, (len(got), len(ad))
for n, p in got.items():
    assert torch.equal(p.detach(), ad[n.replace(".default", "")]), n
print("InternVLChatModel loaded %d tensors; PEFT loaded %d LoRA tensors" % (len(sd), len(got)))
