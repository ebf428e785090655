#!/usr/bin/env python3
"""make_arch_ref.py — one small random-weight model of each architecture
beyond plain Llama, saved as HF model folders with transformers' fp32
logits, for tests/test_arch.c; plus the chat templates of the families.

Builds, with `torch`, `transformers` and `tokenizers` (and the helpers of
make_hf_tiny.py, next to this script):
  OUTDIR/arch/llama31/   LlamaForCausalLM with rope_scaling "llama3" (factor 8,
                         low/high frequency factors 1/4, original context 32):
                         every wavelength above 32 positions is stretched 8x,
                         so a 300-token prompt differs clearly from unscaled
                         RoPE. Llama-3-style tokenizer (make_hf_tiny's).
  OUTDIR/arch/qwen2/     Qwen2ForCausalLM: Q/K/V biases (drawn N(0, 0.5), so
                         they matter), tied embeddings as the small Qwen2.5s.
                         Qwen2 tokenizer (the qwen2 split regex, NFC
                         normalizer, ChatML specials), Qwen2.5's chat template.
  OUTDIR/arch/qwen3/     Qwen3ForCausalLM: per-head q/k RMSNorm (weights
                         1 + N(0, 0.3)), 4 query heads of 64 on a width of
                         128 (q_dim 256 != width), 2 KV heads, untied. The
                         Qwen2 tokenizer, Qwen3's chat template.
  OUTDIR/arch/mistral/   MistralForCausalLM with sliding_window 16 (prompts of
                         50-70 tokens), Mistral-Nemo-style tokenizer (the
                         tekken split regex, BOS added) and its v3-tekken
                         template.
  OUTDIR/arch/<name>_logits.bin   fp32 logits at every position of each
                         prompt, transformers reading the saved folder with
                         dtype float32 and eager attention, on the CPU
  OUTDIR/arch_ref.txt    versions; tokenizer ids of test strings for the qwen2
                         and tekken tokenizers; chat renderings of the Qwen2.5,
                         Qwen3 and the four Mistral templates

Models: 2 layers, width 128, head size 64 (what the GPU kernels take), FFN
192, vocabulary 416 (tokenizers of 400), weights N(0, 0.08), norms
1 + N(0, 0.2), stored BF16 (norms F32), as make_hf_tiny.py draws them.

The chat templates are the models' own, as llama.cpp quotes them
(models/templates/Qwen-Qwen2.5-7B-Instruct.jinja, Qwen-Qwen3-0.6B.jinja;
the Mistral v1 / v3 / v3-tekken / v7 templates of tests/test-chat-template.cpp,
the last two "modified to have system prompt at start" there). Renderings are
recorded for chats on which llama.cpp's renderer and the Jinja template
agree (the v3 templates put a system prompt before the last user turn, where
llama.cpp and NSTF put it first: those chats have no system message).

_logits.bin (little-endian), as make_hf_tiny.py's:
  char[8] "NSTFHF01"; int32 n_prompts, n_vocab;
  per prompt: int32 n_tok; int32 ids[n_tok]; float32 logits[n_tok][n_vocab]
arch_ref.txt records (text fields hex of their UTF-8):
  tok VARIANT HEX_TEXT ID ...        tokenizer(text) ids
  chat VARIANT HEX_RENDERED          the tokenizer's own template on make_hf_tiny's CHAT
  tmpl NAME HEX_TEMPLATE             a chat template
  tchat NAME CHAT_INDEX HEX_RENDERED apply_chat_template(CHATS[i], add_generation_prompt)
                                     of template NAME, less the BOS text it writes

usage: python3 make_arch_ref.py OUTDIR     (OUTDIR = tests/data)
"""
import os
import shutil
import struct
import sys

import numpy as np
import torch
from tokenizers import Regex, normalizers, pre_tokenizers, processors
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_tiny as tiny  # noqa: E402  (train, save_tokenizer, records, texts, Llama-3 pieces)

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN25_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == "
    "\"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n            {{- '\\n' + message.content }}\n        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")

