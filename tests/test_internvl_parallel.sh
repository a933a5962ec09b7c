#!/usr/bin/env bash
# test_internvl_parallel.sh — InternVL in transformers' layout (the tiny tests/fixtures/internvl/v5: an
# InternViT tower, a Qwen2 decoder of 4 heads / 2 KV heads) under tensor (+ sequence), pipeline and
# context (Ulysses, ring) parallelism on 2 ranks (tp2 x pp2: 4) against one process, on the tiles and
# text of tests/fixtures/internvl_train/data.jsonl: the tower and projector replicated on every rank of a
# tp / cp group (cp: the features' gradient summed over the group) or on the first pipeline stage, the
# decoder split. 3 steps of 2 micro-batches; `tp_worker compare`: every loss within 1e-5 relative, the
# weights within 2e-4 (mean 1e-6), the AdamW moments within 1e-2 of their scale. Full fine-tuning
# (tower frozen; cp also with the tower trained), LoRA (r 4 on the LM's and the projector's linears)
# under tp and pp. The error: tp not dividing the KV heads. Parts chat / chat_qwen2: OpenGVLab's internvl_chat layout
# with InternLM2 / Qwen2 (tests/fixtures/internvl_chat_train, internvl_chat_train_qwen2).
# Skipped (exit 77) without mpirun or the worker.
set -u
. tests/vlm_parallel_util.sh   # vlm_setup, cfg, run1, runn, cmp_runs, vlm_modes
vlm_setup test_internvl_parallel
VLM_FIXTURES=internvl VLM_MODEL=v5 VLM_DATA=tests/fixtures/internvl_train/data.jsonl VLM_BATCH=2
part=${1:-all}   # modes: tp / sp / pp / cp and tp x pp; more: the tower trained, LoRA and the errors;
                 # chat: OpenGVLab's internvl_chat layout (InternLM2) under tp / sp / pp; chat_qwen2: that layout
                 # with a Qwen2 LM (InternVL2-1B / 2.5-1B / 3's) under tp + sp, pp, Ulysses cp, LoRA under tp
if [ "$part" = all ] || [ "$part" = modes ]; then
vlm_modes
fi
if [ "$part" = all ] || [ "$part" = chat ]; then   # OpenGVLab's internvl_chat layout: InternViT + InternLM2 (packed wqkv)
VLM_FIXTURES=internvl_chat_train VLM_MODEL=tiny VLM_DATA=tests/fixtures/internvl_chat_train/data.jsonl VLM_BATCH=2
cfg cref "data_parallel: 1"
cfg ctp2 "tensor_parallel: 2"
cfg csp2 "tensor_parallel: 2, sequence_parallel: true"
cfg cpp2 "pipeline_parallel: 2"
cfg ccp2 "context_parallel: 2, context_parallel_mode: ring"
run1 cref
for n in ctp2 csp2 cpp2; do runn $n 2; cmp_runs cref $n; done
# its InternLM2 keeps rope_scaling dynamic (as InternVL2.5's InternLM2 does): context parallelism refused,
# ring included (dynamic NTK's base follows the whole row's largest position)
if timeout 60 "${MPIRUN[@]}" -np 2 "$MMC" train "$W/ccp2.yaml" >"$out" 2>&1; then echo "FAIL: ring cp with dynamic NTK accepted"; fail=1
elif grep -q "with rope_type 'dynamic'" "$out"; then echo "refused: ring cp with dynamic NTK"
else echo "FAIL: ring cp with dynamic NTK: unexpected message"; tail -5 "$out"; fail=1; fi
VLM_FIXTURES=internvl VLM_MODEL=v5 VLM_DATA=tests/fixtures/internvl_train/data.jsonl VLM_BATCH=2
fi
if [ "$part" = all ] || [ "$part" = chat_qwen2 ]; then   # internvl_chat: InternViT + Qwen2 (language_model.lm_head)
VLM_FIXTURES=internvl_chat_train_qwen2 VLM_MODEL=tiny VLM_DATA=tests/fixtures/internvl_chat_train_qwen2/data.jsonl VLM_BATCH=2
cfg qref "data_parallel: 1"
cfg qsp2 "tensor_parallel: 2, sequence_parallel: true"
cfg qpp2 "pipeline_parallel: 2"
cfg qcp2 "context_parallel: 2"
cfg qlref "data_parallel: 1" lora
cfg qltp2 "tensor_parallel: 2" lora
run1 qref
for n in qsp2 qpp2 qcp2; do runn $n 2; cmp_runs qref $n; done
run1 qlref
runn qltp2 2; cmp_runs qlref qltp2
VLM_FIXTURES=internvl VLM_MODEL=v5 VLM_DATA=tests/fixtures/internvl_train/data.jsonl VLM_BATCH=2
fi
if [ "$part" = all ] || [ "$part" = more ]; then
cfg tref "data_parallel: 1" tower
cfg tcp2 "context_parallel: 2" tower
cfg tpp2 "pipeline_parallel: 2" tower
run1 tref
for n in tcp2 tpp2; do runn $n 2; cmp_runs tref $n; done
cfg lref "data_parallel: 1" lora
cfg ltp2 "tensor_parallel: 2" lora
cfg lpp2 "pipeline_parallel: 2" lora
run1 lref
for n in ltp2 lpp2; do runn $n 2; cmp_runs lref $n; done
# the errors, before any work
cfg bad_tp "tensor_parallel: 4"
timeout 60 "${MPIRUN[@]}" -np 4 "$MMC" train "$W/bad_tp.yaml" >"$out" 2>&1
grep -q "tensor_parallel 4 does not divide num_key_value_heads 2" "$out" && echo "tp 4: refused, names the KV heads" ||
  { echo "FAIL: tp 4 not refused as expected:"; tail -n 5 "$out"; fail=1; }
fi
exit $fail
