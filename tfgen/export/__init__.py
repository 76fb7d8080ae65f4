"""`generate()` as a TF Serving SavedModel (`export_saved_model`), and the table of its signatures.

The names load on first use, so `tfgen.export.signatures` (TF-free) can be read without importing TensorFlow.

May import `tfgen.engine` (the slot signatures), `tfgen.request` and everything below them.
"""

from __future__ import annotations

from tfgen.lazy import lazy_exports

_EXPORTS = {
    "EXPORT_INFO_FILE": "tfgen.export.saved_model",
    "default_row_seeds": "tfgen.export.signature_inputs",
    "export_saved_model": "tfgen.export.saved_model",
    "DEFAULT_CONTRASTIVE_TOP_K": "tfgen.export.signatures",
    "DEFAULT_MAX_MATCHING_NGRAM_SIZE": "tfgen.export.signatures",
    "DEFAULT_MAX_NEW_TOKENS": "tfgen.export.signatures",
    "DEFAULT_NUM_BEAMS": "tfgen.export.signatures",
    "DEFAULT_PROMPT_LOOKUP_NUM_TOKENS": "tfgen.export.signatures",
    "SIGNATURES": "tfgen.export.signatures",
    "ExportChoices": "tfgen.export.signatures",
    "SignatureSpec": "tfgen.export.signatures",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
