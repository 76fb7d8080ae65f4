"""Opening a GGUF file and reading its metadata with typed checks; every problem names the file."""

from __future__ import annotations

import functools
import os
from typing import Any

from tfgen.gguf.layout import check_layout
from tfgen.local_files import check_regular_file

GGUF_MAGIC = b"GGUF"
_MISSING = object()


def is_gguf_path(path: Any) -> bool:
    """Whether `path` (a str or path; anything else is not) names a GGUF file: not a directory, and either its name
    ends in `.gguf` (case-insensitive; the file need not exist, so that a missing one is reported as a missing GGUF
    file rather than looked up on the Hub) or it is a file starting with GGUF's magic bytes."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    path = os.fspath(path)
    if not isinstance(path, str) or os.path.isdir(path):
        return False
    if path.lower().endswith(".gguf"):
        return True
    try:
        check_regular_file(path)  # before opening: a FIFO's open would wait for a writer
        with open(path, "rb") as file:
            return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def refuse_hub_options(path: str | os.PathLike, kind: str = "GGUF file", **options: Any) -> None:
    """ValueError naming the Hugging Face Hub options (`revision`, `cache_dir`, `token`, ...) given a value other than
    None with the local `path` (a `kind`: a GGUF file, a keras-hub preset): they pick and fetch a Hub snapshot, and
    `path` is read where it is, so none of them could act. (`local_files_only` is no such option: such a path never
    touches the network.)"""
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)} {'is a Hub option' if len(given) == 1 else 'are Hub options'} and cannot apply to "
            f"the {kind} {os.fspath(path)!r}, which is read from its local path (download it first, e.g. with "
            f"huggingface_hub.hf_hub_download)"
        )


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """The parsed GGUF file at `path`. The last file opened is kept (keyed by its real path, size and modification
    time), so that loading a tokenizer and then a model from one file parses it once: gguf-py's reader takes ~3 s
    on a 49k-token vocabulary. Raises `OSError` naming the file when it is missing, not a regular file (a FIFO, a
    device) or not a readable GGUF file, and the errors of `tfgen.gguf.layout.check_layout` (checked first)."""
    path = os.fspath(path)
    stat = check_regular_file(path, "the GGUF file")
    return _open_cached(os.path.realpath(path), stat.st_size, stat.st_mtime_ns, path)


@functools.lru_cache(maxsize=1)
def _open_cached(real_path: str, size: int, mtime_ns: int, shown_path: str) -> GGUFFile:
    del size, mtime_ns  # cache key only: a rewritten file is parsed again
    return GGUFFile(real_path, shown_path)


class GGUFFile:
    """A GGUF file's metadata and tensor table (`gguf.GGUFReader`; the tensor data stays memory-mapped).

    Attributes:
        path: the path as given (what messages show).
        tensors: tensor name -> `gguf.ReaderTensor` (`shape` in GGUF order, innermost dimension first).
    """

    def __init__(self, real_path: str, path: str):
        import gguf  # lazy: only GGUF loading needs it

        self.path = path
        # gguf-py trusts the lengths and offsets the file claims: check them as llama.cpp does first.
        check_layout(real_path, path)
        try:
            reader = gguf.GGUFReader(real_path)
        # The reader fails with ValueError, IndexError or struct errors depending on where the bytes stop making sense.
        except Exception as error:  # noqa: BLE001 (see above)
            raise OSError(
                f"{path!r} is not a readable GGUF file (not GGUF, or truncated): {type(error).__name__}: {error}"
            ) from None
        self._fields = reader.fields
        self.tensors = {tensor.name: tensor for tensor in reader.tensors}

    def error(self, message: str) -> ValueError:
        """A ValueError whose message starts with the file's path."""
        return ValueError(f"{self.path!r}: {message}")

    def has(self, key: str) -> bool:
        return key in self._fields

    def _value(self, key: str, default: Any, array: bool):
        """The raw value of `key` with its gguf value types, or `default` (an error if absent and no default)."""
        import gguf

        field = self._fields.get(key)
        if field is None:
            if default is _MISSING:
                raise self.error(f"metadata key {key!r} is missing")
            return default, None
        is_array = bool(field.types) and field.types[0] == gguf.GGUFValueType.ARRAY
        if is_array != array:
            raise self.error(f"metadata {key!r} must be {'an array' if array else 'a single value'}")
        try:
            return field.contents(), field.types[-1]
        except ValueError as error:  # a string that is not UTF-8
            raise self.error(f"metadata {key!r} cannot be read: {error}") from None

    def _checked(self, key: str, default: Any, kinds: tuple[str, ...], what: str, array: bool = False):
        """(value, found): the value of `key` (`default` when absent), checked to be of one of the `kinds` of
        `_kind` (items of them for an array); ValueError naming the key and `what` it must be otherwise."""
        value, value_type = self._value(key, default, array)
        if value_type is None:
            return value, False
        if _kind(value_type) not in kinds:
            shown = f"{value_type.name} items" if array else repr(value)
            raise self.error(f"metadata {key!r} must be {what}, got {shown}")
        return value, True

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int | None = None) -> Any:
        """The int value of `key` (`default` when absent); ValueError naming the key when it is not an integer or is
        below `minimum`."""
        value, found = self._checked(key, default, ("int",), "an integer")
        if found and minimum is not None and value < minimum:
            raise self.error(f"metadata {key!r} must be at least {minimum}, got {value}")
        return value

    def number(self, key: str, default: Any = _MISSING) -> Any:
        """The float value of `key` (integers accepted), or `default` when absent."""
        value, found = self._checked(key, default, ("int", "float"), "a number")
        return float(value) if found else value

    def string(self, key: str, default: Any = _MISSING) -> Any:
        """The str value of `key`, or `default` when absent."""
        return self._checked(key, default, ("str",), "a string")[0]

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        """The bool value of `key`, or `default` when absent."""
        value, found = self._checked(key, default, ("bool",), "true or false")
        return bool(value) if found else value

    def array(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        """The list value of `key` whose items are all of `kind` (str, int or float; ints are accepted as floats), or
        `default` when absent."""
        kinds = {str: ("str",), int: ("int",), float: ("int", "float")}[kind]
        return self._checked(key, default, kinds, f"an array of {kind.__name__}", array=True)[0]


def _kind(value_type) -> str:
    """"int", "float", "bool" or "str" for a `gguf.GGUFValueType` (its names: UINT8 ... INT64, FLOAT32, FLOAT64,
    BOOL, STRING)."""
    name = value_type.name
    return {"BOOL": "bool", "STRING": "str"}.get(name, "float" if name.startswith("FLOAT") else "int")
