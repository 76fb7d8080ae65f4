"""Reading a checkpoint's tokenizer files (HF fast-tokenizer layout) for
`tfgen.text.tokenizer.Tokenizer.from_pretrained`: finding the directory (local or a Hub snapshot), loading
`tokenizer.json`, and picking the special tokens out of the other files. Every malformed file is an `OSError` naming its
path, never a bare JSON or `tokenizers` error."""

from __future__ import annotations

import os
from typing import Any

import tokenizers

from tfgen.local_files import TOKENIZER_JSON_CAP, check_local_path, file_present, read_json_file, read_text_file
from tfgen.value_types import is_integer

SPECIAL_TOKEN_NAMES = ("bos", "eos", "pad")
# Files read from a checkpoint; only tokenizer.json is required.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
)
# HF 4.55 reads a checkpoint's chat template from this file first (`tfgen.text.chat_template.read_chat_template`).
CHAT_TEMPLATE_FILE = "chat_template.jinja"
_TRUE_ENV_VALUES = {"1", "ON", "YES", "TRUE"}


def resolve_checkpoint_directory(
    path_or_repo_id: str,
    revision: str | None,
    cache_dir: str | os.PathLike | None,
    token: str | bool | None,
    local_files_only: bool | None,
) -> str:
    """A local directory holding the tokenizer files: the path itself, or a (possibly cached) hub snapshot.
    FileNotFoundError, before any Hub lookup, for a path such as `./model` that does not exist."""
    if os.path.isdir(path_or_repo_id):
        return path_or_repo_id
    check_local_path(path_or_repo_id)
    import huggingface_hub  # lazy: only hub ids need it

    if local_files_only is None:
        # Read the variable now: huggingface_hub's own flag is frozen when it is first imported.
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE_ENV_VALUES
    try:
        return huggingface_hub.snapshot_download(
            repo_id=path_or_repo_id,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
            allow_patterns=[*TOKENIZER_FILES, CHAT_TEMPLATE_FILE],
        )
    except (OSError, ValueError) as error:  # hub HTTP/connection errors are OSErrors, bad ids ValueErrors
        raise OSError(
            f"cannot load a tokenizer from {path_or_repo_id!r}: it is not a local directory and the Hugging Face "
            f"Hub lookup failed ({type(error).__name__}: {error})"
        ) from error


def load_backend(path: str) -> tokenizers.Tokenizer:
    """The `tokenizers.Tokenizer` of a `tokenizer.json`; OSError naming the file when it is not a regular file, is
    over `tfgen.local_files.TOKENIZER_JSON_CAP` or `tokenizers` rejects it."""
    text = read_text_file(path, "the tokenizer file", TOKENIZER_JSON_CAP)
    try:
        return tokenizers.Tokenizer.from_str(text)
    # The Rust library raises a plain Exception for every problem (not JSON, unknown model type, missing field).
    except Exception as error:  # noqa: BLE001 (see above)
        raise OSError(f"{path!r} is not a tokenizer.json that the tokenizers library can load: {error}") from None


def special_tokens_from_files(directory: str, backend: tokenizers.Tokenizer) -> dict[str, str | None]:
    """`{"bos_token": ..., "eos_token": ..., "pad_token": ...}` from the checkpoint's files: `tokenizer_config.json`,
    then `special_tokens_map.json`, then the padding stored in `tokenizer.json` (pad only); a token still missing is
    looked up by id in `generation_config.json`, then `config.json` (`eos_token_id` lists use their first id)."""
    paths = [os.path.join(directory, name) for name in TOKENIZER_FILES[1:]]
    tokenizer_config, special_tokens_map, generation_config, model_config = (read_json_object(p) for p in paths)
    stored_padding = backend.padding or {}
    token_sources = [
        (paths[0], tokenizer_config), (paths[1], special_tokens_map), ("tokenizer.json", stored_padding)
    ]
    id_sources = (generation_config, model_config)
    special_tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        token_key, id_key = f"{name}_token", f"{name}_token_id"
        content = next(
            (_token_content(source[token_key], path, token_key) for path, source in token_sources
             if source.get(token_key)),
            None,
        )
        if content is None:
            # Bad ids in these two files are reported where they are used (the model's and generation configs).
            token_id = next((c[id_key] for c in id_sources if c.get(id_key) is not None), None)
            token_id = token_id[0] if isinstance(token_id, list) and token_id else token_id
            valid_id = is_integer(token_id)
            in_vocabulary = valid_id and 0 <= token_id < backend.get_vocab_size(with_added_tokens=True)
            content = backend.id_to_token(token_id) if in_vocabulary else None
        special_tokens[token_key] = content
    return special_tokens


def context_length_from_files(directory: str) -> int | None:
    """The model's context in tokens from the checkpoint's `config.json` (`max_position_embeddings`, GPT-2's
    `n_positions` or `n_ctx`), None when it gives none."""
    config = read_json_object(os.path.join(directory, "config.json"))
    lengths = [config.get(key) for key in ("max_position_embeddings", "n_positions", "n_ctx")]
    return next((length for length in lengths if is_integer(length) and length > 0), None)


def read_json_object(path: str) -> dict:
    """The JSON object in `path`, `{}` when there is nothing at that path; OSError naming the file when it is not a
    regular file, is over `tfgen.local_files.JSON_FILE_CAP`, cannot be read, is not JSON or holds something else than
    an object."""
    if not file_present(path):
        return {}
    content = read_json_file(path)
    if not isinstance(content, dict):
        raise OSError(f"{path!r} does not hold a JSON object (it holds a {type(content).__name__})")
    return content


def _token_content(value: Any, path: str, key: str) -> str:
    """Token string of a config entry, which is either the string or a serialized AddedToken dict."""
    content = value.get("content") if isinstance(value, dict) else value
    if not isinstance(content, str):
        raise ValueError(f"{path!r}: {key} must be a token string or an object with a 'content' string, got {value!r}")
    return content
