"""Reading the small files a user or a downloaded model hands tfgen (a checkpoint's JSON files and chat template, a
`--json-schema` file): only regular files, and never more than a cap.

A path is checked before it is opened: a link is followed and its target must be a regular file, so a FIFO (whose
`open` would block until a writer comes), a device such as `/dev/zero` (endless bytes) or a directory is refused at
once, naming the file. The opened descriptor is checked again (the path may have been swapped in between) and at most
`cap + 1` bytes are ever read. Every refusal is an `OSError` naming the file (and what it is, when the caller says),
as every other unreadable model file is. A leaf utility: it imports no tfgen module.

It also tells a local path from a Hugging Face Hub id (`check_local_path`), so that a model path that does not exist
is reported as one rather than looked up on the Hub.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

MIB = 1 << 20
# The JSON files beside a model's weights (config.json, generation_config.json, tokenizer_config.json,
# special_tokens_map.json, the safetensors index), chat_template.jinja and a --json-schema file. Real ones weigh KB
# to a few MB (Gemma 3's tokenizer_config.json: 1.2 MB; the index of a 160-shard model: ~0.1 MB).
JSON_FILE_CAP = 32 * MIB
# tokenizer.json: real ones reach ~35 MB (Gemma 3's 262k-token vocabulary with its merges).
TOKENIZER_JSON_CAP = 256 * MIB
# Read in pieces, so that a file growing while it is read costs at most one piece past the cap.
_CHUNK = 4 * MIB
# A Hugging Face Hub id as huggingface_hub's validate_repo_id takes it: `name` or `owner/name`, each made of letters,
# digits, "-", "_" and "." (the name at most 96 characters), no "--" or "..", not starting or ending with "-" or ".".
_HUB_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]{1,96}$", re.ASCII)
_PATH_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\")


def _subject(path: str | os.PathLike, what: str | None) -> str:
    return f"{what} {os.fspath(path)!r}" if what else repr(os.fspath(path))


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _refuse_irregular(path: str | os.PathLike, what: str | None, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise OSError(f"{_subject(path, what)} is {_kind(mode)}, not a regular file: tfgen reads model and option "
                      "files only when they are regular files (a link must lead to one)")


def check_regular_file(path: str | os.PathLike, what: str | None = None) -> os.stat_result:
    """The `os.stat` of `path` (links followed) after checking it is a regular file; OSError naming the file (and
    `what` it is) when it is missing, a broken link, a directory, a FIFO, a device or a socket. Opens nothing."""
    try:
        status = os.stat(path)
    except OSError as error:
        broken = os.path.islink(path)
        reason = "a link to nothing" if broken else (error.strerror or str(error))
        raise OSError(f"cannot read {_subject(path, what)}: {reason}") from None
    _refuse_irregular(path, what, status.st_mode)
    return status


def file_present(path: str | os.PathLike, what: str | None = None) -> bool:
    """Whether there is a file to read at `path`: False when nothing is there (not even a link), True for a regular
    file (or a link to one); OSError naming the file for anything else (a broken link, a directory, a FIFO, a
    device), so that such an entry is neither read nor silently taken for an absent file."""
    if not os.path.lexists(path):
        return False
    check_regular_file(path, what)
    return True


def read_file_bytes(path: str | os.PathLike, what: str | None, cap: int) -> bytes:
    """The bytes of the regular file `path`, refused (OSError naming the file, and the cap when it is the reason)
    when it is not a regular file (`check_regular_file`) or holds more than `cap` bytes; never reads more than
    `cap + 1` bytes, and never blocks on a FIFO."""
    status = check_regular_file(path, what)
    too_large = f"{_subject(path, what)} is larger than the {cap:,}-byte limit for such files"
    if status.st_size > cap:
        raise OSError(f"{too_large} ({status.st_size:,} bytes)")
    try:
        # O_NONBLOCK: should a FIFO replace the file after the check, opening it does not wait for a writer.
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise OSError(f"cannot read {_subject(path, what)}: {error.strerror or error}") from None
    with os.fdopen(descriptor, "rb") as file:
        _refuse_irregular(path, what, os.fstat(descriptor).st_mode)
        pieces, size = [], 0
        while size <= cap:
            piece = file.read(min(_CHUNK, cap + 1 - size))
            if not piece:
                break
            pieces.append(piece)
            size += len(piece)
    if size > cap:
        raise OSError(f"{too_large} (it grew while being read)")
    return b"".join(pieces)


def read_text_file(path: str | os.PathLike, what: str | None, cap: int) -> str:
    """The UTF-8 text of `path` with "\\r\\n" and "\\r" line ends turned into "\\n" (as Python's text mode reads it),
    under `read_file_bytes`' checks; OSError naming the file when it is not UTF-8."""
    try:
        text = read_file_bytes(path, what, cap).decode("utf-8")
    except UnicodeDecodeError as error:
        raise OSError(f"{_subject(path, what)} is not UTF-8 text: {error}") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_json_file(path: str | os.PathLike, what: str | None = None, cap: int = JSON_FILE_CAP) -> Any:
    """The parsed JSON of `path`, under `read_file_bytes`' checks (a regular file of at most `cap` bytes); OSError
    naming the file when it is not UTF-8 JSON text."""
    data = read_file_bytes(path, what, cap)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OSError(f"{_subject(path, what)} is not JSON text: {error}") from None
    except RecursionError:
        raise OSError(f"{_subject(path, what)} nests its JSON too deeply") from None


def is_hub_id(value: str) -> bool:
    """Whether `value` is a well-formed Hugging Face Hub id (`name` or `owner/name`); it need not exist."""
    return (bool(_HUB_ID.match(value)) and "--" not in value and ".." not in value
            and not any(part.startswith(("-", ".")) or part.endswith(("-", ".")) for part in value.split("/")))


def looks_like_local_path(value: str) -> bool:
    """Whether `value` can only name a local file or directory: it starts with `./`, `../`, `/` or `~`, ends with
    `.gguf`, or holds a path separator and is no Hub id (`a/b/c`, a Windows path)."""
    separators = [separator for separator in (os.sep, os.altsep, "/") if separator]
    return (value.startswith(_PATH_PREFIXES) or value.lower().endswith(".gguf")
            or (any(separator in value for separator in separators) and not is_hub_id(value)))


def check_local_path(value: str | os.PathLike) -> None:
    """FileNotFoundError (an OSError) "no such file or directory: VALUE" when `value` looks like a local path
    (`looks_like_local_path`) and nothing is there, before anyone takes it for a Hub id (the Hub would answer that
    a repo id "must use alphanumeric chars"). `~` is not expanded (the shell does that); when the expanded path
    exists, the message says so."""
    path = os.fspath(value)
    if not isinstance(path, str) or os.path.lexists(path) or not looks_like_local_path(path):
        return
    hint = ""
    if path.startswith("~") and os.path.exists(os.path.expanduser(path)):
        hint = f" ('~' is not expanded here: pass {os.path.expanduser(path)!r})"
    raise FileNotFoundError(f"no such file or directory: {path!r}{hint}")


def is_export_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder written by `tfgen export` (or any TF Serving model base): a `saved_model.pb` in
    it or in a numeric version folder under it."""
    if not os.path.isdir(path):
        return False
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return True
    return any(entry.isdigit() and os.path.isfile(os.path.join(path, entry, "saved_model.pb"))
               for entry in os.listdir(path))
