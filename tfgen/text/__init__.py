"""Text and token ids: the tokenizer (HF `tokenizer.json` files, left padding, incremental decoding), reading a
checkpoint's tokenizer files, chat templates (HF's Jinja rules), a multi-turn conversation (`conversation`), and what
text each token id spells (`token_text`: the tables that stop strings and structured output are built over).

Imports only the leaf utilities: no source format (GGUF, keras-hub) is known here; `tfgen.auto` picks them.
"""
