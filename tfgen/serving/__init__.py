"""`tfgen serve`: TF Serving's REST API (`http`) and gRPC API (`grpc_api`) over an export folder's versions
(`versions`), one loaded version (`served_model`), requests parsed and checked (`requests`) or refused (`errors`),
continuous batching of greedy and sampling rows through the slot engine (`batching`), the server's options (`options`,
TF-free) and `serve()` (`server`).

May import `tfgen.engine`, `tfgen.export` and everything below them. The names below load on first use, so
`tfgen.serving.options` (as `tfgen serve --help` reads it) imports no TensorFlow.
"""

from __future__ import annotations

from tfgen.lazy import lazy_exports

_EXPORTS = {
    "DEFAULT_MAX_CONNECTIONS": "tfgen.serving.options",
    "DEFAULT_MAX_REQUEST_BYTES": "tfgen.serving.options",
    "DEFAULT_PORT": "tfgen.serving.options",
    "ModelServer": "tfgen.serving.http",
    "ServedModel": "tfgen.serving.served_model",
    "ServedModels": "tfgen.serving.versions",
    "load_export": "tfgen.serving.served_model",
    "serve": "tfgen.serving.server",
    "start_in_thread": "tfgen.serving.http",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
