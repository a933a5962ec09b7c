# l8_run.sh — sourced by bench_pp.sh and bench_overlap.sh: write_l8_run DIR writes DIR/l8.json (the
# tiny Qwen2 fixture widened to hidden 256, intermediate 512, 8 layers) and DIR/run.yaml (5 steps of
# 8 synthetic sequences of 128 tokens, micro-batches of 1) that both time under `mmc launch -n 2`.
write_l8_run() {
  sed -e 's/"hidden_size": 64/"hidden_size": 256/' -e 's/"intermediate_size": 160/"intermediate_size": 512/' \
      -e 's/"num_hidden_layers": 2/"num_hidden_layers": 8/' tests/fixtures/qwen2/tiny/config.json >"$1/l8.json"
  cat >"$1/run.yaml" <<YAML
model: {init: $1/l8.json, dtype: f32}
data: {train: synthetic, seq_len: 128, batch_size: 8, micro_batch_size: 1}
optimizer: {type: adamw, lr: 1.0e-3, schedule: constant}
training: {steps: 5, seed: 7, log_every: 1, save_every: 0, keep_last: 1, output_dir: $1/out}
YAML
}
