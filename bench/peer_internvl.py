"""PyTorch peer for bench_internvl.c: InternVL2.5-8B shapes in OpenGVLab's remote code, random weights:
InternVisionModel (InternViT-300M: hidden 1024, 16 heads, MLP 4096, LayerNorm, qkv bias; 448 px tiles) at 4 of
24 layers, InternVLChatModel's pixel shuffle (x0.5, ps_version v2) and mlp1 (LayerNorm, Linear, GELU, Linear),
and InternLM2ForCausalLM (internlm2_5-7b-chat's shapes: hidden 4096, 32 / 8 heads, MLP 14336, vocabulary 92553,
untied output, rope_theta 1e6, dynamic x2) at 2 of 32 layers, fp32, sdpa attention for InternLM2 (the remote
InternViT has no sdpa path: without flash-attn it runs its naive attention, as InternVL on a CPU does); same
thread count. The <IMG_CONTEXT> rows of the input embeddings are replaced by the tile's features, as
InternVLChatModel.forward / generate do.

Cases: image features of one tile, prefill of a 512-token prompt holding it (tower included; the output
projection applied to the last position only, as bench_internvl.c and generate in transformers 5 do — the
4.44 remote generate projects every position), single-token decode with the KV cache after it (tok/s and the
GB/s of decoder + output weights and KV cache read per token, as bench_internvl.c counts them), peak memory
(peak RSS minus the RSS after the imports). Training (each mode in a spawned process, before the inference
cases): zero_grad, InternVLChatModel's training forward (tower frozen: requires_grad False, no graph through it;
features spliced into the embeddings), InternLM2ForCausalLM's loss over the 248 text tokens after the tile,
backward, clip_grad_norm_(1.0), AdamW(lr 1e-5, wd 0.01), on a 512-token row, LM at 1 of 32 layers: "lora" (PEFT
LoRA r=16 alpha 32 on the language model's attention.wqkv / attention.wo / feed_forward.w1 / w2 / w3, InternLM2's
names for the projections bench_internvl.c adapts; default) and "full" (mlp1 + language model;
MMC_BENCH_VLM7B_TRAIN=full,lora); MMC_BENCH_VLM7B_TRAIN_STEPS (default 3) timed steps after one warm-up, median.

The remote code needs transformers 4.44.2 (transformers 5 cannot run it): this script re-runs itself with the
venv of tools/ref/gen_internvl_internlm2.py (MMC_BENCH_INTERNLM2_VENV, default .venv-internlm2 at the
repository root; made as that script's docstring says, plus `pip install --no-deps timm==1.0.31`, which the
remote InternViT imports for DropPath), and reports nothing (a note on stderr) where that venv is missing."""
import importlib.util
import os
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VENV = os.environ.get("MMC_BENCH_INTERNLM2_VENV", os.path.join(ROOT, ".venv-internlm2"))
import transformers  # noqa: E402

if transformers.__version__ != "4.44.2":
    py = os.path.join(VENV, "bin", "python")
    if os.environ.get("MMC_BENCH_INTERNVL_REEXEC") or not os.path.exists(py):
        sys.stderr.write(f"peer_internvl: no transformers 4.44.2 venv at {VENV} (see this script's docstring); "
                         "InternVL peer skipped\n")
        sys.exit(0)
    os.environ["MMC_BENCH_INTERNVL_REEXEC"] = "1"
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])

import torch  # noqa: E402

spec = importlib.util.find_spec("xtuner")
if spec is None:
    sys.exit("peer_internvl: xtuner is not installed in this venv (tools/ref/gen_internvl_internlm2.py's docstring)")