QWEN3_TEMPLATE = (
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n"
    '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nY'
    'ou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and'
    ' arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-nam'
    'e>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n{%- else %}\n'
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {%- endif %}\n"
    '{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n'
    '{%- for message in messages[::-1] %}\n    {%- set index = (messages|length - 1) - loop.index0 %}\n'
    '    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswit'
    "h('<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    '        {%- set ns.multi_step_tool = false %}\n        {%- set ns.last_query_index = index %}\n'
    '    {%- endif %}\n{%- endfor %}\n{%- for message in messages %}\n'
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n        {%- set content = message.content %}\n'
    "        {%- set reasoning_content = '' %}\n"
    '        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n'
    '            {%- set reasoning_content = message.reasoning_content %}\n        {%- else %}\n'
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\"
    "n').split('<think>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        {%- endif %}\n"
    '        {%- if loop.index0 > ns.last_query_index %}\n'
    '            {%- if loop.last or (not loop.last and reasoning_content) %}\n'
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.stri"
    "p('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n            {%- endif %}\n"
    "        {%- else %}\n            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    '        {%- endif %}\n        {%- if message.tool_calls %}\n'
    '            {%- for tool_call in message.tool_calls %}\n'
    "                {%- if (loop.first and content) or (not loop.first) %}\n                    {{- '\\n' }}\n"
    '                {%- endif %}\n                {%- if tool_call.function %}\n'
    '                    {%- set tool_call = tool_call.function %}\n                {%- endif %}\n'
    '                {{- \'<tool_call>\\n{"name": "\' }}\n                {{- tool_call.name }}\n'
    '                {{- \'", "arguments": \' }}\n                {%- if tool_call.arguments is string %}\n'
    '                    {{- tool_call.arguments }}\n                {%- else %}\n'
    '                    {{- tool_call.arguments | tojson }}\n                {%- endif %}\n'
    "                {{- '}\\n</tool_call>' }}\n            {%- endfor %}\n        {%- endif %}\n"
    '        {{- \'<|im_end|>\\n\' }}\n    {%- elif message.role == "tool" %}\n'
    '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n"
    '    {%- if enable_thinking is defined and enable_thinking is false %}\n'
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}")

MISTRAL_V1_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n"
    '    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n'
    '{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n'
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('After the optional system message, conversation roles must al"
    "ternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n"
    '        {%- if loop.first and system_message is defined %}\n'
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
    "        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n"
    '    {%- else %}\n'
    "        {{- raise_exception('Only user and assistant roles are supported, with the excepti"
    "on of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n")

