/* ftfy_lite.c — the character-level fixes of ftfy.fix_text (ftfy 6.x, fixes.py / chardata.py) that
 * diffusers' Wan pipelines apply to prompts before their own cleaning (prompt_clean: basic_clean =
 * ftfy.fix_text, html.unescape twice, strip; then whitespace runs to one space). TextFixerConfig's
 * defaults, in ftfy's order, repeated until nothing changes:
 *
 *   unescape_html ("auto": only when the text has no '<'): "&name;" of the entities below and "&#N;" /
 *       "&#xN;" (ftfy takes the HTML5 table; these are the ones prompts carry)
 *   fix_c1_controls     U+0080..U+009F read as the Windows-1252 byte (sloppy: undefined bytes stay)
 *   fix_latin_ligatures ﬁ -> fi, ĳ -> ij, Ǆ -> DŽ, ... (ftfy's table)
 *   fix_character_width U+3000 -> ' ', U+FF01..U+FFEF -> their NFKC form (fullwidth ASCII, halfwidth kana)
 *   uncurl_quotes       U+02BC, U+2018..U+201B -> ', U+201C..U+201F -> "
 *   fix_line_breaks     CRLF, CR, U+2028, U+2029, U+0085 -> LF
 *   remove_terminal_escapes  ESC [ (digits | ;)* letter
 *   remove_control_chars     U+0000..0008, 000B, 000E..001F, 007F, 206A..206F, FEFF, FFF9..FFFC
 *   normalization       NFC (libutf8proc)
 *
 * Not done: ftfy's mojibake repair (fix_encoding: text decoded with the wrong codec, "cafÃ©"), which
 * needs its byte-level heuristics; such text passes through unchanged here. Invalid UTF-8 becomes
 * U+FFFD, as Python's decode(errors="replace") would make it. */
#include "mmc_tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct { uint32_t *c; size_t n, cap; } cps;

static int put(cps *o, uint32_t c) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        uint32_t *x = realloc(o->c, cap * sizeof *x);
        if (!x) return -1;
        o->c = x, o->cap = cap;
    }
    o->c[o->n++] = c;
    return 0;
}

static int decode(const char *s, cps *o) {
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    utf8proc_ssize_t len = (utf8proc_ssize_t)strlen(s);
    while (len > 0) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p, len, &c);
        if (k < 1) c = 0xFFFD, k = 1;
        if (put(o, (uint32_t)c)) return -1;
        p += k, len -= k;
    }
    return 0;
}

static char *encode(const cps *v) {
    char *s = malloc(v->n * 4 + 1), *o = s;
    if (!s) return NULL;
    for (size_t i = 0; i < v->n; i++) o += utf8proc_encode_char((utf8proc_int32_t)v->c[i], (utf8proc_uint8_t *)o);
    *o = 0;
    return s;
}

static const uint16_t CP1252[32] = {   /* 0x80..0x9F; 0 = undefined (the C1 character stays) */
    0x20AC, 0, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0, 0x017D, 0,
    0, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0, 0x017E, 0x0178};

static const struct { uint32_t from; const char *to; } LIGATURES[] = {
    {0x0132, "IJ"}, {0x0133, "ij"}, {0x0149, "\xCA\xBCn"}, {0x01F1, "DZ"}, {0x01F2, "Dz"}, {0x01F3, "dz"},
    {0x01C4, "D\xC5\xBD"}, {0x01C5, "D\xC5\xBE"}, {0x01C6, "d\xC5\xBE"}, {0x01C7, "LJ"}, {0x01C8, "Lj"}, {0x01C9, "lj"},
    {0x01CA, "NJ"}, {0x01CB, "Nj"}, {0x01CC, "nj"}, {0xFB00, "ff"}, {0xFB01, "fi"}, {0xFB02, "fl"}, {0xFB03, "ffi"},
    {0xFB04, "ffl"}, {0xFB05, "\xC5\xBFt"}, {0xFB06, "st"}};

static const struct { const char *name; uint32_t cp; } ENTITIES[] = {
    {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}, {"nbsp", 0xA0}, {"ldquo", 0x201C},
    {"rdquo", 0x201D}, {"lsquo", 0x2018}, {"rsquo", 0x2019}, {"hellip", 0x2026}, {"ndash", 0x2013},
    {"mdash", 0x2014}, {"copy", 0xA9}, {"reg", 0xAE}, {"trade", 0x2122}, {"deg", 0xB0}, {"times", 0xD7}};

static int put_utf8(cps *o, const char *s) {
    cps t = {0};
    int r = decode(s, &t);
    for (size_t i = 0; !r && i < t.n; i++) r = put(o, t.c[i]);
    free(t.c);
    return r;
}

