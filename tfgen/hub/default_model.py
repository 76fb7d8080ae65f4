"""Where the shipped default model lives: `saved_models/stdlib-gpt2` at the repository root.

A small GPT-2 trained on the Python standard library's sources (`tools/train_default_model.py`, see
`docs/default-model.md`), so `tfgen generate "def f(x):"` works offline. It sits beside the `tfgen/` package
directory, so it is found from a source checkout or an editable install.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL = str(Path(__file__).resolve().parents[2] / "saved_models" / "stdlib-gpt2")


def default_model_path() -> str:
    """`DEFAULT_MODEL`, after checking that it holds a checkpoint (`config.json`, `model.safetensors`,
    `tokenizer.json`). Raises `OSError` naming the missing files and how to rebuild them."""
    missing = [name for name in ("config.json", "model.safetensors", "tokenizer.json")
               if not (Path(DEFAULT_MODEL) / name).is_file()]
    if missing:
        raise OSError(
            f"the default model is not available: {DEFAULT_MODEL!r} lacks {', '.join(missing)} (it ships in the "
            "tfgen source tree, not in wheels; rebuild it with `python tools/train_default_model.py` or pass "
            "--model / a model path)"
        )
    return DEFAULT_MODEL
