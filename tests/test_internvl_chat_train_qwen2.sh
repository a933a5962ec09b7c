#!/usr/bin/env bash
# test_internvl_chat_train_qwen2.sh — test_internvl_chat_train.sh's checks on its Qwen2 twin (OpenGVLab's
# InternVLChatModel with a Qwen2ForCausalLM language model, as InternVL2-1B / 2.5-1B / 3 have it; fixture
# tests/fixtures/internvl_chat_train_qwen2 from tools/ref/gen_internvl_chat_train.py --llm qwen2): a ctest case of its
# own so that the two run side by side.
MMC_INTERNVL_CHAT_LLM=qwen2 exec bash tests/test_internvl_chat_train.sh
