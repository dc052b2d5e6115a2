"""The tiny model's chat template: Qwen2.5's format, changed only where Qwen's is not prefix-stable.

Format::

    <|im_start|>system
    {system}[\\n\\n# Tools ... <tools>{one JSON schema per line}</tools> ...]<|im_end|>
    <|im_start|>user
    {content}<|im_end|>
    <|im_start|>assistant
    {content}[\\n]<tool_call>
    {"name": ..., "arguments": {...}}
    </tool_call><|im_end|>
    <|im_start|>user
    <tool_response>
    {tool result}
    </tool_response><|im_end|>

Invariant (prefix stability, which the token-in/token-out agent loop relies on): for every k, the rendering of
``messages[:k]`` (without a generation prompt) is a prefix of the rendering of ``messages[:k+1]``. Qwen2.5 merges
consecutive tool messages into one user turn, which breaks this; here every tool message is its own turn. No default
system prompt is inserted and no earlier turn's content is rewritten (Qwen3 strips old ``<think>`` blocks).
"""

CHAT_TEMPLATE = r"""
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable and content is not mapping -%}
{%- for part in content -%}{%- if part is mapping and part.text is defined -%}{{ part.text }}{%- elif part is string -%}{{ part }}{%- endif -%}{%- endfor -%}
{%- elif content is not none -%}{{ content }}
{%- endif -%}
{%- endmacro -%}
{%- set first_is_system = messages | length > 0 and messages[0].role == 'system' -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if first_is_system -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif first_is_system -%}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if loop.first and first_is_system -%}
{#- rendered above -#}
{%- elif message.role == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + text(message.content) + '\n</tool_response><|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' + text(message.content) -}}
{%- for tool_call in (message.tool_calls or []) -%}
{%- if tool_call.function is defined -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
{%- if not loop.first or text(message.content) -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' -}}
{%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}{%- else -%}{{- tool_call.arguments | tojson -}}{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()