MISTRAL_V3_TEMPLATE = (
    '{%- if messages[0]["role"] == "system" %}\n    {%- set system_message = messages[0]["content"] %}\n'
    '    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n'
    '{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n'
    '{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n\n'
    '{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n'
    '{%- set ns = namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n'
    '    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_'
    'calls is defined and message.tool_calls is not none)) %}\n'
    '        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n'
    '            {{- raise_exception("After the optional system message, conversation roles mus'
    't alternate user/assistant/user/assistant/...") }}\n        {%- endif %}\n'
    '        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n'
    '{%- for message in loop_messages %}\n    {%- if message["role"] == "user" %}\n'
    '        {%- if tools is not none and (message == user_messages[-1]) %}\n'
    '            {{- "[AVAILABLE_TOOLS] [" }}\n            {%- for tool in tools %}\n'
    '                {%- set tool = tool.function %}\n'
    '                {{- \'{"type": "function", "function": {\' }}\n'
    '                {%- for key, val in tool.items() if key != "return" %}\n'
    '                    {%- if val is string %}\n'
    '                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n                    {%- else %}\n'
    '                        {{- \'"\' + key + \'": \' + val|tojson }}\n                    {%- endif %}\n'
    '                    {%- if not loop.last %}\n                        {{- ", " }}\n'
    '                    {%- endif %}\n                {%- endfor %}\n                {{- "}}" }}\n'
    '                {%- if not loop.last %}\n                    {{- ", " }}\n                {%- else %}\n'
    '                    {{- "]" }}\n                {%- endif %}\n            {%- endfor %}\n'
    '            {{- "[/AVAILABLE_TOOLS]" }}\n            {%- endif %}\n'
    '        {%- if loop.last and system_message is defined %}\n'
    '            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n'
    '        {%- else %}\n            {{- "[INST] " + message["content"] + "[/INST]" }}\n        {%- endif %}\n'
    '    {%- elif message.tool_calls is defined and message.tool_calls is not none %}\n'
    '        {{- "[TOOL_CALLS] [" }}\n        {%- for tool_call in message.tool_calls %}\n'
    '            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n'
    '            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n'
    '                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
    '            {%- endif %}\n            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n'
    '            {%- if not loop.last %}\n                {{- ", " }}\n            {%- else %}\n'
    '                {{- "]" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n'
    '    {%- elif message["role"] == "assistant" %}\n        {{- " " + message["content"]|trim + eos_token}}\n'
    '    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n'
    '        {%- if message.content is defined and message.content.content is defined %}\n'
    '            {%- set content = message.content.content %}\n        {%- else %}\n'
    '            {%- set content = message.content %}\n        {%- endif %}\n'
    '        {{- \'[TOOL_RESULTS] {"content": \' + content|string + ", " }}\n'
    '        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n'
    '            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
    '        {%- endif %}\n        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n'
    '    {%- else %}\n'
    '        {{- raise_exception("Only user and assistant roles are supported, with the excepti'
    'on of an initial optional system message!") }}\n    {%- endif %}\n{%- endfor %}\n')

MISTRAL_V3_TEKKEN_TEMPLATE = (
    '{%- if messages[0]["role"] == "system" %}\n    {%- set system_message = messages[0]["content"] %}\n'
    '    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n'
    '{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n'
    '{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}\n\n'
    '{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}\n'
    '{%- set ns = namespace() %}\n{%- set ns.index = 0 %}\n{%- for message in loop_messages %}\n'
    '    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_'
    'calls is defined and message.tool_calls is not none)) %}\n'
    '        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}\n'
    '            {{- raise_exception("After the optional system message, conversation roles mus'
    't alternate user/assistant/user/assistant/...") }}\n        {%- endif %}\n'
    '        {%- set ns.index = ns.index + 1 %}\n    {%- endif %}\n{%- endfor %}\n\n{{- bos_token }}\n'
    '{%- for message in loop_messages %}\n    {%- if message["role"] == "user" %}\n'
    '        {%- if tools is not none and (message == user_messages[-1]) %}\n'
    '            {{- "[AVAILABLE_TOOLS][" }}\n            {%- for tool in tools %}\n'
    '                {%- set tool = tool.function %}\n'
    '                {{- \'{"type": "function", "function": {\' }}\n'
    '                {%- for key, val in tool.items() if key != "return" %}\n'
    '                    {%- if val is string %}\n'
    '                        {{- \'"\' + key + \'": "\' + val + \'"\' }}\n                    {%- else %}\n'
    '                        {{- \'"\' + key + \'": \' + val|tojson }}\n                    {%- endif %}\n'
    '                    {%- if not loop.last %}\n                        {{- ", " }}\n'
    '                    {%- endif %}\n                {%- endfor %}\n                {{- "}}" }}\n'
    '                {%- if not loop.last %}\n                    {{- ", " }}\n                {%- else %}\n'
    '                    {{- "]" }}\n                {%- endif %}\n            {%- endfor %}\n'
    '            {{- "[/AVAILABLE_TOOLS]" }}\n            {%- endif %}\n'
    '        {%- if loop.last and system_message is defined %}\n'
    '            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}\n'
    '        {%- else %}\n            {{- "[INST]" + message["content"] + "[/INST]" }}\n        {%- endif %}\n'
    '    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}\n'
    '        {{- "[TOOL_CALLS][" }}\n        {%- for tool_call in message.tool_calls %}\n'
    '            {%- set out = tool_call.function|tojson %}\n            {{- out[:-1] }}\n'
    '            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}\n'
    '                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
    '            {%- endif %}\n            {{- \', "id": "\' + tool_call.id + \'"}\' }}\n'
    '            {%- if not loop.last %}\n                {{- ", " }}\n            {%- else %}\n'
    '                {{- "]" + eos_token }}\n            {%- endif %}\n        {%- endfor %}\n'
    '    {%- elif message["role"] == "assistant" %}\n        {{- message["content"] + eos_token}}\n'
    '    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}\n'
    '        {%- if message.content is defined and message.content.content is defined %}\n'
    '            {%- set content = message.content.content %}\n        {%- else %}\n'
    '            {%- set content = message.content %}\n        {%- endif %}\n'
    '        {{- \'[TOOL_RESULTS]{"content": \' + content|string + ", " }}\n'
    '        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}\n'
    '            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}\n'
    '        {%- endif %}\n        {{- \'"call_id": "\' + message.tool_call_id + \'"}[/TOOL_RESULTS]\' }}\n'
    '    {%- else %}\n'
    '        {{- raise_exception("Only user and assistant roles are supported, with the excepti'
    'on of an initial optional system message!") }}\n    {%- endif %}\n{%- endfor %}\n')

