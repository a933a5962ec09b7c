/* fuzz_wan_prompt.c — libFuzzer target for the Wan prompt cleaning on untrusted prompts:
 * mmc_ftfy_fix_text (src/tokenizer/ftfy_lite.c: C1 controls, ligatures, width forms, quotes, line
 * breaks, ANSI escapes, control characters, NFC; invalid UTF-8 as U+FFFD) and mmc_wan_prompt_clean
 * (entities, whitespace) into a small and a large buffer. Checked invariants: valid UTF-8 out, no
 * removed control character left, a fixed point (fixing the fixed text changes nothing), the cleaned
 * prompt without leading / trailing spaces or double spaces, within its buffer. */
#include "mmc_tokenizer.h"
#include "mmc_wan_t2v.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    char *f = mmc_ftfy_fix_text(text);
    if (!f) abort();
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)f;
    for (utf8proc_ssize_t len = (utf8proc_ssize_t)strlen(f); len > 0;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p, len, &c);
        if (k < 1) abort();
        if ((c >= 0 && c <= 0x08) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || c == 0xFEFF) abort();
        p += k, len -= k;
    }
    char *g = mmc_ftfy_fix_text(f);
    if (!g || strcmp(f, g)) abort();
    free(g), free(f);
    static char small[16], big[4096];
    mmc_wan_prompt_clean(text, small, sizeof small);
    mmc_wan_prompt_clean(text, big, sizeof big);
    if (strlen(small) >= sizeof small) abort();
    const size_t n = strlen(big);
    if (n && (big[0] == ' ' || big[n - 1] == ' ' || strstr(big, "  "))) abort();
    free(text);
    return 0;
}
