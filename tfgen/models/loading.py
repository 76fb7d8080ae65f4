"""Finding a checkpoint (local directory or Hugging Face Hub id) and reading its config and safetensors weights."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import huggingface_hub
import ml_dtypes
import numpy as np
import safetensors

from tfgen.local_files import check_local_path, file_present, read_json_file

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# What a snapshot needs: configs, safetensors weights and tokenizer files; never pickled weights.
HUB_ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    SAFE_WEIGHTS_INDEX_NAME,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def resolve_model_directory(
    path_or_repo_id: str | os.PathLike,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | bool | None = None,
    local_files_only: bool | None = None,
) -> Path:
    """Returns a local directory holding the checkpoint: `path_or_repo_id` itself when it is a directory,
    else a Hub snapshot limited to `HUB_ALLOW_PATTERNS`. `local_files_only=None` follows `HF_HUB_OFFLINE`
    (read now, not at import). Raises `OSError` naming `path_or_repo_id` when it cannot be resolved
    (FileNotFoundError, before any Hub lookup, for a path such as `./model` that does not exist)."""
    if not isinstance(path_or_repo_id, (str, os.PathLike)):
        raise TypeError(f"path_or_repo_id must be a str or path, got {type(path_or_repo_id).__name__}")
    if os.path.isdir(path_or_repo_id):
        return Path(path_or_repo_id)
    check_local_path(path_or_repo_id)
    if local_files_only is None:
        local_files_only = _env_flag("HF_HUB_OFFLINE")
    try:
        snapshot = huggingface_hub.snapshot_download(
            str(path_or_repo_id),
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            local_files_only=local_files_only,
            allow_patterns=HUB_ALLOW_PATTERNS,
        )
    # The hub client raises many unrelated types (invalid id, HTTP, offline, missing entry) across versions.
    except Exception as error:
        where = "the local Hub cache (offline)" if local_files_only else "the Hugging Face Hub"
        raise OSError(
            f"cannot load {str(path_or_repo_id)!r}: it is not a local directory and fetching it from {where} "
            f"failed ({type(error).__name__}: {error})"
        ) from error
    return Path(snapshot)


def read_config_dict(directory: str | os.PathLike) -> dict[str, Any]:
    """The parsed `config.json` of a checkpoint directory; `OSError` naming the file when it is absent, not a regular
    file, over `tfgen.local_files.JSON_FILE_CAP`, or not a JSON object."""
    path = Path(directory) / "config.json"
    config_dict = read_json_file(path, "the model config")
    if not isinstance(config_dict, dict):
        raise OSError(f"{str(path)!r} does not hold a JSON object")
    return config_dict


def read_safetensors_weights(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a checkpoint directory, by name: `model.safetensors`, or the shards listed in
    `model.safetensors.index.json`. Raises `OSError` naming the file for pickled weights only (`*.bin`, `*.pt`), a
    malformed index, an index entry whose shard lies outside the directory (absolute, `..`, or a link leading out),
    a missing shard, a file that is not a regular one (a FIFO, a device) and a truncated or corrupt safetensors file."""
    directory = Path(directory)
    index_path = directory / SAFE_WEIGHTS_INDEX_NAME
    if file_present(index_path, "the safetensors index"):
        weight_map = _read_weight_map(index_path)
        shards = {}  # shard file -> the first tensor that names it (to say which entry is wrong)
        for tensor_name, shard_name in weight_map.items():
            shards.setdefault(shard_name, tensor_name)
        for shard_name, tensor_name in shards.items():
            _check_shard_path(directory, index_path, tensor_name, shard_name)
        tensors = {}
        for shard_name in sorted(shards):
            shard = _load_file(directory / shard_name)
            tensors.update({name: array for name, array in shard.items() if weight_map.get(name) == shard_name})
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise OSError(f"{str(index_path)!r} lists tensors missing from their shards: {absent}")
        return tensors
    if file_present(directory / SAFE_WEIGHTS_NAME, "the weights file"):
        return _load_file(directory / SAFE_WEIGHTS_NAME)
    pickles = sorted(path.name for pattern in ("*.bin", "*.pt", "*.pth") for path in directory.glob(pattern))
    found = f" (it has {pickles})" if pickles else ""
    raise OSError(
        f"no {SAFE_WEIGHTS_NAME} or {SAFE_WEIGHTS_INDEX_NAME} in {str(directory)!r}{found}: tfgen loads safetensors "
        "only and does not load pickled weights such as pytorch_model.bin; convert the checkpoint to safetensors"
    )