sys.path.insert(0, os.path.join(os.path.dirname(spec.origin), "_lite", "modelings"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_util import mem_baseline, median_time, peak_rss_mib, report, run_train_modes, time_train_steps  # noqa: E402

IMG_CONTEXT = 92546
LORA_RE = r".*layers\.\d+\.(attention\.(wqkv|wo)|feed_forward\.(w1|w2|w3))"   # PEFT on the InternLM2 model


class InternVL(torch.nn.Module):
    """InternVLChatModel's computation (extract_feature, pixel_shuffle v2, mlp1, the splice) on the remote
    InternVisionModel and InternLM2ForCausalLM."""

    def __init__(self, lm_layers):
        super().__init__()
        from internlm2 import InternLM2Config, InternLM2ForCausalLM
        from internvl2 import InternVisionModel
        from internvl2.configuration_intern_vit import InternVisionConfig
        vc = InternVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16,
                                image_size=448, patch_size=14, qkv_bias=True, qk_normalization=False,
                                norm_type="layer_norm", layer_norm_eps=1e-6, hidden_act="gelu", use_flash_attn=False,
                                drop_path_rate=0.0)
        lc = InternLM2Config(vocab_size=92553, hidden_size=4096, intermediate_size=14336, num_hidden_layers=lm_layers,
                             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                             rms_norm_eps=1e-5, bias=False, rope_theta=1000000,
                             rope_scaling={"type": "dynamic", "factor": 2.0}, tie_word_embeddings=False,
                             attn_implementation="sdpa")
        self.vision_model = InternVisionModel(vc)
        self.language_model = InternLM2ForCausalLM(lc)
        vit, llm = 1024, 4096
        self.mlp1 = torch.nn.Sequential(torch.nn.LayerNorm(vit * 4), torch.nn.Linear(vit * 4, llm), torch.nn.GELU(),
                                        torch.nn.Linear(llm, llm))

    @staticmethod
    def pixel_shuffle(x, r=0.5):
        n, w, h, c = x.size()
        x = x.view(n, w, int(h * r), int(c / r)).permute(0, 2, 1, 3).contiguous()
        x = x.view(n, int(h * r), int(w * r), int(c / (r * r)))
        return x.permute(0, 2, 1, 3).contiguous()   # ps_version v2

    def extract_feature(self, px):
        v = self.vision_model(pixel_values=px, output_hidden_states=False, return_dict=True).last_hidden_state
        v = v[:, 1:, :]
        h = w = int(v.shape[1] ** 0.5)
        v = self.pixel_shuffle(v.reshape(v.shape[0], h, w, -1))
        return self.mlp1(v.reshape(v.shape[0], -1, v.shape[-1]))

    def embeds(self, ids, px):
        e = self.language_model.get_input_embeddings()(ids)
        if px is not None:
            f = self.extract_feature(px)
            e = e.clone()
            e[ids == IMG_CONTEXT] = f.reshape(-1, e.shape[-1]).to(e.dtype)
        return e


def prompt(T):
    ids = torch.randint(0, 92000, (1, T))
    ids[0, 8:8 + 256] = IMG_CONTEXT
    return ids


def train_case(mode):
    if mode == "lora":
        import peft  # noqa: F401  (an import: before the baseline)
    torch.manual_seed(0)
    base = mem_baseline()
    model = InternVL(1).float().train()
    model.vision_model.requires_grad_(False)
    lm = model.language_model
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        model.requires_grad_(False)
        lm = get_peft_model(lm, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LORA_RE))
    params = [p for p in model.parameters() if p.requires_grad] + \
        ([p for p in lm.parameters() if p.requires_grad] if mode == "lora" else [])
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01)
    T = 512
    ids = prompt(T)
    labels = torch.full_like(ids, -100)
    labels[0, 8 + 256:] = ids[0, 8 + 256:]
    px = torch.randn(1, 3, 448, 448)
    losses = []

    def step():
        opt.zero_grad()
        loss = lm(inputs_embeds=model.embeds(ids, px), labels=labels, use_cache=False).loss
        losses.append(float(loss))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    t_step = time_train_steps(step, T, f"internvl_8b_train_v4l1_T512_{mode}", base)
    sys.stderr.write(f"peer internvl train {mode}: {t_step:.2f} s/step, "
                     f"{sum(p.numel() for p in params) / 1e6:.1f}M trained, loss {losses[0]:.4f} -> {losses[-1]:.4f}\n")


def inference():
    from transformers import DynamicCache
    torch.manual_seed(0)
    base = mem_baseline()
    model = InternVL(2).float().eval()
    lm = model.language_model
    with torch.inference_mode():
        px = torch.randn(1, 3, 448, 448)
        sec = median_time(lambda: model.extract_feature(px), 3.0, 2)
        report("internvl_8b_image_features_vit300m_4of24_448px", 1.0 / sec, "img/s")
        T = 512
        ids = prompt(T)

        def prefill():
            cache = DynamicCache()
            h = lm.model(inputs_embeds=model.embeds(ids, px), past_key_values=cache, use_cache=True)
            return lm.output(h.last_hidden_state[:, -1:]), h.past_key_values

        sec = median_time(prefill, 5.0, 2)
        report("internvl_8b_prefill_internlm2_7b_2of32_image_T512", T / sec, "tok/s")
        logits, cache = prefill()
        tok = logits[:, -1].argmax(-1, keepdim=True)
        times = []
        for s in range(32):
            t0 = time.perf_counter()
            out = lm(input_ids=tok, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            times.append(time.perf_counter() - t0)
        times.sort()
        report("internvl_8b_decode_internlm2_7b_2of32_after512", 1.0 / times[16], "tok/s")
        lc = lm.config
        dec = sum(p.numel() * p.element_size() for n, p in lm.named_parameters() if "tok_embeddings" not in n)
        dec += 2 * lc.num_hidden_layers * (T + 16) * lc.num_key_value_heads * (lc.hidden_size // lc.num_attention_heads) * 4
        report("internvl_8b_decode_GBps", dec / times[16] / 1e9, "GB/s")
    report("internvl_8b_peak_mem_MiB", peak_rss_mib() - base, "MiB", False)


if __name__ == "__main__":
    run_train_modes(train_case, "lora")
    inference()
