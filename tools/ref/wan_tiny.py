"""wan_tiny.py — the tiny Wan2.1 pipeline parts gen_wan.py, gen_wan_i2v.py and gen_wan_flf2v.py share (imported,
not run): the SentencePiece-Unigram tokenizer over a few words, a 2-layer UMT5EncoderModel with a per-layer
relative bias, a 4-level AutoencoderKLWan with z_dim 4 and set latents_mean / latents_std, the image-to-video
CLIP image encoder / processor and I2V transformer, each randomised with its own seed (rand_init), so the
generators build the same components."""
import os
import shutil

from diffusers import AutoencoderKLWan, WanTransformer3DModel
from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel

from ref_common import rand_init, tiny_tokenizers

TEXT_DIM = 16
WORDS = ["a", "red", "blue", "green", "cat", "dog", "walks", "runs", "on", "the", "beach", "grass", "slowly"]
SCHED = dict(num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
             solver_order=2, solver_type="bh2", lower_order_final=True, predict_x0=True)


def text_parts(scratch):
    """(tokenizer, UMT5 encoder) built in the scratch folder scratch/_tok (removed afterwards)."""
    tmp = os.path.join(scratch, "_tok")
    os.makedirs(tmp)
    _, tok, _, n_pieces = tiny_tokenizers(tmp, WORDS)
    shutil.rmtree(tmp)
    te = UMT5EncoderModel(UMT5Config(vocab_size=n_pieces, d_model=TEXT_DIM, d_kv=8, d_ff=24, num_layers=2,
                                     num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                                     feed_forward_proj="gated-gelu"))
    rand_init(te, 3)
    return tok, te.eval()


def vae():
    v = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 2, 2], num_res_blocks=1, attn_scales=[],
                         temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.3, 0.05],
                         latents_std=[1.5, 0.8, 2.0, 1.1])
    rand_init(v, 4)
    return v.eval()


def clip_parts():
    """(CLIPVisionModel, CLIPImageProcessor): 3 layers, 32 px in patches of 8 (17 states of width 12)."""
    enc = CLIPVisionModel(CLIPVisionConfig(hidden_size=12, intermediate_size=24, num_hidden_layers=3,
                                           num_attention_heads=2, image_size=32, patch_size=8, projection_dim=12))
    rand_init(enc, 7)
    proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    return enc.eval(), proc


def i2v_transformer(seed, **extra):
    """An I2V WanTransformer3DModel (image_dim 12, added_kv_proj_dim 24, in_channels 4 + 4 + 4, out 4)."""
    tr = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=12,
                               out_channels=4, text_dim=TEXT_DIM, freq_dim=16, ffn_dim=32, num_layers=2,
                               cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32,
                               image_dim=12, added_kv_proj_dim=24, **extra)
    rand_init(tr, seed)
    return tr.eval()
