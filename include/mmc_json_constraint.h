/* mmc_json_constraint.h — constrained decoding of JSON for `mmc serve`'s response_format
 * ({"type": "json_object"} and {"type": "json_schema", "json_schema": {"schema": ...}}), the way
 * vLLM's / llama.cpp's grammar-guided decoding does it: a pushdown automaton over bytes that
 * accepts exactly the JSON texts of a schema, and a mask over the tokenizer's vocabulary that
 * leaves only the tokens whose bytes keep the text a prefix of such a JSON text. When the token
 * budget runs short, only tokens that keep the shortest completion within the budget remain, so
 * a generation that reaches max_tokens still ends as valid JSON (when the budget allows the
 * schema's smallest value at all).
 *
 * The schema subset: an object at the top; "type" object (properties, required; without
 * properties any keys and values), array (items, minItems, maxItems), string (minLength,
 * maxLength), number, integer, boolean, null; enum and const of scalars; annotations (title,
 * description, default, examples, $schema, additionalProperties, strict) are ignored. Any other
 * keyword (anyOf, $ref, pattern, format, minimum ...) is refused with a message naming it and
 * its path. Output is compact where the model wants (at most 16 whitespace bytes in a row
 * between tokens), numbers have at most 16 integer and 16 fraction digits, nesting at most 32. */
#ifndef MMC_JSON_CONSTRAINT_H
#define MMC_JSON_CONSTRAINT_H

#include "mmc.h"
#include "mmc_tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mmc_jc_schema mmc_jc_schema;
typedef struct mmc_jc_state mmc_jc_state;
typedef struct mmc_jc_vocab mmc_jc_vocab;

/* Compile a JSON Schema given as JSON text (schema NULL: any JSON object, response_format
 * json_object). false with a message in err (naming the keyword and its path) when the text is
 * not JSON, not an object schema, or uses what the subset lacks. */
bool mmc_jc_compile(const char *schema, size_t n, mmc_jc_schema **out, char *err, size_t n_err);
void mmc_jc_schema_free(mmc_jc_schema *s);
/* Literal text before and after the value (tool calls: "<tool_call>\n" ... "\n</tool_call>"), at
 * most 256 bytes each; false when out of memory or too long. */
bool mmc_jc_wrap(mmc_jc_schema *s, const char *prefix, const char *suffix);

/* A fresh automaton at the start of the text (NULL when out of memory). */
mmc_jc_state *mmc_jc_start(const mmc_jc_schema *s);
void mmc_jc_state_free(mmc_jc_state *st);
/* Advance over n bytes: false (and st unchanged) when they cannot continue a valid text. */
bool mmc_jc_feed(mmc_jc_state *st, const uint8_t *b, size_t n);
/* The text is one complete value (nothing more may follow). */
bool mmc_jc_done(const mmc_jc_state *st);
/* The shortest bytes that complete the text (written to buf up to cap, NUL-terminated when room);
 * returns their count. */
size_t mmc_jc_close(const mmc_jc_state *st, char *buf, size_t cap);

/* Every token's bytes, once per tokenizer. */
mmc_status mmc_jc_vocab_build(const mmc_tokenizer *tok, mmc_jc_vocab **out);
void mmc_jc_vocab_free(mmc_jc_vocab *v);
/* Set logits[id] = -inf for every token that may not come next: tokens whose bytes do not
 * continue the text, special tokens, and the eos ids until the text is complete (then only
 * they remain). budget: tokens that may still be generated, this one included; when the
 * shortest completion comes near it, only tokens that keep it reachable remain. */
void mmc_jc_mask(const mmc_jc_state *st, const mmc_jc_vocab *v, int64_t budget, const int32_t *eos, int n_eos,
                 float *logits, int64_t V);
/* Advance over token id's bytes (false: not allowed). */
bool mmc_jc_feed_token(mmc_jc_state *st, const mmc_jc_vocab *v, int32_t id);

#ifdef __cplusplus
}
#endif
#endif
