"""Chat templates of published models (and two written here to reach the rest of HF's Jinja environment), used by
tests/test_chat_template.py to compare tfgen's rendering with HF transformers' byte for byte."""

# SmolLM2-135M-Instruct's, verbatim from the GGUF file that `tfgen pull smollm2-135m-instruct` fetches
# (`gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()`): a default system prompt when the
# conversation has none, ChatML turns, newlines written inside the Jinja strings.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2.5-Instruct's: ChatML with a default system prompt, tools as JSON lines, tool calls, grouped tool responses
# (loop.last, loop.index0 look-arounds), whitespace control on every tag.
QWEN2_5 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
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

# Meta-Llama-3-Instruct's: bos_token before the first turn, each message trimmed.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

# Mistral-7B-Instruct-v0.1's: bos and eos tokens, raise_exception for roles out of turn or unknown.
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)

# DeepSeek-R1-style: a namespace collecting the system prompt, {% continue %}, loop.last, a {% generation %} block
# (training templates mark the assistant's text with it), non-ASCII markers; written with block tags on their own
# lines, so trim_blocks / lstrip_blocks decide the whitespace.
NAMESPACE = """{% set ns = namespace(system_prompt='', turns=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' %}
        {% set ns.system_prompt = message['content'] %}
    {% endif %}
{% endfor %}
{{ bos_token }}{{ ns.system_prompt }}
{% for message in messages %}
    {% if message['role'] == 'system' %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
    {% if message['role'] == 'user' %}
<｜User｜>{{ message['content'] }}
    {% elif message['role'] == 'assistant' %}
{% generation %}<｜Assistant｜>{{ message['content'] }}<｜end▁of▁sentence｜>{% endgeneration %}

    {% endif %}
    {% if loop.last and message['role'] == 'user' and add_generation_prompt %}
<｜Assistant｜>
    {% endif %}
{% endfor %}
({{ ns.turns }} turns)
"""

# The rest of the environment: documents, tojson's options (no HTML escaping, non-ASCII kept, indent), {% break %},
# a caller's variable (enable_thinking), an undefined one (max_turns), strftime_now.
ENVIRONMENT = """{% if documents %}
Documents:
{% for document in documents %}
{{ loop.index }}. {{ document | tojson(indent=2) }}
{% endfor %}
{% endif %}
{% for message in messages %}
    {% if loop.index > max_turns | default(3) %}{% break %}{% endif %}
    {{ message.role }}: {{ message.content | tojson }}
{% endfor %}
{% if enable_thinking is defined and not enable_thinking %}
/no_think
{% endif %}
Today is {{ strftime_now("%d %B %Y") }}.{{ eos_token }}
"""
