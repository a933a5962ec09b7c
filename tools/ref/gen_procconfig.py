"""Image-processor config layouts, and what transformers makes of each (tests/test_cli_procconfig.sh).

Writes tests/fixtures/procconfig/ (config files only; the test puts each next to the weights,
tokenizer and chat template of tests/fixtures/qwen2_vl_chat):
  v5/      processor_config.json from transformers 5.x Qwen2VLProcessor.save_pretrained, untouched,
           with a non-default image area (min_pixels / max_pixels given to the image processor)
  both/    v5's processor_config.json + a preprocessor_config.json (Qwen2VLImageProcessor
           .save_pretrained) with other values: the nested image_processor wins
  legacy/  the Hub's 4.x layout: preprocessor_config.json with top-level min_pixels / max_pixels
           (no size), and a processor_config.json without "image_processor" (falls through)
  sizemp/  preprocessor_config.json as 4.4x saved it: size {min_pixels, max_pixels} and the same
           values at the top level (transformers 5 rejects that size without the top-level keys)
  data.jsonl  one sample: two images (500x333: max_pixels decides; 37x53: min_pixels decides),
              a question and a one-word answer
  expected.json  per layout, from AutoImageProcessor.from_pretrained on that directory (PIL
           backend, the use_fast=False processor mmc mirrors) in a Qwen2VLProcessor: the image
           area it uses, image_grid_thw and the prompt's token count (chat template, generation
           prompt), and the teacher-forced loss of the qwen2_vl_chat model on data.jsonl's sample
           (mean NLL over the assistant tokens: content + <|im_end|>, as in gen_eval.py); and the
           same loss with the default processor (the test's proof that the area matters);
           expected.tsv holds the same figures for the shell test.
Run with the reference venv: /work/main/.venv-ref/bin/python tools/ref/gen_procconfig.py
"""
import json
import os
import shutil
import tempfile

import torch
from PIL import Image
from transformers import (AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration,
                          Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures")
MODEL = os.path.join(ROOT, "qwen2_vl_chat")
OUT = os.path.join(ROOT, "procconfig")
IMAGES = ["rgb_500x333.jpg", "rgb_37x53.png"]
QUESTION, ANSWER = "What colour is the circle?", "red"
AUX = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")

shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
tok = AutoTokenizer.from_pretrained(MODEL)


def processor(min_pixels, max_pixels):
    ip = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels)
    return Qwen2VLProcessor(image_processor=ip, tokenizer=tok, video_processor=Qwen2VLVideoProcessor(),
                            chat_template=tok.chat_template)


def keep(src, dst, names):
    os.makedirs(dst, exist_ok=True)
    for n in names:
        shutil.copy(os.path.join(src, n), os.path.join(dst, n))


with tempfile.TemporaryDirectory() as tmp:
    # v5: what processor.save_pretrained writes, untouched
    processor(28 * 28 * 8, 28 * 28 * 30).save_pretrained(os.path.join(tmp, "v5"))
    keep(os.path.join(tmp, "v5"), os.path.join(OUT, "v5"), ["processor_config.json"])
    # both: + an image processor's own file with other values
    Qwen2VLImageProcessor(min_pixels=3136, max_pixels=28 * 28 * 12).save_pretrained(os.path.join(tmp, "ip"))
    keep(os.path.join(tmp, "v5"), os.path.join(OUT, "both"), ["processor_config.json"])
    keep(os.path.join(tmp, "ip"), os.path.join(OUT, "both"), ["preprocessor_config.json"])
# legacy / sizemp: the layouts of older saves, as the Hub holds them (transformers 5 no longer writes them)
hub = {"do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
       "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "Qwen2VLImageProcessor",
       "image_std": [0.26862954, 0.26130258, 0.27577711], "merge_size": 2, "patch_size": 14,
       "processor_class": "Qwen2VLProcessor", "resample": 3, "rescale_factor": 0.00392156862745098,
       "temporal_patch_size": 2}
os.makedirs(os.path.join(OUT, "legacy"))
json.dump(dict(hub, min_pixels=28 * 28 * 10, max_pixels=28 * 28 * 48),
          open(os.path.join(OUT, "legacy", "preprocessor_config.json"), "w"), indent=2)
