"""gen_omni_tower_lora.py — LoRA on the Qwen2.5-Omni thinker's encoders too: the reference for
tests/test_omni_train.sh (transformers 5.23, PEFT 0.21, torch CPU fp32).

  python tools/ref/gen_omni_tower_lora.py     # after gen_omni_train.py (whose fixtures it reads)

The same base, data, samples and optimiser as gen_omni_train.py's LoRA run (data.jsonl, a0/a1.wav,
img0.png), with PEFT's LoRA (r 4, alpha 8, no dropout) on the LM's seven projections, the audio
encoder's linears (model.audio_tower.layers.N.self_attn.{q,k,v,out}_proj, .fc1, .fc2 and
model.audio_tower.proj) and the vision tower's (model.visual.blocks.N.attn.{q,k,v,proj},
.mlp.{gate,up,down}_proj, model.visual.merger.mlp.{0,2}): 43 modules. The base stays frozen, as
PEFT freezes it; the encoders learn through their adapters only.

  tower_lora_init/          the initial adapter (PEFT's init: A kaiming-uniform, B 0): mmc starts
                            from it (model.lora.init)
  tower_lora_losses.txt     per-step loss of 20 steps (lr 5e-3, file order: the image record at
                            steps 3, 7, 11, 15, 19)
  tower_lora_ref/           the adapter after those 20 steps
  tower_lora_ref.logits.txt base + tower_lora_ref on img0.png + a0.wav + "Describe both." with the
                            generation prompt (image part first, then the audio, as `mmc forward
                            --image --audio` orders them): the last position's logits
  tower_lora_merged.safetensors  merge_and_unload() of base + tower_lora_ref: a few merged weights
                            under the checkpoint's names (an LM, an audio and vision q / k / v / proj /
                            MLP / merger linear) for `mmc merge`
"""
import json
import os
import shutil
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch
from PIL import Image
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import Qwen2_5OmniProcessor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_omni_train import BASE, OUT, SAMPLES, encode, load_base, read_wav, train  # noqa: E402

TARGETS = (r"model\.language_model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
           r"|model\.audio_tower\.(layers\.\d+\.(self_attn\.(q|k|v|out)_proj|fc1|fc2)|proj)"
           r"|model\.visual\.(blocks\.\d+\.(attn\.(q|k|v|proj)|mlp\.(gate|up|down)_proj)|merger\.mlp\.(0|2))")
MERGED = ["model.layers.1.self_attn.q_proj.weight", "audio_tower.layers.0.fc1.weight", "audio_tower.proj.weight",
          "visual.blocks.0.attn.q.weight", "visual.blocks.1.attn.k.weight", "visual.blocks.1.attn.v.weight",
          "visual.blocks.0.attn.proj.weight", "visual.blocks.1.mlp.down_proj.weight", "visual.merger.mlp.0.weight",
          "visual.merger.mlp.2.weight", "visual.blocks.0.attn.q.bias"]


def main():
    proc = Qwen2_5OmniProcessor.from_pretrained(BASE)
    data = [encode(proc, *s) for s in SAMPLES]
    torch.manual_seed(0)
    base = load_base()
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS))
    mods = [n for n, m in pm.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A]
    assert len(mods) == 43, (len(mods), mods)
    for d in ("tower_lora_init", "tower_lora_ref"):
        shutil.rmtree(os.path.join(OUT, d), ignore_errors=True)
    pm.save_pretrained(os.path.join(OUT, "tower_lora_init"))
    pm.train()
    losses = train(pm, [p for p in pm.parameters() if p.requires_grad], data, 20, 5e-3)
    with open(os.path.join(OUT, "tower_lora_losses.txt"), "w") as f:
        f.write("".join("%.8f\n" % v for v in losses))
    pm.save_pretrained(os.path.join(OUT, "tower_lora_ref"))
    pm.eval()
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "Describe both."}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    enc = proc(text=text, audio=[read_wav("a0.wav")], images=[Image.open(os.path.join(OUT, "img0.png")).convert("RGB")],
               return_tensors="pt")
    with torch.no_grad():
        lg = pm(**enc).logits[0, -1]
    with open(os.path.join(OUT, "tower_lora_ref.logits.txt"), "w") as f:
        f.write(" ".join("%.8g" % v for v in lg.tolist()) + "\n")
    merged = pm.merge_and_unload().state_dict()   # live names: model.language_model.*, model.audio_tower.*, model.visual.*
    live = {"model.layers.": "model.language_model.layers.", "audio_tower.": "model.audio_tower.",
            "visual.": "model.visual."}
    out = {}
    for k in MERGED:
        src = next(v + k[len(p):] for p, v in live.items() if k.startswith(p))
        out[k] = merged[src].detach().clone().contiguous()
    save_file(out, os.path.join(OUT, "tower_lora_merged.safetensors"), metadata={"format": "pt"})
    for d in ("tower_lora_init", "tower_lora_ref"):   # a path relative to the repository root
        p = os.path.join(OUT, d, "adapter_config.json")
        j = json.load(open(p))
        j["base_model_name_or_path"] = "tests/fixtures/omni/thinker"
        json.dump(j, open(p, "w"), indent=2)
    print("tower lora", losses)


if __name__ == "__main__":
    main()
