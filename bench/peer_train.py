"""PyTorch peer for bench_train.c: transformers' Qwen2ForCausalLM at the language-model
shapes of Qwen2-VL-2B (hidden 1536, MLP 8960, 12/2 heads, vocab 151936, tied embeddings),
2 layers, one row of 256 tokens, fp32, torch.optim.AdamW + clip_grad_norm_(1.0); the same
thread count. Each case (recompute off / on = gradient checkpointing) runs in a fresh
process so peak RSS is per case.

Qwen2-VL cases (train_qwen2vl2b_v2l2_448px_T512_*): transformers' Qwen2VLForConditionalGeneration
at Qwen2-VL-2B shapes with 2 vision blocks and 2 decoder layers, one row of 512 tokens with one
448x448 image (1024 patches -> 256 image tokens; the same ids, labels and pixel values as
bench_train.c builds), fp32 + torch.optim.AdamW + clip_grad_norm_(1.0): full training, gradient
checkpointing, PEFT LoRA r=16 on the 7 LM projections, and QLoRA (those projections as
bitsandbytes Linear4bit NF4 with double quant, then the same PEFT LoRA).
MMC_BENCH_TRAIN_CASES=lm|vl|all (default all); MMC_BENCH_TRAIN_VL_MODES=full,recompute,lora,qlora
picks VL cases, as in bench_train.c. Every case times MMC_BENCH_TRAIN{,_VL}_STEPS
(default 5) steps after one warm-up step and reports the median, as bench_train.c; memory is
peak RSS minus the RSS after the imports, before the model (_peak_mem, peer_util.mem_baseline),
and that baseline (_rss_baseline)."""
import json, multiprocessing as mp, os, statistics, sys, time
import torch

LAYERS, SEQ = 2, 256


def median_step(step, env):
    """One warm-up step, then the median of MMC_BENCH_TRAIN{,_VL}_STEPS (default 5) timed steps."""
    step()
    ts = []
    for _ in range(max(1, int(os.environ.get(env, "5")))):
        t0 = time.perf_counter(); step(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def report_mem(prefix, base):
    from peer_util import peak_rss_mib
    print(json.dumps({"name": f"{prefix}_peak_mem", "peer": peak_rss_mib() - base, "unit": "MiB", "better": "lower"}))
    print(json.dumps({"name": f"{prefix}_rss_baseline", "peer": base, "unit": "MiB", "better": "none"}))


def case(recompute):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from peer_util import mem_baseline
    torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))
    torch.manual_seed(0)
    base = mem_baseline()
    cfg = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
                      num_hidden_layers=LAYERS, vocab_size=151936, rms_norm_eps=1e-6, rope_theta=1e6,
                      max_position_embeddings=32768, tie_word_embeddings=True, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(cfg).float().train()
    if recompute:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    ids = torch.randint(0, 151936, (1, SEQ))
    def step():
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    med = median_step(step, "MMC_BENCH_TRAIN_STEPS")
    tag = "_recompute" if recompute else ""
    print(json.dumps({"name": f"train_qwen2vl2b_lm_{LAYERS}layers_T{SEQ}{tag}_tokens_per_s", "peer": SEQ / med,
                      "unit": "tokens/s", "better": "higher"}))
    report_mem(f"train_qwen2vl2b_lm_{LAYERS}layers_T{SEQ}{tag}", base)
    sys.stdout.flush()


VL_SEQ, VL_GRID, IMG, VS, VE = 512, 32, 151655, 151652, 151653
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def vl_batch():
    """The batch of bench_train.c's write_vl_batch (same LCG ids, labels after the image, pixels)."""
    ids, x = [], 12345
    for _ in range(VL_SEQ):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        ids.append((x >> 33) % 150000)
    n_img = VL_GRID * VL_GRID // 4
    ids[5] = VS
    ids[6:6 + n_img] = [IMG] * n_img
    ids[6 + n_img] = VE
    labels = [t if i > 6 + n_img else -100 for i, t in enumerate(ids)]
    n = VL_GRID * VL_GRID * 3 * 2 * 14 * 14
    px = ((torch.arange(n, dtype=torch.int64) * 7919) % 2001).float() / 1000.0 - 1.0
    return (torch.tensor([ids]), torch.tensor([labels]), px.reshape(VL_GRID * VL_GRID, -1),
            torch.tensor([[1, VL_GRID, VL_GRID]]))


def to_nf4(model):
    import bitsandbytes as bnb
    for layer in model.model.language_model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in LORA_TARGETS:
                lin = getattr(parent, name, None)
                if lin is None:
                    continue
                q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                      compute_dtype=torch.float32, quant_type="nf4", compress_statistics=True)
                q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4",
                                             compress_statistics=True)
                if lin.bias is not None:
                    q.bias = torch.nn.Parameter(lin.bias.data, requires_grad=False)
                setattr(parent, name, q.to("cpu"))
                del lin


def vl_case(mode):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from peer_util import mem_baseline
    if mode in ("lora", "qlora"):
        import peft  # noqa: F401  (an import: before the baseline)
    if mode == "qlora":
        import bitsandbytes  # noqa: F401
    torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))
    torch.manual_seed(0)
    base = mem_baseline()
    cfg = Qwen2VLConfig(
        vision_config=dict(depth=2, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, in_channels=3, hidden_act="quick_gelu"),
        text_config=dict(hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=151936, rms_norm_eps=1e-6, max_position_embeddings=32768,
                         rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}),
        image_token_id=IMG, video_token_id=151656, vision_start_token_id=VS, vision_end_token_id=VE,
        tie_word_embeddings=True, attn_implementation="sdpa")
    model = Qwen2VLForConditionalGeneration(cfg).float().train()
    if mode == "recompute":
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if mode in ("lora", "qlora"):
        from peft import LoraConfig, get_peft_model
        if mode == "qlora":
            to_nf4(model)
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules=r".*language_model.*\.(" + "|".join(LORA_TARGETS) + ")"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01)
    ids, labels, px, grid = vl_batch()
    mm = (ids == IMG).int()
    def step():
        opt.zero_grad()
        loss = model(input_ids=ids, labels=labels, pixel_values=px, image_grid_thw=grid, mm_token_type_ids=mm,
                     use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    med = median_step(step, "MMC_BENCH_TRAIN_VL_STEPS")
    tag = "" if mode == "full" else "_" + mode
    print(json.dumps({"name": f"train_qwen2vl2b_v2l2_448px_T{VL_SEQ}{tag}_tokens_per_s", "peer": VL_SEQ / med,
                      "unit": "tokens/s", "better": "higher"}))
    report_mem(f"train_qwen2vl2b_v2l2_448px_T{VL_SEQ}{tag}", base)
    sys.stdout.flush()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    cases = os.environ.get("MMC_BENCH_TRAIN_CASES", "all")
    if cases != "lm":
        modes = os.environ.get("MMC_BENCH_TRAIN_VL_MODES", "full,recompute,lora,qlora").split(",")   # as bench_train.c
        for m in ("full", "recompute", "lora", "qlora"):
            if m not in modes:
                continue
            p = ctx.Process(target=vl_case, args=(m,)); p.start(); p.join()
    if cases != "vl":
        for r in (False, True):
            p = ctx.Process(target=case, args=(r,)); p.start(); p.join()