static bool ctrl_removed(uint32_t c) {
    return c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
           c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

/* "&name;" / "&#N;" / "&#xN;" at v->c[i]: the code point and its length, or 0 */
static size_t entity(const cps *v, size_t i, uint32_t *cp) {
    char buf[32];
    size_t k = 0;
    for (size_t j = i + 1; j < v->n && k < 26; j++) {
        if (v->c[j] == ';') {
            buf[k] = 0;
            if (buf[0] == '#') {
                const bool hex = buf[1] == 'x' || buf[1] == 'X';
                char *end = NULL;
                unsigned long x = strtoul(buf + (hex ? 2 : 1), &end, hex ? 16 : 10);
                if (!end || *end || end == buf + (hex ? 2 : 1) || x == 0 || x > 0x10FFFF || (x >= 0xD800 && x < 0xE000))
                    return 0;
                *cp = (uint32_t)x;
                return j - i + 1;
            }
            for (size_t e = 0; e < sizeof ENTITIES / sizeof *ENTITIES; e++)
                if (!strcmp(buf, ENTITIES[e].name)) { *cp = ENTITIES[e].cp; return j - i + 1; }
            return 0;
        }
        const uint32_t c = v->c[j];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c == '#' && j == i + 1)))
            return 0;
        buf[k++] = (char)c;
    }
    return 0;
}

/* One pass of the fixers, v -> o. */
static int fix_pass(const cps *v, bool html, cps *o) {
    int r = 0;
    for (size_t i = 0; i < v->n && !r; i++) {
        uint32_t c = v->c[i], e;
        size_t k;
        if (html && c == '&' && (k = entity(v, i, &e))) { r = put(o, e); i += k - 1; continue; }
        if (c >= 0x80 && c <= 0x9F && CP1252[c - 0x80]) c = CP1252[c - 0x80];
        bool done = false;
        for (size_t l = 0; l < sizeof LIGATURES / sizeof *LIGATURES && !done; l++)
            if (c == LIGATURES[l].from) { r = put_utf8(o, LIGATURES[l].to); done = true; }
        if (done) continue;
        if (c == 0x3000) c = ' ';
        else if (c >= 0xFF01 && c <= 0xFFEF) {   /* NFKC of the width form */
            utf8proc_uint8_t in[8];
            in[utf8proc_encode_char((utf8proc_int32_t)c, in)] = 0;
            char *n = (char *)utf8proc_NFKC(in);
            if (!n) return -1;
            r = put_utf8(o, n);
            free(n);
            continue;
        }
        if (c == 0x02BC || (c >= 0x2018 && c <= 0x201B)) c = '\'';
        else if (c >= 0x201C && c <= 0x201F) c = '"';
        if (c == '\r' && i + 1 < v->n && v->c[i + 1] == '\n') continue;   /* CRLF -> LF */
        if (c == '\r' || c == 0x2028 || c == 0x2029 || c == 0x85) c = '\n';
        if (c == 0x1B && i + 1 < v->n && v->c[i + 1] == '[') {   /* ANSI escapes */
            size_t j = i + 2;
            while (j < v->n && ((v->c[j] >= '0' && v->c[j] <= '9') || v->c[j] == ';')) j++;
            if (j < v->n && ((v->c[j] >= 'a' && v->c[j] <= 'z') || (v->c[j] >= 'A' && v->c[j] <= 'Z'))) { i = j; continue; }
        }
        if (ctrl_removed(c)) continue;
        r = put(o, c);
    }
    return r;
}

char *mmc_ftfy_fix_text(const char *text) {
    cps v = {0};
    if (decode(text, &v)) { free(v.c); return NULL; }
    bool html = true;   /* unescape_html "auto": off when the text has a '<' */
    for (size_t i = 0; i < v.n; i++) html = html && v.c[i] != '<';
    char *cur = NULL;
    for (int pass = 0; pass < 8; pass++) {
        cps o = {0};
        if (fix_pass(&v, html, &o)) { free(o.c); free(v.c); free(cur); return NULL; }
        char *s = encode(&o);
        free(o.c);
        char *nfc = s ? (char *)utf8proc_NFC((const utf8proc_uint8_t *)s) : NULL;
        free(s);
        if (!nfc) { free(v.c); free(cur); return NULL; }
        const bool same = cur ? !strcmp(cur, nfc) : !strcmp(text, nfc);
        free(cur);
        cur = nfc;
        if (same) break;
        free(v.c);
        v = (cps){0};
        if (decode(cur, &v)) { free(v.c); free(cur); return NULL; }
    }
    free(v.c);
    return cur;
}