def _read_weight_map(index_path: Path) -> dict[str, str]:
    """The index's `weight_map` (tensor name -> shard file name), checked to be one."""
    index = read_json_file(index_path, "the safetensors index")
    try:
        weight_map = index["weight_map"]
    except (KeyError, TypeError) as error:
        problem = f"{type(error).__name__}: {error}"
        raise OSError(f"{str(index_path)!r} is not a valid safetensors index ({problem})") from None
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) and isinstance(shard, str) and shard for name, shard in weight_map.items()
    ):
        raise OSError(f"{str(index_path)!r} is not a valid safetensors index: its weight_map must map tensor names "
                      "to shard file names")
    return weight_map


def _check_shard_path(directory: Path, index_path: Path, tensor_name: str, shard_name: str) -> None:
    """Refuses a shard outside the checkpoint: an index is data, and must not make us read any file on the
    machine. A Hub snapshot's files are links into the repository's `blobs/` folder, which is allowed."""
    entry = f"{str(index_path)!r} entry {tensor_name!r}: {shard_name!r}"
    if Path(shard_name).is_absolute() or ".." in Path(shard_name).parts:
        raise OSError(f"{entry} must be a file name inside the model directory (no absolute path, no '..')")
    shard = directory / shard_name
    try:
        present = file_present(shard, "its shard")
    except OSError as error:  # a FIFO, a device, a broken link: say which entry names it
        raise OSError(f"{entry}: {error}") from None
    if not present:
        raise OSError(f"{entry} names a shard that is missing from {str(directory)!r}")
    root = directory.resolve()
    allowed = [root] + ([root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [])
    if not any(shard.resolve().is_relative_to(place) for place in allowed):
        raise OSError(f"{entry} is a link leading outside the model directory (to {str(shard.resolve())!r})")


def _load_file(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file, by name; bfloat16 ones as `ml_dtypes.bfloat16` arrays, bit for bit."""
    try:
        # The library checks the header, the offsets and the file size; it reads every dtype numpy knows.
        with safetensors.safe_open(str(path), framework="numpy") as file:
            names = list(file.keys())
            bfloat16 = {name for name in names if file.get_slice(name).get_dtype() == "BF16"}
            tensors = {name: file.get_tensor(name) for name in names if name not in bfloat16}
        if bfloat16:
            tensors.update(_read_bfloat16(path, bfloat16))
        return tensors
    # SafetensorError: a truncated or corrupt file; TypeError: a dtype numpy lacks.
    except (OSError, safetensors.SafetensorError, TypeError, ValueError) as error:
        raise OSError(f"cannot read safetensors file {str(path)!r}: {error}") from error


def _read_bfloat16(path: Path, names: set[str]) -> dict[str, np.ndarray]:
    """The bfloat16 tensors `names` of a (checked) safetensors file, read from the raw bytes at their header offsets:
    numpy has no bfloat16 of its own, and whether the library can make one depends on its version."""
    tensors = {}
    with open(path, "rb") as file:
        header_size = int.from_bytes(file.read(8), "little")
        header = json.loads(file.read(header_size))
        for name in sorted(names, key=lambda name: header[name]["data_offsets"][0]):
            begin, end = header[name]["data_offsets"]
            file.seek(8 + header_size + begin)
            # Little-endian in the file; native order (a no-op on little-endian hosts) before the bits are read.
            raw = np.frombuffer(file.read(end - begin), dtype="<u2").astype(np.uint16, copy=False)
            tensors[name] = raw.view(ml_dtypes.bfloat16).reshape(header[name]["shape"])
    return tensors
