"""Fixtures for HunyuanDiT2DModel (tests/test_hunyuan.c), written by diffusers itself (the version pinned in
requirements.txt), save_pretrained untouched:

* hunyuan/v11/: HunyuanDiT v1.1-shaped (use_style_cond_and_image_meta_size true: image-size and style
  conditioning), 2 heads of 8 (inner 16), 6 blocks (blocks 4 and 5 take the long skips of blocks 1 and 0,
  popped last-in first-out), patch 2, in_channels 4 (learn_sigma: 8 out channels), cross_attention_dim 12,
  cross_attention_dim_t5 16 (the attention pooler's 8 heads of 2), text_len 5, text_len_t5 7, f32.
  Latents [2, 4, 8, 6] (4 x 3 patches).
* hunyuan/v12/: v1.2-shaped (no size / style conditioning), 4 blocks (block 3 takes block 0's skip),
  latents [2, 4, 6, 6].
* hunyuan/v11_bf16/: v1.1-shaped, 2 blocks, weights stored bf16 (the padding rows and the pooler's positions
  too); the expected output is diffusers running it upcast to f32.

expected.safetensors per model: hidden, timestep [B], encoder [B, text_len, cross], mask [B, text_len]
(int32, with padding so text_embedding_padding is read), encoder_t5, mask_t5, image_meta_size [B, 6] and
style [B] (v11), rope_cos / rope_sin [S, head_dim] as HunyuanDiTPipeline builds them
(get_2d_rotary_pos_embed over get_resize_crop_region_for_grid with base_size 512 // 8 // patch_size),
and out [B, 2 * in_channels, H, W].

Run: .venv-ref/bin/python tools/ref/gen_hunyuan.py
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
from diffusers import HunyuanDiT2DModel
from diffusers.models.embeddings import get_2d_rotary_pos_embed
from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

from ref_common import rand_init

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "hunyuan")

torch.set_num_threads(2)
shutil.rmtree(OUT, ignore_errors=True)
os.makedirs(OUT)
g = torch.Generator().manual_seed(0)


def case(name, cfg, seed, H, W, dtype=torch.float32):
    tr = HunyuanDiT2DModel(**cfg)
    rand_init(tr, seed)
    d = os.path.join(OUT, name)
    tr.to(dtype).save_pretrained(d)
    tr = HunyuanDiT2DModel.from_pretrained(d, torch_dtype=torch.float32).eval()
    B, L, L5 = 2, cfg["text_len"], cfg["text_len_t5"]
    mask = torch.ones(B, L, dtype=torch.int32)
    mask[0, 3:] = 0
    mask[1, 4:] = 0
    mask5 = torch.ones(B, L5, dtype=torch.int32)
    mask5[0, 2:] = 0
    inp = {
        "hidden": torch.randn(B, cfg["in_channels"], H, W, generator=g),
        "timestep": torch.tensor([999.0, 37.0]),
        "encoder": torch.randn(B, L, cfg["cross_attention_dim"], generator=g),
        "mask": mask,
        "encoder_t5": torch.randn(B, L5, cfg["cross_attention_dim_t5"], generator=g),
        "mask_t5": mask5,
        "image_meta_size": torch.tensor([[1024.0, 1024.0, 1024.0, 1024.0, 0.0, 0.0],
                                         [768.0, 512.0, 640.0, 448.0, 16.0, 8.0]]),
        "style": torch.tensor([0, 0], dtype=torch.int64),
    }
    p = cfg["patch_size"]
    gh, gw = H // p, W // p
    base = 512 // 8 // p
    crops = get_resize_crop_region_for_grid((gh, gw), base)
    cos, sin = get_2d_rotary_pos_embed(cfg["attention_head_dim"], crops, (gh, gw))
    inp["rope_cos"], inp["rope_sin"] = cos, sin
    with torch.no_grad():
        inp["out"] = tr(hidden_states=inp["hidden"], timestep=inp["timestep"], encoder_hidden_states=inp["encoder"],
                        text_embedding_mask=inp["mask"], encoder_hidden_states_t5=inp["encoder_t5"],
                        text_embedding_mask_t5=inp["mask_t5"], image_meta_size=inp["image_meta_size"],
                        style=inp["style"], image_rotary_emb=(cos, sin), return_dict=False)[0]
    save_file({k: v.contiguous() for k, v in inp.items()}, os.path.join(d, "expected.safetensors"))


base_cfg = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=8,
                hidden_size=16, mlp_ratio=2.5, cross_attention_dim=12, cross_attention_dim_t5=16,
                pooled_projection_dim=10, text_len=5, text_len_t5=7)
case("v11", dict(base_cfg, num_layers=6, use_style_cond_and_image_meta_size=True), 1, 8, 6)
case("v12", dict(base_cfg, num_layers=4, use_style_cond_and_image_meta_size=False), 2, 6, 6)
case("v11_bf16", dict(base_cfg, num_layers=2, use_style_cond_and_image_meta_size=True), 4, 4, 6, torch.bfloat16)
print("hunyuan fixtures (diffusers %s) in %s" % (diffusers.__version__, OUT))


# ---- the first text encoder: a tiny BertModel (Chinese-BERT layout) and its BertTokenizer
def bert_case():
    from transformers import BertConfig, BertModel, BertTokenizer
    import tempfile

    chars = list("一个可爱的小猫坐在红色沙发上，画风写实。狗天空")
    words = ["a", "cute", "cat", "on", "the", "red", "sofa", "photo", "##s", "##ing", "dog", "sit", "painting", "of"]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + words + list(",.!?") + ["##" + c for c in "st"]
    vocab += list("abcdefghijklmnopqrstuvwxyz")
    seen, uniq = set(), []
    for v in vocab:
        if v not in seen:
            seen.add(v)
            uniq.append(v)
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "vocab.txt"), "w") as f:
        f.write("\n".join(uniq) + "\n")
    tok = BertTokenizer(os.path.join(tmp, "vocab.txt"), model_max_length=77)
    # the Hub's older layout of the same tokenizer (HunyuanDiT's own tokenizer/ folder): vocab.txt and a
    # tokenizer_config.json without tokenizer.json
    os.makedirs(os.path.join(OUT, "tokenizer_vocab"))
    shutil.copy(os.path.join(tmp, "vocab.txt"), os.path.join(OUT, "tokenizer_vocab", "vocab.txt"))
    with open(os.path.join(OUT, "tokenizer_vocab", "tokenizer_config.json"), "w") as f:
        f.write('{"do_lower_case": true, "model_max_length": 77, "tokenizer_class": "BertTokenizer"}\n')
    assert BertTokenizer.from_pretrained(os.path.join(OUT, "tokenizer_vocab"))("Ünknown 狗, x").input_ids == \
        tok("Ünknown 狗, x").input_ids
    tok.save_pretrained(os.path.join(OUT, "tokenizer"))
    tok = BertTokenizer.from_pretrained(os.path.join(OUT, "tokenizer"))
    cfg = BertConfig(vocab_size=len(uniq), hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=20, max_position_embeddings=16, type_vocab_size=2)
    torch.manual_seed(3)
    bert = BertModel(cfg)
    rand_init(bert, 3)
    bert.eval()
    bert.save_pretrained(os.path.join(OUT, "text_encoder"))
    texts = ["一个可爱的小猫坐在红色沙发上，画风写实。", "A cute cat sitting on the RED sofa, photos!",
             "Ünknown wörds: 狗 in the sky?? dogs", "", "  painting\tof\na  dog  "]
    exp = {}
    for i, t in enumerate(texts):
        ids = tok(t, padding="max_length", max_length=16, truncation=True, return_attention_mask=True,
                  return_tensors="pt")
        exp["ids_%d" % i] = ids.input_ids[0].to(torch.int32)
        exp["mask_%d" % i] = ids.attention_mask[0].to(torch.int32)
        os.makedirs(os.path.join(OUT, "prompts"), exist_ok=True)
        with open(os.path.join(OUT, "prompts", "text_%d.txt" % i), "w") as f:
            f.write(t)
    ids = torch.stack([exp["ids_0"], exp["ids_1"]]).long()
    mask = torch.stack([exp["mask_0"], exp["mask_1"]]).long()
    with torch.no_grad():
        exp["hidden"] = bert(input_ids=ids, attention_mask=mask)[0]
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "text_encoder", "expected.safetensors"))


bert_case()
print("bert fixtures in %s" % OUT)


# ---- the whole HunyuanDiTPipeline (pipe/): the BERT above, a T5EncoderModel in MT5's layout (gated-gelu,
# untied), the Unigram T5 tokenizer, a v1.1 transformer with the pipeline's fixed lengths (77 / 256), a
# 4-level AutoencoderKL (vae scale 8: the pipeline's rotary grid is height // 8 // patch whatever the VAE),
# DDPMScheduler as HunyuanDiT ships it (v_prediction, scaled_linear 0.00085 .. 0.03, steps_offset 1); runs at
# 64 x 48 with use_resolution_binning=False (binning maps any size to one of the 1024-class shapes)
def pipe_case():
    from diffusers import AutoencoderKL, DDPMScheduler, HunyuanDiTPipeline
    from transformers import BertModel, BertTokenizer, T5Config, T5EncoderModel
    from ref_common import tiny_tokenizers
    import tempfile

    tmp = tempfile.mkdtemp()
    _, t5_tok, _, n_pieces = tiny_tokenizers(tmp, ["a", "cute", "cat", "red", "sofa", "photo", "of", "the", "on"])
    bert = BertModel.from_pretrained(os.path.join(OUT, "text_encoder"))
    tok = BertTokenizer.from_pretrained(os.path.join(OUT, "tokenizer"))
    # max_position_embeddings 77: the pipeline pads BERT prompts to 77
    from transformers import BertConfig
    cfg = BertConfig(vocab_size=bert.config.vocab_size, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                     intermediate_size=20, max_position_embeddings=77)
    bert = BertModel(cfg)
    rand_init(bert, 11)
    t5 = T5EncoderModel(T5Config(vocab_size=n_pieces, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=2,
                                 feed_forward_proj="gated-gelu", tie_word_embeddings=False))
    rand_init(t5, 12)
    tr = HunyuanDiT2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2, sample_size=8,
                           hidden_size=16, num_layers=4, mlp_ratio=2.0, cross_attention_dim=12,
                           cross_attention_dim_t5=16, pooled_projection_dim=10, text_len=77, text_len_t5=256,
                           use_style_cond_and_image_meta_size=True)
    rand_init(tr, 13)
    vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                        block_out_channels=(4, 4, 4, 4), layers_per_block=1, latent_channels=4, norm_num_groups=2,
                        sample_size=64, scaling_factor=0.13025)
    rand_init(vae, 14)
    sched = DDPMScheduler(num_train_timesteps=1000, beta_start=0.00085, beta_end=0.03, beta_schedule="scaled_linear",
                          prediction_type="v_prediction", clip_sample=False, steps_offset=1, timestep_spacing="leading")
    pipe = HunyuanDiTPipeline(vae=vae.eval(), text_encoder=bert.eval(), tokenizer=tok, transformer=tr.eval(),
                              scheduler=sched, safety_checker=None, feature_extractor=None,
                              requires_safety_checker=False, text_encoder_2=t5.eval(), tokenizer_2=t5_tok)
    d = os.path.join(OUT, "pipe")
    pipe.save_pretrained(d)
    shutil.rmtree(tmp)
    pipe = HunyuanDiTPipeline.from_pretrained(d, torch_dtype=torch.float32)
    exp = {}
    prompts = ["一个可爱的小猫坐在红色沙发上", "a photo of the cute cat"]
    H, W = 64, 48
    # DDPMScheduler.step draws variance noise (randn_tensor(model_output.shape, generator)) at every t > 0;
    # with a seeded generator and injected latents those are its only draws: recorded as noise_* [steps, B, C, h, w]
    def draws(seed, n, shape):
        gg = torch.Generator().manual_seed(seed)
        return torch.stack([torch.randn(shape, generator=gg) for _ in range(n)])

    gen = lambda seed: torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lat = torch.randn(2, 4, H // 8, W // 8, generator=g)
        exp["latents_a"] = lat
        exp["noise_a"] = draws(100, 3, lat.shape)
        kw = dict(prompt=prompts, negative_prompt=["", "red"], height=H, width=W, num_inference_steps=3,
                  guidance_scale=5.0, latents=lat, use_resolution_binning=False)
        exp["out_a_latent"] = pipe(**kw, output_type="latent", generator=gen(100)).images
        exp["out_a_image"] = pipe(**kw, output_type="pt", generator=gen(100)).images
        lat = torch.randn(1, 4, H // 8, W // 8, generator=g)
        exp["latents_b"] = lat
        exp["noise_b"] = draws(101, 2, lat.shape)
        exp["out_b_image"] = pipe(prompt=prompts[1], height=H, width=W, num_inference_steps=2, guidance_scale=1.0,
                                  latents=lat, output_type="pt", use_resolution_binning=False,
                                  generator=gen(101)).images
        # guidance_rescale 0.7 (rescale_noise_cfg), 2 steps, from latents_a
        exp["noise_c"] = draws(102, 2, exp["latents_a"].shape)
        exp["out_c_latent"] = pipe(prompt=prompts, height=H, width=W, num_inference_steps=2, guidance_scale=4.0,
                                   guidance_rescale=0.7, latents=exp["latents_a"], output_type="latent",
                                   use_resolution_binning=False, generator=gen(102)).images
        # trailing spacing (previous_timestep: the next entry of the schedule, not t - T // n), 3 steps, no CFG
        tsched = DDPMScheduler.from_config(pipe.scheduler.config, timestep_spacing="trailing")
        tsched.save_config(os.path.join(OUT, "scheduler_trailing"))
        pipe.scheduler = tsched
        exp["noise_d"] = draws(103, 3, exp["latents_b"].shape)
        exp["out_d_latent"] = pipe(prompt=prompts[1], height=H, width=W, num_inference_steps=3, guidance_scale=1.0,
                                   latents=exp["latents_b"], output_type="latent", use_resolution_binning=False,
                                   generator=gen(103)).images
        pipe.scheduler = DDPMScheduler.from_pretrained(d, subfolder="scheduler")
        # the CLI check (tests/test_hunyuan_cli.sh): one step, whose DDPM variance noise is scaled by
        # sqrt(1e-20) (alpha_prod_t_prev = 1 at the last step), so mmc's own draws give diffusers' image
        lat = torch.randn(1, 4, H // 8, W // 8, generator=g)
        save_file({"latents": lat}, os.path.join(d, "cli_latents.safetensors"))
        pipe(prompt="a red sofa", negative_prompt="cat", height=H, width=W, num_inference_steps=1, guidance_scale=5.0,
             latents=lat, use_resolution_binning=False).images[0].save(os.path.join(d, "cli_expected.png"))
        # the prompt encodings
        pe, npe, pm, npm = pipe.encode_prompt(prompts, device="cpu", dtype=torch.float32, num_images_per_prompt=1,
                                              do_classifier_free_guidance=True, negative_prompt=["", "red"],
                                              max_sequence_length=77, text_encoder_index=0)
        pe2, npe2, pm2, npm2 = pipe.encode_prompt(prompts, device="cpu", dtype=torch.float32, num_images_per_prompt=1,
                                                  do_classifier_free_guidance=True, negative_prompt=["", "red"],
                                                  max_sequence_length=256, text_encoder_index=1)
        exp.update(bert_embeds=pe, bert_neg=npe, bert_mask=pm.to(torch.int32), t5_embeds=pe2, t5_neg=npe2,
                   t5_mask=pm2.to(torch.int32), t5_neg_mask=npm2.to(torch.int32))
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(d, "expected.safetensors"))


pipe_case()
print("pipeline fixture in %s" % OUT)
