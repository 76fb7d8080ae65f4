"""The GGUF load cache: what loading a GGUF file builds — its tokenizer, its HF config dict and its weights
dequantized to float32 — kept on disk under the file's SHA-256, so that a later load skips gguf-py's parse of the
metadata (~3 s for a 49k-token vocabulary) and the dequantization (~1.5 s for a 135M model).

An entry is a folder `<cache root>/gguf/<SHA-256 of the GGUF file>/` holding two parts, each written when first
built and read on its own: `tokenizer` (the `tokenizers` JSON, with the special tokens, chat template and context
length) and `model` (the config dict, with the weights as a float32 safetensors file under their HF names). Each part
is a payload file and a `<part>.meta.json` written after it (a part without it is unfinished and ignored), holding
the part's data, a SHA-256 of the data and the payload's CRC-32 (which finds a damaged or truncated payload as surely
as a SHA-256 would, in 0.13 s for SmolLM2's 538 MB instead of 0.3 s; no checksum lying beside the data could stop
someone who may write the folder: its owner and mode do). A part is used only when both are regular files (never
read through a link) in a folder of this user that no one else may write, whose checksums match: a damaged or
tampered part is deleted with one warning and built again from the GGUF file.

Keyed by the content's SHA-256 (0.08 s for the 98 MB SmolLM2 file here, about 1 s per GB), not by path and
modification time: a file rewritten in place, or copied or moved elsewhere, is recognised by what it holds, and an
entry can only ever be what this file's load produced. Models whose float32 weights exceed `MAX_CACHED_WEIGHT_BYTES`
keep no weights part (disk); the folder keeps its newest entries within `MAX_CACHE_BYTES`. `TFGEN_GGUF_CACHE=0`
turns the cache off; the folder follows `TFGEN_CACHE_DIR` like the compile cache (`docs/performance.md`).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import logging
import os
import shutil
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tfgen.generation.cache_entries import read_entry
from tfgen.generation.compile_cache import cache_root
from tfgen.gguf.config import hf_config_dict
from tfgen.gguf.files import open_gguf
from tfgen.gguf.tensors import read_hf_tensors
from tfgen.local_files import check_regular_file

logger = logging.getLogger(__name__)

ENABLE_VARIABLE = "TFGEN_GGUF_CACHE"
#: Bumped whenever what a part holds changes (its data keys, the tokenizer's or the weights' building).
FORMAT = 1
MAX_CACHED_WEIGHT_BYTES = 4 * 2**30
MAX_CACHE_BYTES = 8 * 2**30
_DATA_CAP = 64 * 2**20  # a part's JSON (a chat template, a config) is far smaller
_PAYLOADS = {"tokenizer": "tokenizer.json", "model": "weights.safetensors"}
_OFF_VALUES = ("0", "off", "false", "no")

#: (part, event) -> count in this process, event one of "hit", "stored", "rebuilt": what tests and `--verbose` read.
counters: collections.Counter = collections.Counter()


def enabled() -> bool:
    """Whether `TFGEN_GGUF_CACHE` leaves the cache on (unset or anything but 0 / off / false / no)."""
    return os.environ.get(ENABLE_VARIABLE, "").strip().lower() not in _OFF_VALUES


def cache_folder() -> Path:
    """`<cache root>/gguf` (`TFGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/tfgen`, else `~/.cache/tfgen`)."""
    return cache_root() / "gguf"


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of the file at `path` in hex, computed once per process for one (real path, size, mtime)."""
    status = check_regular_file(path, "the GGUF file")
    return _digest(os.path.realpath(path), status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _digest(real_path: str, size: int, mtime_ns: int) -> str:
    del size, mtime_ns  # cache key only: a rewritten file is hashed again
    with open(real_path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def read_part(digest: str, part: str) -> tuple[dict, bytes] | None:
    """`(data, payload)` of the part `part` ("tokenizer" or "model") of the entry `digest`, or None when the cache is
    off or the part is absent, or damaged (then deleted, with one warning: the caller builds it again)."""
    if not enabled():
        return None
    folder = cache_folder() / digest
    meta_path = folder / f"{part}.meta.json"
    if not os.path.lexists(meta_path):
        return None
    try:
        problem = _folder_problem(folder)
        if problem is not None:  # not this user's alone: neither used nor touched
            logger.warning("tfgen's GGUF cache does not use %s: %s", folder, problem)
            return None
        meta = json.loads(read_entry(meta_path, _DATA_CAP))
        data, payload_digest = meta["data"], meta["payload_crc32"]
        if meta.get("format") != FORMAT:
            problem = f"format {meta.get('format')!r}, not {FORMAT}"
        elif _data_digest(data) != meta["data_sha256"]:
            problem = "its data do not match their checksum"
        else:
            payload = read_entry(folder / _PAYLOADS[part], 2 * MAX_CACHED_WEIGHT_BYTES)
            if zlib.crc32(payload) != payload_digest:
                problem = f"{_PAYLOADS[part]} does not match its checksum"
    except FileNotFoundError:
        problem = "a file is missing"
    except (ValueError, KeyError, TypeError) as error:  # unreadable JSON, a link, not a regular file, a key missing
        problem = f"{type(error).__name__}: {error}"
    except OSError as error:
        problem = str(error)
    if problem is not None:
        logger.warning("tfgen's GGUF cache: the %s part of entry %s is damaged (%s); building it again from the "
                       "GGUF file", part, digest[:12], problem)
        remove_part(digest, part)
        counters[part, "rebuilt"] += 1
        return None
    counters[part, "hit"] += 1
    try:
        os.utime(meta_path)  # recently used: trimmed last
    except OSError:
        pass
    return data, payload


def write_part(digest: str, part: str, data: dict, payload: bytes) -> None:
    """Stores a part (see the module docstring), then trims the cache; a failure (a full disk, a read-only folder) is
    logged and leaves the load unaffected."""
    if not enabled():
        return
    folder = cache_folder() / digest
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if _folder_problem(folder) is not None:
            return  # not ours to write: read_part refuses it too
        meta = {"format": FORMAT, "data": data, "data_sha256": _data_digest(data),
                "payload_crc32": zlib.crc32(payload)}
        for name, content in ((_PAYLOADS[part], payload), (f"{part}.meta.json", json.dumps(meta).encode())):
            partial = folder / f"{name}.{os.getpid()}.partial"
            partial.write_bytes(content)
            os.replace(partial, folder / name)  # the JSON last: a part is complete once its JSON is there
        counters[part, "stored"] += 1
        _trim(keep=folder)
    except OSError as error:
        logger.warning("tfgen's GGUF cache could not store the %s of %s: %s", part, digest[:12], error)


def remove_part(digest: str, part: str) -> None:
    """Deletes a part's JSON and payload (what is already gone is fine)."""
    folder = cache_folder() / digest
    for name in (f"{part}.meta.json", _PAYLOADS[part]):
        try:
            (folder / name).unlink()
        except FileNotFoundError:
            pass
        except OSError as error:  # a folder in the way: the next write fails and says so
            logger.warning("tfgen's GGUF cache could not remove %s: %s", folder / name, error)


def gguf_checkpoint(path: str | os.PathLike, quantize: str | None = None
                    ) -> tuple[dict[str, Any], str, Callable[[], dict[str, np.ndarray]]]:
    """`(config_dict, shown_path, read_weights)` of the GGUF file at `path`: the HF config dict (`hf_config_dict`),
    the path to name in errors, and a function returning the float32 tensors by HF name (`read_hf_tensors`), both
    from the cache's model part when it has one (the file is then not parsed at all), else from the file (the part
    is stored once the weights are read). Errors as `open_gguf`'s, `hf_config_dict`'s and `read_hf_tensors`'.

    With `quantize` the cache is not used: its part holds the whole model in float32, which an int8 load must never
    hold at once (the file's tensors are dequantized and quantized one at a time instead)."""
    digest = file_digest(path) if enabled() and quantize is None else None
    cached = None if digest is None else read_part(digest, "model")
    if cached is not None:
        data, payload = cached
        try:
            tensors = weights_of(payload)
        except (ValueError, KeyError, TypeError) as error:  # checksummed, so written by another tfgen version
            logger.warning("tfgen's GGUF cache: entry %s holds unreadable weights (%s); building them again",
                           digest[:12], error)
            remove_part(digest, "model")
        else:
            return data["config"], os.fspath(path), lambda: tensors
    file = open_gguf(path)
    config_dict = hf_config_dict(file)

    def read_weights() -> dict[str, np.ndarray]:
        tensors = read_hf_tensors(file, config_dict, quantize)
        if digest is not None and 4 * sum(array.size for array in tensors.values()) <= MAX_CACHED_WEIGHT_BYTES:
            write_part(digest, "model", {"config": config_dict}, weights_payload(tensors))
        return tensors

    return config_dict, file.path, read_weights


def weights_payload(tensors: dict[str, np.ndarray]) -> bytes:
    """float32 tensors by name as safetensors bytes."""
    import safetensors.numpy  # lazy: only a GGUF load that stores its weights needs it

    return safetensors.numpy.save({name: np.ascontiguousarray(array, np.float32) for name, array in tensors.items()})


def weights_of(payload: bytes) -> dict[str, np.ndarray]:
    """The float32 tensors of a safetensors `payload` (checked by its checksum), as read-only views of it."""
    header_size = int.from_bytes(payload[:8], "little")
    header = json.loads(payload[8:8 + header_size])
    start, tensors = 8 + header_size, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if entry["dtype"] != "F32" or end - begin != 4 * int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"tensor {name!r} is not the float32 tensor its shape says")
        tensors[name] = np.frombuffer(payload, "<f4", count=(end - begin) // 4, offset=start + begin).reshape(shape)
    return tensors


def _data_digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _folder_problem(folder: Path) -> str | None:
    """Why the entry folder must not be used: not a directory of this user that only this user may write."""
    status = os.lstat(folder)
    if not stat.S_ISDIR(status.st_mode):
        return "not a directory"
    if status.st_uid != getattr(os, "geteuid", lambda: status.st_uid)() or status.st_mode & 0o022:
        return "another user owns it or may write to it"
    return None


def _trim(keep: Path) -> None:
    """Deletes the oldest entries (by their newest file) beyond `MAX_CACHE_BYTES`, never `keep`."""
    entries = []
    for folder in cache_folder().iterdir():
        files = [path.lstat() for path in folder.iterdir()] if folder.is_dir() and not folder.is_symlink() else []
        entries.append((max((f.st_mtime_ns for f in files), default=0), sum(f.st_size for f in files), folder))
    total = 0
    for _, size, folder in sorted(entries, reverse=True, key=lambda entry: (entry[2] == keep, entry[0])):
        total += size
        if total > MAX_CACHE_BYTES and folder != keep:
            shutil.rmtree(folder, ignore_errors=True)
