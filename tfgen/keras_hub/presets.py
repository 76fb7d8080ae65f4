"""keras-hub preset directories (what `causal_lm.save_to_preset(directory)` writes): telling one apart, cheaply and
without TensorFlow, before anything loads (`tfgen.AutoModelForCausalLM` and `tfgen.AutoTokenizer` take the directory,
so `--model ./preset` works in `tfgen generate`, `export` and `batch`), and importing keras-hub, an optional
dependency, with an error that says how to install it."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from tfgen.local_files import read_json_file


def is_keras_hub_preset(path) -> bool:
    """Whether `path` is a local directory holding a keras-hub preset (its `metadata.json` names a keras-hub
    version). Cheap and TensorFlow-free: checked before anything loads."""
    metadata = Path(os.fspath(path)) / "metadata.json"
    if not metadata.is_file():
        return False
    try:
        return "keras_hub_version" in read_json_file(metadata)
    except (OSError, TypeError):  # unreadable, or not an object: not a preset
        return False


def keras_hub_module(needed_by: str = "loading a keras-hub preset"):
    """The `keras_hub` package (an optional dependency, imported on first need); ImportError saying how to install
    it."""
    try:
        return importlib.import_module("keras_hub")
    except ImportError as error:
        raise ImportError(f"{needed_by} needs keras-hub: pip install 'tfgen[keras-hub]'") from error
