"""Helpers shared by the fixture generators of tools/ref (import it; it has no side effects)."""
import contextlib

import torch


@contextlib.contextmanager
def float64_throughout():
    """transformers upcasts to float32 inside RMSNorm, softmax and rotary embeddings; in a float64
    reference run those casts would round it to float32: while active, float64 tensors stay float64
    through .float(), .to(torch.float32) and softmax(dtype=torch.float32)."""
    T, F = torch.Tensor, torch.nn.functional
    saved = (T.float, T.to, F.softmax)

    def to_float(t, *a, **k):
        return t if t.dtype == torch.float64 else saved[0](t, *a, **k)

    def to(t, *a, **k):
        if t.dtype == torch.float64:
            a = tuple(torch.float64 if x is torch.float32 else x for x in a)
            if k.get("dtype") is torch.float32:
                k["dtype"] = torch.float64
        return saved[1](t, *a, **k)

    def softmax(x, *a, **k):
        if x.dtype == torch.float64 and k.get("dtype") is torch.float32:
            k["dtype"] = torch.float64
        return saved[2](x, *a, **k)

    T.float, T.to, F.softmax = to_float, to, softmax
    try:
        yield
    finally:
        T.float, T.to, F.softmax = saved


def rand_init(model, seed):
    """Random weights of a usable scale (default init leaves GroupNorm at 1/0 and biases 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)


def tiny_tokenizers(tmp, words, **clip_kwargs):
    """A CLIP BPE tokenizer and a T5 (SentencePiece Unigram, Metaspace) tokenizer over a few words and the
    alphabet, built in tmp: what the tiny diffusion pipelines' tokenizer folders hold. Returns (clip, t5,
    clip vocab size, t5 vocab size)."""
    import json
    import os
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import CLIPTokenizer, T5TokenizerFast

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for wd in words:
        vocab[wd + "</w>"] = len(vocab)
    for ch in "abcdefghijklmnopqrstuvwxyz":
        vocab.setdefault(ch, len(vocab))
        vocab.setdefault(ch + "</w>", len(vocab))
    with open(os.path.join(tmp, "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(tmp, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    clip = CLIPTokenizer(os.path.join(tmp, "vocab.json"), os.path.join(tmp, "merges.txt"), model_max_length=77,
                         **clip_kwargs)
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -3.0)]
    pieces += [("\u2581" + wd, -1.0 - 0.1 * i) for i, wd in enumerate(words)]
    pieces += [(ch, -5.0) for ch in "abcdefghijklmnopqrstuvwxyz"]
    uni = Tokenizer(models.Unigram(pieces, unk_id=2))
    uni.pre_tokenizer = pre_tokenizers.Metaspace()
    t5 = T5TokenizerFast(tokenizer_object=uni, extra_ids=0, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    return clip, t5, len(vocab), len(pieces)


def ddpm_loss(sched, pred, x0, noise, timesteps, snr_gamma):
    """The loss of diffusers' train_text_to_image(_lora)(_sdxl).py on a DDPMScheduler: the target of its
    prediction_type (noise or get_velocity), F.mse_loss, or with snr_gamma the min-SNR weighted per-sample means
    (compute_snr; min(snr, gamma) / snr for epsilon, / (snr + 1) for v_prediction)."""
    import torch.nn.functional as F
    from diffusers.training_utils import compute_snr
    if sched.config.prediction_type == "epsilon":
        target = noise
    elif sched.config.prediction_type == "v_prediction":
        target = sched.get_velocity(x0, noise, timesteps)
    else:
        raise ValueError(sched.config.prediction_type)
    if snr_gamma is None:
        return F.mse_loss(pred.float(), target.float(), reduction="mean")
    snr = compute_snr(sched, timesteps)
    mse_loss_weights = torch.stack([snr, snr_gamma * torch.ones_like(timesteps)], dim=1).min(dim=1)[0]
    if sched.config.prediction_type == "epsilon":
        mse_loss_weights = mse_loss_weights / snr
    elif sched.config.prediction_type == "v_prediction":
        mse_loss_weights = mse_loss_weights / (snr + 1)
    loss = F.mse_loss(pred.float(), target.float(), reduction="none")
    loss = loss.mean(dim=list(range(1, len(loss.shape)))) * mse_loss_weights
    return loss.mean()


def lora_with_random_b(base, target_modules, r=4, alpha=8, std=0.02):
    """PEFT LoRA on base with lora_B drawn from N(0, std) instead of PEFT's zeros (zero B leaves
    lora_A's gradient zero at the first step, so a parity test would not check it)."""
    from peft import LoraConfig, get_peft_model
    pm = get_peft_model(base, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_modules))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, std)
    return pm


def save_adapter_rel(pm, out_dir, base_rel):
    """pm.save_pretrained(out_dir) with base_model_name_or_path rewritten to base_rel (a path
    relative to the repository root, so mmc finds the base from a checkout)."""
    import json
    import os
    pm.save_pretrained(out_dir)
    c = os.path.join(out_dir, "adapter_config.json")
    j = json.load(open(c))
    j["base_model_name_or_path"] = base_rel
    json.dump(j, open(c, "w"), indent=2)