MISTRAL_V7_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] '"
    " + message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROM"
    "PT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %"
    "}{{ ' ' + message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system"
    " and assistant roles are supported!') }}{% endif %}{% endfor %}")

CHATS = [
    tiny.CHAT,
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "  Hi there  "}, {"role": "user", "content": "Who are you?"}],
]
# template name, text, chats it is recorded for (see the docstring)
TEMPLATES = [
    ("qwen2.5", QWEN25_TEMPLATE, [0, 1]),
    ("qwen3", QWEN3_TEMPLATE, [0, 1]),
    ("mistral-v1", MISTRAL_V1_TEMPLATE, [0, 1]),
    ("mistral-v3", MISTRAL_V3_TEMPLATE, [0]),
    ("mistral-v3-tekken", MISTRAL_V3_TEKKEN_TEMPLATE, [0]),
    ("mistral-v7", MISTRAL_V7_TEMPLATE, [0, 1]),
]

LONG = tiny.TRAIN_TEXT[:720].replace("\n", " ")
PROMPTS = {
    "llama31": [tiny.PROMPTS[0], LONG],
    "qwen2": [tiny.PROMPTS[0], tiny.PROMPTS[2], "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"],
    "qwen3": [tiny.PROMPTS[0], tiny.PROMPTS[2], "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"],
    "mistral": [tiny.PROMPTS[1], tiny.TRAIN_TEXT[:300]],
}
SHAPE = dict(vocab_size=tiny.N_VOCAB_MODEL, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
             max_position_embeddings=512, rms_norm_eps=1e-6)


def qwen_tokenizer():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = tiny.train(pre, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.normalizer = normalizers.NFC()
    return tok


def tekken_tokenizer():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(TEKKEN_REGEX), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = tiny.train(pre, ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"], ignore_merges=True)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]),
    ])
    return tok


def llama3_tokenizer():
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(tiny.LLAMA3_REGEX), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = tiny.train(pre, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                           "<|eot_id|>"], ignore_merges=True)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    return tok


def randomize(model, extra=None):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if extra and extra(name, p):
                continue
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    for name, mod in model.named_modules():
        if name.endswith("norm") or name.endswith("layernorm"):
            mod.to(torch.float32)
    return model


