"""`AutoTokenizer`: the tokenizer of a checkpoint, whatever its source (as HF's `AutoTokenizer` picks a class): HF
tokenizer files (a directory or Hub id), a GGUF file's vocabulary, or a keras-hub preset's preprocessor."""

from __future__ import annotations

import os

from tfgen.auto.sources import resolve_source
from tfgen.gguf import is_gguf_path, refuse_hub_options
from tfgen.gguf.tokenizer import load_gguf_tokenizer
from tfgen.keras_hub.presets import is_keras_hub_preset
from tfgen.keras_hub.tokenizer import KerasHubTokenizer
from tfgen.text.tokenizer import Tokenizer
from tfgen.text.tokenizer_base import BaseTokenizer


class AutoTokenizer:
    """Picks the tokenizer of a checkpoint by its source; use `from_pretrained`."""

    def __init__(self):
        raise TypeError("AutoTokenizer is not instantiable; use AutoTokenizer.from_pretrained()")

    @classmethod
    def from_pretrained(
        cls,
        path_or_repo_id: str | os.PathLike,
        *,
        revision: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        token: str | bool | None = None,
        local_files_only: bool | None = None,
        padding_side: str = "left",
    ) -> BaseTokenizer:
        """The tokenizer at `path_or_repo_id` (a registered model name, `"smollm2-135m-instruct"`, stands for its
        cached or pulled files, as in `AutoModelForCausalLM.from_pretrained`):
        - a GGUF file (a path ending in `.gguf`): the vocabulary, special tokens and chat template stored in it
          (`tfgen.gguf.tokenizer`), a `tfgen.Tokenizer`;
        - a keras-hub preset directory: its causal-LM preprocessor's tokenizer, a `tfgen.keras_hub.KerasHubTokenizer`;
        - else HF tokenizer files in a directory or Hub snapshot: `tfgen.Tokenizer.from_pretrained`.
        A GGUF file and a preset are read from their local path: `revision`, `cache_dir` and `token` are refused with
        them (ValueError). Errors as `tfgen.Tokenizer.from_pretrained`'s (OSError naming the file or path)."""
        path_or_repo_id = resolve_source(path_or_repo_id, local_files_only=local_files_only, revision=revision,
                                         cache_dir=cache_dir, token=token)
        if is_gguf_path(path_or_repo_id):
            refuse_hub_options(path_or_repo_id, revision=revision, cache_dir=cache_dir, token=token)
            return load_gguf_tokenizer(path_or_repo_id, padding_side=padding_side)
        if is_keras_hub_preset(path_or_repo_id):
            refuse_hub_options(path_or_repo_id, "keras-hub preset", revision=revision, cache_dir=cache_dir, token=token)
            return KerasHubTokenizer.from_preset(path_or_repo_id, padding_side=padding_side)
        return Tokenizer.from_pretrained(path_or_repo_id, revision=revision, cache_dir=cache_dir, token=token,
                                         local_files_only=local_files_only, padding_side=padding_side)
