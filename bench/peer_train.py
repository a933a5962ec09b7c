"""PyTorch peer for bench_train.c: transformers' Qwen2ForCausalLM at the language-model
shapes of Qwen2-VL-2B (hidden 1536, MLP 8960, 12/2 heads, vocab 151936, tied embeddings),
2 layers, one row of 256 tokens, fp32, torch.optim.AdamW + clip_grad_norm_(1.0); the same
thread count. Each case (recompute off / on = gradient checkpointing) runs in a fresh
process so peak RSS is per case."""
import json, multiprocessing as mp, os, resource, sys, time
import torch

LAYERS, SEQ = 2, 256


def case(recompute):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.set_num_threads(int(os.environ.get("MMC_BENCH_THREADS", "2")))
    torch.manual_seed(0)
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
    step()
    best = 1e30
    for _ in range(int(os.environ.get("MMC_BENCH_TRAIN_STEPS", "3"))):
        t0 = time.time(); step(); best = min(best, time.time() - t0)
    tag = "_recompute" if recompute else ""
    print(json.dumps({"name": f"train_qwen2vl2b_lm_{LAYERS}layers_T{SEQ}{tag}_tokens_per_s", "peer": SEQ / best,
                      "unit": "tokens/s", "better": "higher"}))
    print(json.dumps({"name": f"train_qwen2vl2b_lm_{LAYERS}layers_T{SEQ}{tag}_peak_rss",
                      "peer": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "unit": "MiB",
                      "better": "lower"}))
    sys.stdout.flush()


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    for r in (False, True):
        p = ctx.Process(target=case, args=(r,)); p.start(); p.join()
