"""Prompts through diffusers' Wan prompt_clean (pipelines/wan/pipeline_wan_i2v.py: ftfy.fix_text, html.unescape
twice, strip, whitespace runs to one space) with ftfy installed, as Wan's requirements have it, for
tests/test_wan_i2v.c (mmc_wan_prompt_clean): tests/fixtures/wan_i2v/prompt_clean.json, a list of
[prompt, cleaned]. Mojibake (text decoded with the wrong codec), which ftfy also repairs and mmc does not,
is left out and listed in the README.

Run: .venv-ref/bin/python tools/ref/gen_wan_prompts.py
"""
import json
import os

import ftfy  # noqa: F401  (prompt_clean needs it)
from diffusers.pipelines.wan.pipeline_wan_i2v import prompt_clean

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "wan_i2v", "prompt_clean.json")
PROMPTS = [
    "a red cat walks on the beach",
    "  a  blue dog\truns slowly \n",
    "\u201cWan\u201d \u2018video\u2019 it\u02bcs \u201ffine\u201e",
    "\ufb01sh \ufb02ower o\ufb03ce \u0133s \u01c4ungla \ufb05op",
    "\uff21\uff22\uff23\uff11\uff12\uff13\uff01 \uff08fullwidth\uff09\u3000ideographic space",
    "\uff76\uff80\uff76\uff85 \uff9d\uff9e half-width kana",
    "C1: \u0093quoted\u0094 \u0085 \u0080 \u0081 \u008d end",
    "\x1b[31mred\x1b[0m text\x1b[1;32m bold",
    "bell\x07 del\x7f bom\ufeff tags\u206a\u206f done",
    "e\u0301 a\u0308 n\u0303 composed",
    "thin\u2009space en\u2002space nbsp\u00a0x line\u2028sep para\u2029sep nel\u0085x ogham\u1680x",
    "zero\u200bwidth joiner\u200d stays",
    "&amp;amp; &lt;b&gt; &#8220;num&#8221; &#x2019;hex &quot;q&quot;",
    "&ldquo;named&rdquo; &hellip; &mdash; with no markup",
    "<b> &ldquo;markup&rdquo; </b> keeps entities for html.unescape",
    "\u4e00\u53ea\u732b\u5728\u6d77\u6ee9\u4e0a\u6563\u6b65\uff0c\u9633\u5149\u660e\u5a9a\u3002",
    "emoji \U0001F431\U0001F3D6 and \u00e9\u00e0\u00fc",
    "CRLF\r\nline\rbreaks\n\n\n",
    "",
    "   ",
]
with open(OUT, "w", encoding="utf-8") as f:
    json.dump([[p, prompt_clean(p)] for p in PROMPTS], f, ensure_ascii=False, indent=1)
print("wrote", OUT)
