# ruff: noqa: E501  (jinja template lines)
"""The chat template of the local llama.cpp server: SmolLM2's ChatML template with tool calling in
the Hermes form (`<tool_call>` JSON `</tool_call>`), so that llama.cpp's server (jinja) offers the
tools, parses the call a model writes and streams it as OpenAI `tool_calls`; `tool` messages go
back as `<tool_response>`. Without tools it renders as the model's own template. A Python string,
not a data file, so that every install carries it."""

CHATML_TOOLS = r"""{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}
{%- set has_system = messages and messages[0]['role'] == 'system' -%}
{{- '<|im_start|>system\n' + (messages[0]['content'] if has_system else default_system) -}}
{%- if tools -%}
{{- '\n\n# Tools\n\nYou may call functions. Their signatures are within <tools></tools>:\n<tools>' -}}
{%- for tool in tools %}{{ '\n' + (tool | tojson) }}{% endfor -%}
{{- '\n</tools>\n\nTo call one, write a JSON object with its name and arguments within <tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- for message in messages -%}
{%- if loop.first and has_system -%}
{%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}
{{- '<|im_start|>assistant\n' + (message['content'] or '') -}}
{%- for call in message['tool_calls'] -%}
{%- set arguments = call['function']['arguments'] -%}
{{- '\n<tool_call>\n{"name": "' + call['function']['name'] + '", "arguments": ' + (arguments if arguments is string else (arguments | tojson)) + '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message['role'] == 'tool' -%}
{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
