"""bench_serve_gguf.py — converts the model bench_serve.sh serves (bench_serve_model's Qwen2ForCausalLM
directory: config.json, model.safetensors, the tiny Qwen2 fixture's tokenizer.json) to a GGUF file for
llama.cpp's server, with the `gguf` package's writer (pinned in bench/bench_serve_requirements.txt): architecture
qwen2, llama.cpp's tensor names, the weight matrices in f32, f16 or bf16 (norms and biases stay f32,
as llama.cpp's own converter leaves them), and the byte-level BPE vocabulary (tokens, types, merges,
the Qwen2 pre-tokenizer) so that both servers tokenize a prompt alike.
usage: bench_serve_gguf.py MODEL_DIR OUT.gguf f32|f16|bf16"""
import json
import sys

import gguf
import numpy as np
from safetensors.numpy import load_file

src, out, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = json.load(open(src + "/config.json"))
tok = json.load(open(src + "/tokenizer.json"))
tcfg = json.load(open(src + "/tokenizer_config.json"))
w = load_file(src + "/model.safetensors")

ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
         "bf16": gguf.LlamaFileType.MOSTLY_BF16}[dtype]
wr = gguf.GGUFWriter(out, "qwen2")
wr.add_name("bench-serve-qwen2")
wr.add_context_length(cfg["max_position_embeddings"])
wr.add_embedding_length(cfg["hidden_size"])
wr.add_block_count(cfg["num_hidden_layers"])
wr.add_feed_forward_length(cfg["intermediate_size"])
wr.add_head_count(cfg["num_attention_heads"])
wr.add_head_count_kv(cfg["num_key_value_heads"])
wr.add_rope_freq_base(cfg["rope_theta"])
wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
wr.add_file_type(ftype)

# vocabulary: the BPE model's tokens by id, then the added tokens; ids without a token are padding
V = cfg["vocab_size"]
tokens = ["[PAD%d]" % i for i in range(V)]
types = [gguf.TokenType.UNUSED] * V
for t, i in tok["model"]["vocab"].items():
    tokens[i], types[i] = t, gguf.TokenType.NORMAL
for a in tok["added_tokens"]:
    tokens[a["id"]] = a["content"]
    types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
ids = {t: i for i, t in enumerate(tokens)}
wr.add_tokenizer_model("gpt2")
wr.add_tokenizer_pre("qwen2")
wr.add_token_list(tokens)
wr.add_token_types(types)
wr.add_token_merges(merges)
wr.add_eos_token_id(ids[tcfg["eos_token"]])
wr.add_pad_token_id(ids.get(tcfg.get("pad_token") or "<|endoftext|>", ids[tcfg["eos_token"]]))
wr.add_add_bos_token(False)


def put(name, a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if a.ndim == 1 or dtype == "f32":
        wr.add_tensor(name, a)
    elif dtype == "f16":
        wr.add_tensor(name, a.astype(np.float16))
    else:   # bf16, round to nearest even, stored as its raw 16 bits
        b = a.view(np.uint32)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
        wr.add_tensor(name, b, raw_shape=a.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)


put("token_embd.weight", w["model.embed_tokens.weight"])
put("output_norm.weight", w["model.norm.weight"])
if not cfg.get("tie_word_embeddings") and "lm_head.weight" in w:
    put("output.weight", w["lm_head.weight"])
names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
         "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
         "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
         "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
for L in range(cfg["num_hidden_layers"]):
    for hf, gg in names.items():
        put("blk.%d.%s" % (L, gg), w["model.layers.%d.%s" % (L, hf)])
wr.write_header_to_file()
wr.write_kv_data_to_file()
wr.write_tensors_to_file()
wr.close()