json.dump({"processor_class": "Qwen2VLProcessor"}, open(os.path.join(OUT, "legacy", "processor_config.json"), "w"),
          indent=2)
os.makedirs(os.path.join(OUT, "sizemp"))
json.dump(dict(hub, min_pixels=28 * 28 * 6, max_pixels=28 * 28 * 20,
               size={"min_pixels": 28 * 28 * 6, "max_pixels": 28 * 28 * 20}),
          open(os.path.join(OUT, "sizemp", "preprocessor_config.json"), "w"), indent=2)

with open(os.path.join(OUT, "data.jsonl"), "w") as f:
    f.write(json.dumps({"messages": [{"role": "user", "content": "<image><image>" + QUESTION},
                                     {"role": "assistant", "content": ANSWER}],
                        "images": ["../image/" + n for n in IMAGES]}) + "\n")

model = Qwen2VLForConditionalGeneration.from_pretrained(MODEL).float().eval()
images = [Image.open(os.path.join(ROOT, "image", n)).convert("RGB") for n in IMAGES]
user = {"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": QUESTION}]}
asst = {"role": "assistant", "content": [{"type": "text", "text": ANSWER}]}


def measure(proc):
    prompt = proc.apply_chat_template([user], add_generation_prompt=True, tokenize=False)
    full = proc.apply_chat_template([user, asst], tokenize=False)
    pin = proc(text=[prompt], images=images, return_tensors="pt")
    fin = proc(text=[full], images=images, return_tensors="pt")
    P, N = pin["input_ids"].shape[1], fin["input_ids"].shape[1]
    assert torch.equal(fin["input_ids"][0, :P], pin["input_ids"][0])
    labels = torch.full_like(fin["input_ids"], -100)
    labels[0, P:N - 1] = fin["input_ids"][0, P:N - 1]   # content + <|im_end|>, not the trailing "\n"
    with torch.no_grad():
        loss = model(**fin, labels=labels).loss
    ip = proc.image_processor
    return {"min_pixels": ip.size["shortest_edge"], "max_pixels": ip.size["longest_edge"],
            "image_grid_thw": pin["image_grid_thw"].tolist(), "prompt_tokens": P, "loss": float(loss)}


expected = {"images": ["tests/fixtures/image/" + n for n in IMAGES], "prompt": QUESTION}
for layout in ("v5", "both", "legacy", "sizemp"):
    with tempfile.TemporaryDirectory() as d:
        keep(MODEL, d, AUX)
        for n in os.listdir(os.path.join(OUT, layout)):
            shutil.copy(os.path.join(OUT, layout, n), d)
        try:   # the image processor as AutoImageProcessor finds it, PIL backend (mmc mirrors that one)
            ip = AutoImageProcessor.from_pretrained(d, backend="pil")
            assert type(ip).__name__ == "Qwen2VLImageProcessorPil", type(ip)
            expected[layout] = measure(Qwen2VLProcessor(image_processor=ip, tokenizer=tok, chat_template=tok.chat_template,
                                                        video_processor=Qwen2VLVideoProcessor()))
        except Exception as e:   # a layout this transformers rejects: say so, the test skips it
            expected[layout] = {"error": f"{type(e).__name__}: {e}"}
expected["default"] = measure(Qwen2VLProcessor(image_processor=Qwen2VLImageProcessorPil(), tokenizer=tok,
                                               chat_template=tok.chat_template, video_processor=Qwen2VLVideoProcessor()))
with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(expected, f, indent=1)
with open(os.path.join(OUT, "expected.tsv"), "w") as f:   # the same, for the shell test
    f.write("# layout\tmin_pixels\tmax_pixels\tprompt_tokens\tloss\n")
    for k in ("v5", "both", "legacy", "sizemp", "default"):
        e = expected[k]
        if "error" not in e:
            f.write(f"{k}\t{e['min_pixels']}\t{e['max_pixels']}\t{e['prompt_tokens']}\t{e['loss']:.7g}\n")
print(json.dumps(expected, indent=1))
