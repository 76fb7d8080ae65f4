"""The `quantize` modes tfgen knows and their check, TF-free: the command line checks `--quantize` before it imports
TensorFlow (`tfgen.commands.check_before_tensorflow`), the loaders before anything is read
(`tfgen.models.quantize` holds what the modes do)."""

from __future__ import annotations

#: The `quantize` modes (None: float weights). "int8": int8 weights with a float32 scale per output channel.
QUANTIZE_MODES = ("int8",)


def check_quantize(quantize) -> str | None:
    """`quantize` itself when it is None or one of `QUANTIZE_MODES`; ValueError naming `quantize` otherwise."""
    if quantize is None or (isinstance(quantize, str) and quantize in QUANTIZE_MODES):
        return quantize
    raise ValueError(f"quantize must be one of {list(QUANTIZE_MODES)} or None, got {quantize!r}")
