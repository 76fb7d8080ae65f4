"""Reading back what `tfgen export` wrote: the version folders of an export base (TF Serving's layout), the version
a path names, and a version's tokenizer (`assets.extra/tokenizer/`, with its chat template). Used by `tfgen serve`
(`tfgen.serving.served_model`) and by Beam's export jobs (`tfgen.beam.export_job`)."""

from __future__ import annotations

import logging
import os
import re

from tfgen.export.saved_model import TOKENIZER_FOLDER
from tfgen.text.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# TF Serving's version numbers are int64 (gRPC's `model_spec.version`, `ModelVersionStatus.version`).
MAX_VERSION = 2**63 - 1
_VERSION_NAME = re.compile(r"[1-9][0-9]*|0")  # a canonical decimal: "007" would name folder "7" elsewhere
_IGNORED_FOLDERS: set[str] = set()  # folders already reported as not versions (polling looks every second)


def export_versions(export_dir: str) -> list[int]:
    """The complete version folders under `export_dir` (numeric names holding a `saved_model.pb`), ascending. A
    numeric name beyond int64 or with leading zeros is ignored, with one warning per folder."""
    try:
        entries = os.listdir(export_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    versions = []
    for entry in entries:
        if not re.fullmatch(r"[0-9]+", entry) or not os.path.isfile(os.path.join(export_dir, entry, "saved_model.pb")):
            continue  # other names (an export still being written under its temporary name) are not versions
        if _VERSION_NAME.fullmatch(entry) and int(entry) <= MAX_VERSION:
            versions.append(int(entry))
        elif os.path.join(export_dir, entry) not in _IGNORED_FOLDERS:
            _IGNORED_FOLDERS.add(os.path.join(export_dir, entry))
            logger.warning("ignoring the folder %r in %s: a version folder's name is a number in 0..%d (int64) "
                           "without leading zeros", entry, export_dir, MAX_VERSION)
    return sorted(versions)


def version_folder(path: str) -> str:
    """The version folder `path` names: itself when it holds a `saved_model.pb`, else its newest version folder
    (`export_versions`, TF Serving's default policy). OSError when it is neither."""
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    versions = export_versions(path)
    if not versions:
        raise OSError(f"{path!r}: no saved_model.pb in it nor in a version folder under it (expected <dir>/1/...)")
    return os.path.join(path, str(versions[-1]))


def export_tokenizer(version_dir: str):
    """The tokenizer an export version carries (`assets.extra/tokenizer/`, written by `export_saved_model` with its
    chat template), or None when it carries none. Raises OSError / ValueError when its files do not load."""
    tokenizer_dir = os.path.join(version_dir, "assets.extra", TOKENIZER_FOLDER)
    if not os.path.isdir(tokenizer_dir):
        return None
    # HF-format files: an export writes no other kind (AutoTokenizer would pick this same class for them).
    return Tokenizer.from_pretrained(tokenizer_dir, padding_side="left")
