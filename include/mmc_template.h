/* mmc_template.h — Jinja2 chat templates executed as transformers executes them.
 *
 * transformers renders a chat template (transformers/utils/chat_template_utils.py,
 * render_jinja_template) with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
 * lstrip_blocks=True, extensions=[loopcontrols]), its own `tojson` filter (json.dumps with
 * ensure_ascii=False), and the globals raise_exception, strftime_now, namespace and dict.
 * This module is that renderer in C: the same statements, expressions, filters, tests and
 * string/dict methods, the same Undefined semantics, Python's printing of values, and the
 * same output byte for byte (tests/test_template.c checks it against transformers).
 *
 * Inputs come as cJSON values: JSON objects keep their key order, like Python dicts.
 * Errors are mmc_status values with a message (mmc_last_error()) that names the template
 * line and column; a message raised by the template's raise_exception() is passed through
 * verbatim. Rendering is bounded (output size, memory, steps, call depth), so an arbitrary
 * template can neither hang nor exhaust memory.
 */
#ifndef MMC_TEMPLATE_H
#define MMC_TEMPLATE_H

#include "mmc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cJSON;
typedef struct mmc_template mmc_template;

/* Parse a template (n < 0: NUL-terminated). Syntax errors name the line and column. */
mmc_status mmc_template_parse(const char *src, int64_t n, mmc_template **out);
void mmc_template_free(mmc_template *t);

typedef struct {
    size_t max_output;      /* bytes of rendered text (0: 64 MiB) */
    size_t max_memory;      /* bytes of values alive during one render (0: 512 MiB) */
    int64_t max_steps;      /* evaluation steps (0: 100 million) */
    int max_depth;          /* nested macro calls / recursive loops (0: 200) */
    int64_t now;            /* strftime_now's clock, seconds since the epoch (0: the real clock) */
} mmc_template_limits;

/* Render with the variables of `vars` (a JSON object, or NULL). *out is malloc'd and
 * NUL-terminated; *len (optional) its length. */
mmc_status mmc_template_render(const mmc_template *t, const struct cJSON *vars,
                               const mmc_template_limits *lim, char **out, size_t *len);

/* What transformers' render_jinja_template passes: messages (JSON array of message
 * objects; `reasoning`/`thinking` aliased to `reasoning_content` as transformers does),
 * tools and documents (arrays or NULL -> None), add_generation_prompt, and every member of
 * `extra` (bos_token, eos_token, enable_thinking, add_vision_id ... ; may be NULL). */
mmc_status mmc_template_render_chat(const mmc_template *t, const struct cJSON *messages,
                                    const struct cJSON *tools, const struct cJSON *documents,
                                    bool add_generation_prompt, const struct cJSON *extra,
                                    const mmc_template_limits *lim, char **out, size_t *len);

/* The chat template of a model directory, as transformers 5 loads it: for a processor
 * directory, processor_config.json's "chat_template", else chat_template.json, else
 * chat_template.jinja (+ additional_chat_templates/NAME.jinja); for a tokenizer, the .jinja
 * files, else tokenizer_config.json's "chat_template" (a string, or a list of {name,
 * template}). `name` picks one of several (NULL: "default", or the only one). *src is
 * malloc'd; *origin (optional, malloc'd) names the file. MMC_ERR_NOT_FOUND when there is none. */
mmc_status mmc_template_find(const char *model_dir, const char *name, char **src, char **origin);

/* bos_token / eos_token of tokenizer_config.json (a string or an AddedToken dict), malloc'd,
 * or NULL when absent. */
mmc_status mmc_template_special_tokens(const char *model_dir, char **bos, char **eos);

#ifdef __cplusplus
}
#endif
#endif
