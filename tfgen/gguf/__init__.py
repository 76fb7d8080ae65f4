"""GGUF files (llama.cpp's single-file checkpoints) as tfgen checkpoints.

`tfgen.gguf.layout` checks a file's layout as llama.cpp does (counts, lengths, tensor offsets) before
`tfgen.gguf.files` opens it with gguf-py and reads its metadata with typed checks, `tfgen.gguf.config` turns the
metadata into an HF-style config dict, `tfgen.gguf.tensors` renames the tensors to HF names and dequantizes them to
float32 (undoing llama.cpp's rotary row permutation for the `llama` architecture), and `tfgen.gguf.tokenizer` rebuilds
the tokenizer from the vocabulary stored in the file. `AutoModelForCausalLM.from_pretrained` and
`Tokenizer.from_pretrained` take a `.gguf` path through these. Only `is_gguf_path` and `refuse_hub_options` are
imported here, so that the checks cost nothing; the rest imports `gguf` and numpy on first use.

`tfgen.gguf.load_cache` keeps what a load builds (tokenizer, config, float32 weights) on disk under the file's
SHA-256, so that a later load of the same file parses nothing.

May import `tfgen.models` (RoPE parameters), `tfgen.text`, `tfgen.generation.compile_cache` (the cache folder) and
`tfgen.generation.cache_entries` (reading an entry safely), and the leaf utilities.
"""

from tfgen.gguf.files import is_gguf_path, refuse_hub_options

__all__ = ["is_gguf_path", "refuse_hub_options"]
