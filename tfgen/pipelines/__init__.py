"""Pipelines: text in, text out, with HF's names and call shapes. `tfgen.pipeline("text-generation", model=...)`
(`text_generation`) loads a model and its tokenizer by path, Hub id or registered name (or takes loaded ones), and
returns a callable that takes a string, a list of strings, chat messages or a list of conversations and returns
HF 4.55's `[{"generated_text": ...}]`.

The names below load on first use (they import TensorFlow).

May import `tfgen.auto`, `tfgen.hub` and everything below them.
"""

from __future__ import annotations

from tfgen.lazy import lazy_exports

_EXPORTS = {
    "TextGenerationPipeline": "tfgen.pipelines.text_generation",
    "pipeline": "tfgen.pipelines.text_generation",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