def build(name, cls, cfg, fast, out, extra=None):
    d = os.path.join(out, "arch", name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    fast.save_pretrained(d)
    model = randomize(cls(cfg), extra)
    model.save_pretrained(d, safe_serialization=True)
    ref = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    blob = bytearray(b"NSTFHF01") + struct.pack("<ii", len(PROMPTS[name]), tiny.N_VOCAB_MODEL)
    notes = []
    for text in PROMPTS[name]:
        ids = fast(text)["input_ids"]
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0].float().numpy()
        assert logits.shape == (len(ids), tiny.N_VOCAB_MODEL), logits.shape
        blob += struct.pack("<i", len(ids)) + np.asarray(ids, dtype="<i4").tobytes()
        blob += np.ascontiguousarray(logits, dtype="<f4").tobytes()
        notes.append(len(ids))
    with open(os.path.join(out, "arch", f"{name}_logits.bin"), "wb") as f:
        f.write(blob)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    print(f"{d}: {size} bytes; prompts of {notes} tokens")
    return f"# {name}: {cls.__name__}, prompts of {' '.join(map(str, notes))} tokens"


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    lines = tiny.header("make_arch_ref.py")
    os.makedirs(os.path.join(out, "arch"), exist_ok=True)

    qwen = tiny.save_tokenizer(qwen_tokenizer(), os.path.join(out, "arch", "tok_qwen2"), eos_token="<|im_end|>",
                               pad_token="<|endoftext|>", chat_template=QWEN25_TEMPLATE)
    tekken = tiny.save_tokenizer(tekken_tokenizer(), os.path.join(out, "arch", "tok_tekken"), bos_token="<s>",
                                 eos_token="</s>", unk_token="<unk>", chat_template=MISTRAL_V3_TEKKEN_TEMPLATE)
    l3 = tiny.save_tokenizer(llama3_tokenizer(), os.path.join(out, "arch", "tok_llama3"),
                             bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", chat_template=tiny.LLAMA3_TEMPLATE)
    tiny.records("qwen2", qwen, lines)
    tiny.records("tekken", tekken, lines)
    for t in ("tok_qwen2", "tok_tekken", "tok_llama3"):
        shutil.rmtree(os.path.join(out, "arch", t))
    for name, tmpl, chats in TEMPLATES:
        lines.append(f"tmpl {name} {tmpl.encode().hex()}")
        fast = PreTrainedTokenizerFast(tokenizer_object=qwen_tokenizer(), bos_token="<s>", eos_token="</s>",
                                       chat_template=tmpl)
        for i in chats:
            r = fast.apply_chat_template(CHATS[i], tokenize=False, add_generation_prompt=True)
            if "bos_token" in tmpl and r.startswith("<s>"):
                r = r[len("<s>"):]
            lines.append(f"tchat {name} {i} {r.encode().hex()}")

    common = dict(SHAPE, bos_token_id=None, eos_token_id=None)
    cfg = LlamaConfig(**common, num_attention_heads=2, num_key_value_heads=1, rope_theta=10000.0,
                      tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    lines.append(build("llama31", LlamaForCausalLM, cfg, l3, out))

    def qwen2_bias(name, p):
        if name.endswith("bias"):
            p.copy_(0.5 * torch.randn_like(p))
            return True
        return False

    cfg = Qwen2Config(**common, num_attention_heads=2, num_key_value_heads=1, rope_theta=1000000.0,
                      tie_word_embeddings=True, use_sliding_window=False)
    lines.append(build("qwen2", Qwen2ForCausalLM, cfg, qwen, out, qwen2_bias))

    def qk_norm(name, p):
        if name.endswith("q_norm.weight") or name.endswith("k_norm.weight"):
            p.copy_(1.0 + 0.3 * torch.randn_like(p))
            return True
        return False

    cfg = Qwen3Config(**common, num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=1000000.0,
                      tie_word_embeddings=False, use_sliding_window=False)
    qwen3_fast = PreTrainedTokenizerFast(tokenizer_object=qwen_tokenizer(), eos_token="<|im_end|>",
                                         pad_token="<|endoftext|>", chat_template=QWEN3_TEMPLATE)
    lines.append(build("qwen3", Qwen3ForCausalLM, cfg, qwen3_fast, out, qk_norm))

    cfg = MistralConfig(**common, num_attention_heads=2, num_key_value_heads=1, head_dim=64, rope_theta=1000000.0,
                        tie_word_embeddings=False, sliding_window=16)
    lines.append(build("mistral", MistralForCausalLM, cfg, tekken, out))

    with open(os.path.join(out, "arch_ref.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
