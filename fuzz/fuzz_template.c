/* fuzz_template.c — libFuzzer target for the Jinja chat-template engine: the input is a
 * template, parsed and rendered over a fixed chat (system, user with image/text parts,
 * assistant with a tool call, tool result) plus tools and extra variables, under tight
 * limits (steps, output, memory, depth), so that every template — hostile ones included —
 * ends in text or an error, never a crash, a hang or a leak. */
#include "mmc_template.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>

static cJSON *g_msgs, *g_tools, *g_extra;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    g_msgs = cJSON_Parse(
        "[{\"role\": \"system\", \"content\": \"You are terse.\"},"
        " {\"role\": \"user\", \"content\": [{\"type\": \"image\"}, {\"type\": \"text\", \"text\": \"What is this? é😀\"}]},"
        " {\"role\": \"assistant\", \"content\": \"\", \"reasoning_content\": \"hm\", \"tool_calls\": [{\"type\": \"function\","
        "   \"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}]},"
        " {\"role\": \"tool\", \"content\": \"{\\\"r\\\": 1}\"},"
        " {\"role\": \"user\", \"content\": \"thanks\"}]");
    g_tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\","
                          " \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}}}]");
    g_extra = cJSON_Parse("{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false, \"add_vision_id\": true}");
    if (!g_msgs || !g_tools || !g_extra) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_template *t = NULL;
    if (mmc_template_parse((const char *)data, (int64_t)size, &t) != MMC_OK) return 0;
    mmc_template_limits lim = {.max_output = 1 << 16, .max_memory = 64 << 20, .max_steps = 200000, .max_depth = 64,
                               .now = 1733300000};
    char *out = NULL;
    size_t n = 0;
    if (mmc_template_render_chat(t, g_msgs, g_tools, NULL, true, g_extra, &lim, &out, &n) == MMC_OK && n > lim.max_output)
        abort();
    free(out);
    mmc_template_free(t);
    return 0;
}
