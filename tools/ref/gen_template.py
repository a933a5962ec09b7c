#!/usr/bin/env python3
"""gen_template.py — fixtures for the Jinja chat-template engine (src/template/).

Writes tests/fixtures/template/cases.json:
  templates:     name -> template source, written after the published chat templates of
                 Qwen2-VL, Qwen2.5 (tools), Qwen3 (<think>, enable_thinking), Llama 3.1/3.2
                 (tools, dates), Mistral (role alternation via raise_exception), Gemma 1/3,
                 DeepSeek-R1 (namespace state, tool calls), Phi-3, InternVL 2.5, LLaVA 1.5
                 ({% generation %}) — from their constructs, not fetched;
  message_sets:  name -> {messages, tools, documents, add_generation_prompt, extra};
  chat:          every template x message set, with the text transformers renders, or the
                 error it raises (raised: the message of raise_exception, verbatim);
  units:         one construct each (statements, operators, tests, filters, methods,
                 whitespace control, Undefined), rendered by transformers' own environment.

Expected output comes from transformers' render_jinja_template (what apply_chat_template
calls) and, for units, from the jinja2 environment transformers compiles
(_compile_jinja_template), so the sandbox, tojson and globals are transformers' own.

Run: /work/main/.venv-ref/bin/python tools/ref/gen_template.py
"""
import json
import os

import datetime

import jinja2
import transformers
import transformers.utils.chat_template_utils as chat_template_utils
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template


class FixedClock(datetime.datetime):
    """strftime_now's clock, pinned: transformers' strftime_now reads datetime.now() (local time);
    the expected texts would otherwise hold the day they were written, and test_template.c renders
    with the same instant (FIXED_NOW, TZ=UTC)."""
    @classmethod
    def now(cls, tz=None):
        return datetime.datetime(2024, 12, 4, 8, 13, 20)   # 1733300000 s, UTC


chat_template_utils.datetime = FixedClock

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "fixtures", "template")

T = {}

T["qwen2_vl"] = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}"
    "<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# the tool list both Qwen2.5 and Qwen3 print in their system turn
QWEN_TOOLS = r"""    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}"""

T["qwen2_5"] = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
@QWEN_TOOLS@
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

T["qwen3"] = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
@QWEN_TOOLS@
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

T["qwen2_5"] = T["qwen2_5"].replace("@QWEN_TOOLS@", QWEN_TOOLS)
T["qwen3"] = T["qwen3"].replace("@QWEN_TOOLS@", QWEN_TOOLS)

T["llama3_1"] = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

T["mistral"] = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
"""

T["gemma"] = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)

T["gemma3"] = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

T["deepseek_r1"] = (
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%- else %}"
    "{% set ns.system_prompt = ns.system_prompt + '\\n\\n' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}"
    "{{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' in message %}{%- set ns.is_tool = false -%}"
    "{%- for tool in message['tool_calls'] %}{%- if not ns.is_first %}{%- if message['content'] is none %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- endif %}{%- set ns.is_first = true -%}{%- else %}"
    "{{'\\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments']|tojson + '\\n' + '```' + '<｜tool▁call▁end｜>'}}"
    "{%- endif %}{%- endfor %}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and 'tool_calls' not in message %}{%- if ns.is_tool %}"
    "{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}{%- endif %}"
    "{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}{%- if ns.is_output_first %}"
    "{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.is_output_first = false %}"
    "{%- else %}{{'<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor -%}"
    "{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜><think>\\n'}}{% endif %}"
)

T["phi3"] = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

T["internvl2_5"] = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的多模态大语言模型。<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n'}}{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<image>\n' }}{% elif content['type'] == 'video' %}"
    "{{ '<video>\n' }}{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

T["llava1_5"] = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# Hermes-2-Pro style tool use: a recursive macro turning JSON schemas into Python types,
# dict .items(), `is mapping`, nested loops over schema properties.
T["hermes_tools"] = r"""{%- macro json_to_python_type(json_spec) %}
{%- set basic_type_map = {
    "string": "str",
    "number": "float",
    "integer": "int",
    "boolean": "bool"
} %}

