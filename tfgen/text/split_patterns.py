"""The pre-tokenizer regular expressions of byte-level BPE tokenizers (Oniguruma syntax, as HF `tokenizers` and
llama.cpp run them): one place for the GGUF tokenizer (`tfgen.gguf.tokenizer`) and their in-graph form
(`tfgen.text.split_graph`)."""

# GPT-2's split: contractions, letters, digits and other symbols each with one leading space, and runs of spaces.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# HF's ByteLevel pre-tokenizer (use_regex=True) runs GPT-2's split with a last `\s+` alternative.
BYTE_LEVEL_SPLIT = GPT2_SPLIT + r"|\s+"
# Llama 3 / Qwen2: case-insensitive contractions, a word with at most one leading non-letter, numbers of 1-3 digits
# (Qwen2: single digits), symbols with one leading space and their trailing newlines, then newline and space runs.
_WORDS_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = _WORDS_SPLIT % "{1,3}"
QWEN2_SPLIT = _WORDS_SPLIT % ""