{%- if basic_type_map[json_spec.type] is defined %}
    {{- basic_type_map[json_spec.type] }}
{%- elif json_spec.type == "array" %}
    {{- "list[" +  json_to_python_type(json_spec|items) + "]"}}
{%- elif json_spec.type == "object" %}
    {%- if json_spec.additionalProperties is defined %}
        {{- "dict[str, " + json_to_python_type(json_spec.additionalProperties) + ']'}}
    {%- else %}
        {{- "dict" }}
    {%- endif %}
{%- elif json_spec.type is iterable %}
    {{- "Union[" }}
    {%- for t in json_spec.type %}
      {{- json_to_python_type({"type": t}) }}
      {%- if not loop.last %}
        {{- "," }}
    {%- endif %}
    {%- endfor %}
    {{- "]" }}
{%- else %}
    {{- "Any" }}
{%- endif %}
{%- endmacro %}


{{- bos_token }}
{{- '<|im_start|>system\n' }}
{{- "You are a function calling AI model. You are provided with function signatures within <tools></tools> XML tags. Here are the available tools: <tools> " }}
{%- for tool in tools %}
    {%- if tool.function is defined %}
        {%- set tool = tool.function %}
    {%- endif %}
    {{- '{"type": "function", "function": ' }}
    {{- '{"name": "' + tool.name + '", ' }}
    {{- '"description": "' + tool.name + '(' }}
    {%- for param_name, param_fields in tool.parameters.properties|items %}
        {{- param_name + ": " + json_to_python_type(param_fields) }}
        {%- if not loop.last %}
            {{- ", " }}
        {%- endif %}
    {%- endfor %}
    {{- ")" }}
    {%- if tool.return is defined %}
        {{- " -> " + json_to_python_type(tool.return) }}
    {%- endif %}
    {{- " - " + tool.description + "\n\n" }}
    {%- for param_name, param_fields in tool.parameters.properties|items %}
        {%- if loop.first %}
            {{- "    Args:\n" }}
        {%- endif %}
        {{- "        " + param_name + "(" + json_to_python_type(param_fields) + "): " + param_fields.description|default('')|trim }}
    {%- endfor %}
    {{- '", ' }}
    {{- '"parameters": ' }}
    {%- if tool.parameters.properties | length == 0 %}
        {{- "{}" }}
    {%- else %}
        {{- tool.parameters|tojson }}
    {%- endif %}
    {{- "}" }}
    {%- if not loop.last %}
        {{- "\n" }}
    {%- endif %}
{%- endfor %}
{{- " </tools>" }}
{{- '<|im_end|>\n' }}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" or (message.role == "assistant" and message.tool_calls is not defined) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
    {%- for tool_call in message.tool_calls %}
       {{- '\n<tool_call>\n' }}           {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '{' }}
            {{- '"name": "' }}
            {{- tool_call.name }}
            {{- '"' }}
            {{- ', '}}
            {%- if tool_call.arguments is defined %}
                {{- '"arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments|tojson }}
                {%- endif %}
            {%- endif %}
             {{- '}' }}
            {{- '\n</tool_call>' }}
    {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>tool\n' }}
        {%- endif %}
        {{- '<tool_response>\n' }}
        {{- message.content }}
        {%- if not loop.last %}
            {{- '\n</tool_response>\n' }}
        {%- else %}
            {{- '\n</tool_response>' }}
        {%- endif %}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>' }}
        {%- elif loop.last %}
            {{- '<|im_end|>' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

# Mistral v0.3 style tools: selectattr | list, tool-call id checks through raise_exception,
# tools only before the last user message, arguments either a string or a dict.
T["mistral_v3_tools"] = r"""{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

# Command-R style grounded generation: documents, enumerate via loop.index0, dict items.
T["rag_documents"] = r"""{{ bos_token }}{% if documents %}<|SYSTEM|># Documents
{% for doc in documents %}Document: {{ loop.index0 }}
{% for key, value in doc.items() %}{{ key | capitalize }}: {{ value }}
{% endfor %}
{% endfor %}{% endif %}{% for message in messages %}<|{{ message.role | upper }}|>{{ message.content | trim }}<|END|>{% endfor %}{% if add_generation_prompt %}<|CHATBOT|>{% endif %}"""

# A template using the constructs the published ones above do not: macros with caller(),
# filter blocks, block set, loop.cycle / previtem / nextitem, dictsort, tuple unpacking,
# recursive loops, whitespace control in every position, raw, comments.
T["kitchen_sink"] = r"""{#- a kitchen-sink template -#}
{%- macro render_part(part, idx=0) -%}
  {%- if part is string -%}{{ part }}
  {%- elif part.type == 'text' -%}{{ part.text | trim }}
  {%- elif part.type in ['image', 'image_url'] -%}[img{{ idx }}]
  {%- else -%}[{{ part.type | upper }}]
  {%- endif -%}
{%- endmacro -%}
{%- macro wrap(tag) -%}<{{ tag }}>{{ caller() }}</{{ tag }}>{%- endmacro -%}
{%- set ns = namespace(turns=0, chars=0) -%}
{%- set header %}
HEADER {{ messages | length }} msgs
{% endset -%}
{{ header | trim }}
{% for m in messages if m.role != 'system' -%}
  {%- set ns.turns = ns.turns + 1 -%}
  {{ loop.index }}/{{ loop.length }} {{ loop.cycle('odd', 'even') }}{% if loop.previtem is defined %} prev={{ loop.previtem.role }}{% endif %}{% if loop.nextitem %} next={{ loop.nextitem.role }}{% endif %}:
  {%- call wrap(m.role) -%}
    {%- if m.content is string -%}{{ m.content }}{%- else -%}
      {%- for p in m.content -%}{{ render_part(p, loop.index0) }}{{ ' ' if not loop.last }}{%- endfor -%}
    {%- endif -%}
  {%- endcall %}
  {%- if m.tool_calls is defined and m.tool_calls %}
    {%- for call in m.tool_calls %}
 call {{ call.function.name }}({% for k, v in call.function.arguments | dictsort %}{{ k }}={{ v | tojson }}{{ ', ' if not loop.last }}{% endfor %})
    {%- endfor %}
  {%- endif %}

{% else %}
(no turns)
{% endfor -%}
{%- filter upper %}turns: {{ ns.turns }}{% endfilter %}
{% raw %}{{ not rendered }}{% endraw %}
{%- if tools %}
tools: {{ tools | map(attribute='function.name') | join(', ') }}
{%- for t in tools %}
{{ t.function.name }}: {{ t.function.parameters.properties | list | sort | join('|') }} req={{ t.function.parameters.required | default([], true) | length }}
{%- endfor %}
{%- endif %}
{{ '[gen]' if add_generation_prompt else '[nogen]' }}"""

T["tojson_variants"] = r"""{%- for m in messages %}
{{ m | tojson }}
{{ m | tojson(indent=2) }}
{{ m | tojson(separators=(',', ':')) }}
{{ m | tojson(ensure_ascii=True, sort_keys=True) }}
{%- endfor %}
{%- if tools %}{{ tools | tojson(indent='\t') }}{% endif %}"""

# ------------------------------------------------------------------ message sets
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                       "required": ["a", "b"]}}},
]

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL2 = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3.5}}}

SETS = {
    "single": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_multiturn": {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "  And 3+3?  "}]},
    "multiturn": {"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke.\nA short one."}]},
    "tools": {"tools": TOOLS, "messages": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": "It is 21 degrees."},
        {"role": "user", "content": "Thanks"}]},
    "tools_no_system": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Add 2 and 3.5"},
        {"role": "assistant", "content": None, "tool_calls": [CALL2]},
        {"role": "tool", "content": "5.5"}]},
    "parallel_calls": {"tools": TOOLS, "messages": [
        {"role": "user", "content": "Weather and a sum"},
        {"role": "assistant", "content": "Calling both.", "tool_calls": [CALL, CALL2]},
        {"role": "tool", "content": "{\"temp\": 21}"},
        {"role": "tool", "content": "5.5"},
        {"role": "user", "content": "ok"}]},
    "vision": {"messages": [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in this image?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "And this video?"},
                                     {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
    "vision_ids": {"extra": {"add_vision_id": True}, "messages": [
        {"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "image", "image": "b.png"},
                                     {"type": "text", "text": "Compare."}]},
        {"role": "assistant", "content": "They differ."},
        {"role": "user", "content": [{"type": "video", "video": "v.mp4"}, {"type": "text", "text": "Now this."}]}]},
    "unicode": {"messages": [
        {"role": "system", "content": "Réponds en français. 🌍"},
        {"role": "user", "content": "你好 \"quoted\" back\\slash tab\t café ñ"},
        {"role": "assistant", "content": "Bonjour ! 😀"},
        {"role": "user", "content": "Ünïcödé — ok?"}]},
    "no_gen": {"add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Ping"},
        {"role": "assistant", "content": "Pong"}]},
    "thinking_off": {"extra": {"enable_thinking": False}, "messages": [
        {"role": "user", "content": "Quick answer: capital of Italy?"}]},
    "reasoning": {"messages": [
        {"role": "user", "content": "Solve 12*12"},
        {"role": "assistant", "content": "144", "reasoning_content": "12*12 = 144."},
        {"role": "user", "content": "And 13*13?"},
        {"role": "assistant", "content": "<think>\n13*13 = 169\n</think>\n\n169"}], "add_generation_prompt": False},
    "bad_alternation": {"messages": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"}]},
    "date": {"extra": {"date_string": "04 Dec 2026"}, "messages": [
        {"role": "system", "content": "  Be helpful.  "},
        {"role": "user", "content": "What day is it?"}]},
    "mistral_tools": {"tools": TOOLS, "messages": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "tool_calls": [dict(CALL, id="abc123XYZ")]},
        {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temp\": 21}"},
        {"role": "assistant", "content": " 21 degrees. "},
        {"role": "user", "content": "Thanks"}]},
    "documents": {"documents": [{"title": "Tides", "text": "Tides are caused by the moon."},
                                {"title": "Sun", "text": "The sun is a star.", "url": "https://x.y"}],
                  "messages": [{"role": "user", "content": "Why are there tides?"}]},
    "builtin_tools": {"extra": {"builtin_tools": ["brave_search", "code_interpreter"], "date_string": "01 Jan 2025"},
                      "tools": TOOLS, "messages": [
        {"role": "user", "content": "Search it"},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "brave_search", "arguments": {"query": "mmc"}}}]},
        {"role": "ipython", "content": {"results": ["a", "b"]}}]},
}

def render_case(tpl, s):
    msgs = s["messages"]
    extra = {"bos_token": "<s>", "eos_token": "</s>"}
    extra.update(s.get("extra", {}))
    try:
        out, _ = render_jinja_template(conversations=[msgs], tools=s.get("tools"), documents=s.get("documents"),
                                       chat_template=tpl, add_generation_prompt=s.get("add_generation_prompt", True),
                                       **extra)
        return {"expected": out[0]}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return {"error": str(e), "raised": True}
        return {"error": f"{type(e).__name__}: {e}", "raised": False}
    except Exception as e:  # TypeError, ZeroDivisionError ... as jinja2 lets them through
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


# ------------------------------------------------------------------ units: one construct each
U = []
def u(tpl, **vars):
    U.append((tpl, vars))

# whitespace control, trim_blocks / lstrip_blocks, comments, raw
u("  {% if true %}\n  x\n  {% endif %}\n  {#c#}\ny {{- ' z ' -}}  \n w")
u("a\n  {%+ if true %}b{% endif +%}\nc\n{% if true -%}\n   d\n{%- endif %}\ne")
u("{% for i in range(3) %}\n  {{ i }}\n{% endfor %}\n")
u("x {# comment #} y\n  {# own line #}\nz")
u("{% raw %}\n  {{ a }} {% b %}\n{% endraw %}\nafter")
u("\t{%- raw -%}\t{{ r }}\n  {% endraw -%}\r\n|x\n {% raw %}\n  a\n  {%- endraw %}\n|{% raw -%}\n b\n  {%+ endraw +%}\nc")
u("{% raw +%}x{% endraw %}")
u("line1\r\nline2\r\n{% if true %}\r\nline3{% endif %}\n")
u("{{ 'keep' }}\n")
u("{{ 'trailing' }}\n\n")
# literals and printing
u("{{ 'a\\nb\\t\\'q\\' \\\"d\\\" \\u00e9 \\x41 \\\\' }}|{{ \"it's\" }}")
u("{{ 42 }} {{ -7 }} {{ 1_000 }} {{ 3.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1.5e-5 }} {{ 123456789.125 }} {{ -0.0 }} {{ 2.5e300 * 1e10 }}")
u("{{ [1, 'a', none, true, 1.5, [2], {'k': (1, 2)}] }} {{ (1,) }} {{ () }} {{ {} }} {{ None }} {{ True }} {{ false }}")
u("{{ ['it\\'s', \"q\\\"\", 'both\\'\"', 'tab\\t', 'nl\\n', '\\x01', 'é'] }}")
u("{{ 'a' 'b' }} {{ ('x' ~ 1 ~ none ~ true ~ 1.0) }} {{ undefined_var ~ '!' }}")
# arithmetic
u("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 3 / 2 }} {{ 4 / 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 + true }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 2 * 'x' }}")
u("{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 10 - 2 - 3 }} {{ -x }}", x=5)
u("{{ [1, 2] + [3] }} {{ 'a' + 'b' }} {{ (1, 2) + (3,) }}")
u("{{ 1 / 0 }}")
u("{{ 'a' + 1 }}")
u("{{ x + 1 }}")
u("{{ '%s and %s' % ('a', 1) }} {{ '%d%%' % 5 }} {{ 'v=%r' % 'q' }}")
# comparisons and logic
u("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ none == none }} {{ 1 != 2 }} {{ true == 1 }}")
u("{{ 1 and 'x' }} {{ 0 and 'x' }} {{ 0 or '' or 'z' }} {{ not 1 }} {{ not none }} {{ '' or [] }}|{{ x is defined and x.y }}")
u("{{ 'ab' in 'cabd' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1, 2] }} {{ 'x' in undefined_thing }}")
u("{{ 'a' < 1 }}")
u("{{ 1 in 'abc' }}")
u("{{ 'yes' if x else 'no' }} {{ 'yes' if y else 'no' }} [{{ 'only' if y }}] {{ 'a' if false else 'b' if true else 'c' }}", x=1, y=0)
# tests
u("{% for v in [none, true, false, 0, 1, -3, 2.5, 'str', '', [], [1], {}, {'a': 1}, (1,)] %}"
  "{{ v is none }}{{ v is boolean }}{{ v is true }}{{ v is false }}{{ v is integer }}{{ v is float }}{{ v is number }}"
  "{{ v is string }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is defined }}{{ v is callable }}\n{% endfor %}")
u("{{ u is defined }} {{ u is undefined }} {{ u is iterable }} {{ u is sequence }} {{ u is none }} {{ u is string }}")
u("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 10 is divisibleby(4) }} {{ 2 is eq 2 }} {{ 2 is equalto 3 }}"
  " {{ 2 is ne 3 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 2 is le 2 }} {{ 2 is ge 3 }} {{ 1 is in [1] }}")
u("{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aBc' is lower }} {{ none is sameas none }} {{ true is sameas true }}"
  " {{ 1 is sameas true }} {{ x is not none }} {{ x is not defined }} {{ range is callable }} {{ m is callable }}", x=1, m=None)
# attribute and item access, undefined
u("{{ d.a }} {{ d['a'] }} {{ d.missing }}|{{ d['missing'] }}|{{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ l.0 }} {{ s[1] }} {{ s[-1] }} {{ t[1] }}",
  d={"a": 1}, l=[10, 20, 30], s="héllo", t=[1, 2])
u("{{ foo }}|{{ foo|length }}|{% for x in foo %}a{% else %}E{% endfor %}|{{ foo|default('dflt') }}|{{ foo is defined }}|{{ foo|string }}|{{ foo|trim }}")
u("{{ foo.bar }}")
u("{{ d.bar.baz }}", d={})
u("{{ foo() }}")
u("{{ [1].append(2) }}")
u("{{ d.update({'a': 2}) }}", d={"a": 1})
u("{{ 'abc'.nosuch() }}")
u("{{ none.x }}|{{ 5.x }}|{{ 'str'.y }}")
# slicing
u("{{ 'abcdef'[1:4] }} {{ 'abcdef'[::-1] }} {{ 'abcdef'[::2] }} {{ 'abcdef'[-2:] }} {{ 'abcdef'[:-2] }} {{ [1,2,3,4][1:] }}"
  " {{ [1,2,3,4][::-2] }} {{ [1,2,3][5:] }} {{ 'héllo'[1:3] }} {{ [1,2,3,4][-3:-1] }} {{ [1,2,3,4][3:0:-1] }} {{ 'abc'[10:] }}|")
# for loops
u("{% for i in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
  "{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }}{{ loop.depth }};{% endfor %}")
u("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}",
  d={"z": 1, "a": 2, "m": 3})
u("{% for i in range(10) if i is odd %}{{ i }}{{ loop.length }}{% if loop.last %}!{% endif %}{% endfor %}")
u("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}")
u("{% for m in ms %}{% if loop.changed(m.role) %}[{{ m.role }}]{% endif %}{{ m.t }}{% endfor %}",
  ms=[{"role": "user", "t": 1}, {"role": "user", "t": 2}, {"role": "assistant", "t": 3}, {"role": "user", "t": 4}])
u("{% for i in [] %}x{% else %}empty{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}")
u("{% for i in [1, 2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}[{{ x }}]")
u("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }}")
u("{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}")
u("{% for item in tree recursive %}{{ item.name }}{% if item.children %}({{ loop(item.children) }}){% endif %}{{ loop.depth }} {% endfor %}",
  tree=[{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c", "children": [{"name": "d"}]}]}, {"name": "e"}])
u("{% for a, b in [(1, 2, 3)] %}{% endfor %}")
u("{% for i in 5 %}{% endfor %}")
# set, namespace, block set, with
u("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = [1, 2] %}{{ c }}{% set t = 1, %}{{ t }}")
u("{% set ns = namespace(a=1, b='x') %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns.c }}|{{ ns }}")
u("{% set ns = namespace({'k': 1}) %}{{ ns.k }}")
u("{% set ns = namespace(_x=1) %}")
u("{% set ns = namespace() %}{% set ns._x = 1 %}")
u("{% set d = {} %}{% set d.x = 1 %}")
u("{% set block %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ block }}]{% set up | upper %}shout{% endset %}{{ up }}")
u("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]")
u("{{ dict(a=1, b='two') }} {{ dict([('x', 1)]) }} {{ dict(a=1).items() | list }}")
# macros and call blocks
u("{% macro m(a, b=2, c='x') %}{{ a }}{{ b }}{{ c }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='y') }}|{{ m(1, 2, 3, 4) }}|{{ m(1, z=5) }}|{{ m() }}")
u("{% macro outer(x) %}<{{ caller(x * 2) }}>{% endmacro %}{% call(v) outer(21) %}got {{ v }}{% endcall %}")
u("{% macro r(n) %}{% if n > 0 %}{{ n }}{{ r(n - 1) }}{% endif %}{% endmacro %}{{ r(5) }}")
u("{% macro m() %}{{ caller() if caller is defined else 'no caller' }}{% endmacro %}{{ m() }}|{% call m() %}yes{% endcall %}")
u("{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}")
# filter blocks
u("{% filter upper %}hello {{ 'world' }}{% endfilter %}|{% filter trim | replace('a', 'b') %}  aaa  {% endfilter %}")
# filters
u("{{ '  x y  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'abc' | length }} {{ [1, 2] | count }} {{ {'a': 1} | length }} {{ 'héllo' | length }}")
u("{{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ 'abc' | first }} {{ [] | first }}|{{ {'a': 1, 'b': 2} | first }}")
u("{{ [1, 2, 3] | join(', ') }} {{ ['a', 'b'] | join }} {{ [{'n': 'x'}, {'n': 'y'}] | join('-', attribute='n') }} {{ [1, none, 'x'] | join('|') }}")
u("{{ 'abc' | list }} {{ {'a': 1, 'b': 2} | list }} {{ (1, 2) | list }} {{ u | list }}")
u("{{ [1, 2, 3] | map('string') | list }} {{ [{'a': {'b': 1}}, {'a': {'b': 2}}] | map(attribute='a.b') | list }}"
  " {{ [{'a': 1}, {}] | map(attribute='a', default=0) | list }} {{ ['a', 'B'] | map('upper') | join }} {{ [[1, 2], [3]] | map('length') | list }}")
u("{{ [0, 1, 2, 3, none, ''] | select | list }} {{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }}"
  " {{ [1, 2, 3] | select('gt', 1) | list }} {{ [1, 2, 3] | select('divisibleby', 3) | list }} {{ ['a', 'b'] | reject('equalto', 'a') | list }}")
u("{{ users | selectattr('active') | map(attribute='name') | list }} {{ users | rejectattr('active') | map(attribute='name') | list }}"
  " {{ users | selectattr('role', 'equalto', 'admin') | map(attribute='name') | join }} {{ users | selectattr('age', 'ge', 30) | list | length }}"
  " {{ users | selectattr('nick', 'defined') | map(attribute='nick') | list }} {{ users | selectattr('nick', 'undefined') | list | length }}",
  users=[{"name": "ann", "active": True, "role": "admin", "age": 31, "nick": "a"},
         {"name": "bob", "active": False, "role": "user", "age": 25}, {"name": "cy", "active": True, "role": "user", "age": 40}])
u("{{ d | items | list }} {{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 7) }} {{ u | items | list }}",
  d={"b": 1, "a": 2})
u("{{ u | default('x') }} {{ '' | default('x') }} {{ '' | default('x', true) }} {{ none | default('x') }} {{ none | d('y', true) }} {{ 0 | default(5, boolean=true) }}")
u("{{ '42' | int }} {{ '4.7' | int }} {{ 4.7 | int }} {{ 'x' | int }} {{ 'x' | int(9) }} {{ '0x1A' | int(0, 16) }} {{ true | int }} {{ ' 12 ' | int }}"
  " {{ '3.5' | float }} {{ 3 | float }} {{ 'no' | float }} {{ 1 | string }} {{ [1] | string }} {{ none | string }}")
u("{{ 'hello WORLD' | lower }} {{ 'hello' | upper }} {{ 'hello world-foo (bar) x.y' | title }} {{ 'hELLO wORLD' | capitalize }} {{ 'émile' | upper }}")
u("{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc' | replace('', '-') }} {{ 'a.b.c' | replace('.', '') }}")
u("{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb\n\nc' | indent(2, true) }}|{{ 'a\nb\n\nc' | indent(2, first=true, blank=true) }}|{{ 'x\n' | indent('> ') }}|{{ '' | indent(first=true) }}")
u("{{ [1, 2, 1, 3, 2] | unique | list }} {{ ['a', 'A', 'b'] | unique | list }} {{ ['a', 'A', 'b'] | unique(true) | list }}")
u("{{ {'b': 1, 'a': 3, 'C': 2} | dictsort }} {{ {'b': 1, 'a': 3, 'C': 2} | dictsort(true) }} {{ {'b': 1, 'a': 3} | dictsort(by='value') }} {{ {'b': 1, 'a': 3} | dictsort(reverse=true) }}")
u("{{ [3, 1, 2] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}"
  " {{ [{'n': 2}, {'n': 1}] | sort(attribute='n') | map(attribute='n') | list }} {{ [(2, 'b'), (1, 'z'), (2, 'a')] | sort }}")
u("{{ 2.5 | round }} {{ 3.5 | round }} {{ 3.14159 | round(2) }} {{ 2.675 | round(2) }} {{ 3.7 | round(0, 'floor') }} {{ 3.2 | round(method='ceil') }} {{ 7 | round }}")
u("{{ -3 | abs }} {{ -2.5 | abs }} {{ [1, 2, 3] | sum }} {{ [{'v': 1}, {'v': 2}] | sum(attribute='v') }} {{ [1, 2] | sum(start=10) }}"
  " {{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A'] | min }} {{ [] | max }}|{{ [{'a': 2}, {'a': 1}] | max(attribute='a') }}")
u("{{ '<a href=\"x\">&\\'</a>' | e }} {{ '<b>' | escape }} {{ '<i>' | safe }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }}")
u("{{ 'one two  three' | wordcount }} {{ [1, 2, 3, 4, 5] | batch(2) | list }} {{ [1, 2, 3] | batch(2, 'x') | list }} {{ '%s-%s' | format(1, 'a') }}"
  " {{ 'hello world foo bar' | truncate(9) }} {{ 'hello world foo bar' | truncate(9, true) }} {{ 'short' | truncate(100) }} {{ 'ab' | center(6) }}|")
u("{{ d | attr('a') }} {{ [1, 2] | map('abs') | list }} {{ 'x' | tojson }} {{ none | tojson }} {{ 1.5 | tojson }} {{ (1, 'a') | tojson }}", d={"a": 9})
u("{{ u | tojson }}")
u("{{ x | nosuchfilter }}", x=1)
u("{{ x is nosuchtest }}", x=1)
u("{% if false %}{{ x | nosuchfilter }}{% endif %}ok")
u("{% if false %}{{ x | groupby('a') }}{% endif %}ok")
# tojson exactness
u("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(sort_keys=true) }}|{{ d | tojson(ensure_ascii=true) }}|{{ d | tojson(indent=0) }}",
  d={"z": [1, 2.5, "é\"\\\n\t\u0001", None, True], "a": {}, "m": [], "n": {"k": [{"x": 1}]}, "emoji": "😀", "big": 12345678901234, "neg": -0.5})
# string methods
u("{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ '\n\nx\n'.strip('\n') }}")
u("{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ '  a  b '.split(none, 1) }} {{ 'a<x>b<x>c'.split('<x>')[-1] }} {{ ''.split() }} {{ ''.split(',') }}")
u("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.endswith('x') }}")
u("{{ 'a-b'.replace('-', '+') }} {{ 'Hello World'.upper() }} {{ 'Hello World'.lower() }} {{ 'hello world'.title() }} {{ 'hello World'.capitalize() }}"
  " {{ \"they're bill's\".title() }} {{ 'aBc'.swapcase() }}")
u("{{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'abc'.find('z') }} {{ 'abcabc'.count('bc') }} {{ 'hello {} {}'.format(1, 'x') }} {{ 'x={x}'.format(x=2) }}"
  " {{ ', '.join(['a', 'b']) }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }} {{ ' '.isspace() }} {{ 'Ab'.isupper() }} {{ 'ab'.islower() }}")
u("{{ 'a\nb\r\nc'.splitlines() }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ [1, 2, 1].count(1) }} {{ [1, 2, 3].index(2) }}")
# strftime_now: the llama3_1 cases above, and test_template.c, on the fixed clock; raise_exception
u("{{ raise_exception('Custom error: ' ~ 42) }}")
u("before{% if x > 1 %}{{ raise_exception('x too big: ' + x|string) }}{% endif %}", x=5)
# syntax errors
u("{% if x %}unclosed")
u("{% for %}{% endfor %}")
u("{{ 1 + }}")
u("{% endif %}")
u("{% unknown_tag %}")
u("{{ 'unterminated }}")
# sandbox range limit and misc
u("{{ range(5) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ range(0) | list }}")
u("{{ range(200000) | length }}")
u("{% generation %}gen {{ 1 }}{% endgeneration %}")
u("{{ messages[0]['content'] }}", messages=[{"content": "from vars"}])


def render_unit(tpl, vars):
    try:
        return {"expected": _compile_jinja_template(tpl).render(**vars)}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": f"TemplateSyntaxError: {e}", "raised": False, "syntax": True}
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return {"error": str(e), "raised": True}
        return {"error": f"{type(e).__name__}: {e}", "raised": False}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}", "raised": False}


def write_cli_fixture():
    """tests/fixtures/template/cli: a model directory as transformers 5 saves it (chat_template.jinja,
    tokenizer_config.json with AddedToken-dict bos and a string eos), inputs, and what
    apply_chat_template gives, for tests/test_template_cli.sh."""
    d = os.path.join(OUT, "cli")
    os.makedirs(os.path.join(d, "model"), exist_ok=True)
    with open(os.path.join(d, "model", "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(T["qwen3"])
    with open(os.path.join(d, "model", "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": {"content": "<|bos|>", "lstrip": False, "normalized": False, "rstrip": False,
                                 "single_word": False, "special": True}, "eos_token": "<|im_end|>"}, f, indent=1)
    with open(os.path.join(d, "mistral.jinja"), "w", encoding="utf-8") as f:
        f.write(T["mistral"])
    sets = {"tools": SETS["tools"], "reasoning": SETS["reasoning"], "bad": SETS["bad_alternation"], "vision": SETS["vision_ids"]}
    for k, v in sets.items():
        with open(os.path.join(d, f"{k}_messages.json"), "w", encoding="utf-8") as f:
            json.dump(v["messages"], f, ensure_ascii=False, indent=1)
    with open(os.path.join(d, "tools.json"), "w", encoding="utf-8") as f:
        json.dump(TOOLS, f, indent=1)
    base = {"bos_token": "<|bos|>", "eos_token": "<|im_end|>"}
    def out(name, tpl, msgs, **kw):
        r, _ = render_jinja_template(conversations=[msgs], chat_template=tpl, **dict(base, **kw))
        with open(os.path.join(d, name), "w", encoding="utf-8", newline="") as f:
            f.write(r[0])
    out("expected_tools_nothink.txt", T["qwen3"], SETS["tools"]["messages"], tools=TOOLS, add_generation_prompt=True,
        enable_thinking=False)
    out("expected_reasoning_nogen.txt", T["qwen3"], SETS["reasoning"]["messages"], add_generation_prompt=False)
    out("expected_vision_ids.txt", T["qwen2_vl"], SETS["vision_ids"]["messages"], add_generation_prompt=True,
        add_vision_id=True)
    with open(os.path.join(d, "qwen2_vl.jinja"), "w", encoding="utf-8") as f:
        f.write(T["qwen2_vl"])


def main():
    os.makedirs(OUT, exist_ok=True)
    sets = {}
    for name, s in SETS.items():
        sets[name] = {"messages": s["messages"], "tools": s.get("tools"), "documents": s.get("documents"),
                      "add_generation_prompt": s.get("add_generation_prompt", True),
                      "extra": dict({"bos_token": "<s>", "eos_token": "</s>"}, **s.get("extra", {}))}
    chat = []
    for tname, tpl in T.items():
        for sname, s in SETS.items():
            chat.append(dict({"template": tname, "set": sname}, **render_case(tpl, s)))
    units = [dict({"template": tpl, "vars": vars}, **render_unit(tpl, vars)) for tpl, vars in U]
    doc = {"generator": "tools/ref/gen_template.py", "transformers": transformers.__version__, "jinja2": jinja2.__version__,
           "templates": T, "message_sets": sets, "chat": chat, "units": units}
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    write_cli_fixture()
    nerr = sum("error" in c for c in chat)
    print(f"wrote {len(chat)} chat cases ({nerr} errors) over {len(T)} templates x {len(SETS)} message sets, "
          f"{len(units)} units ({sum('error' in x for x in units)} errors) to {OUT}/cases.json")


if __name__ == "__main__":
    main()
