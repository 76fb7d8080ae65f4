"""`tfgen.serving.serve`: load an export folder's versions, serve them over REST (and TF Serving's gRPC API) until
interrupted, polling for new versions."""

from __future__ import annotations

import sys

from tfgen.serving.http import ModelServer
from tfgen.serving.options import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_PORT, check_server_options
from tfgen.serving.versions import DEFAULT_POLL_INTERVAL, ServedModels, check_polling_options


def serve(export_dir, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, model_name: str | None = None,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, max_connections: int = DEFAULT_MAX_CONNECTIONS,
          poll_interval_s: float | None = DEFAULT_POLL_INTERVAL, version_policy: str = "latest",
          grpc_port: int | None = None, batching: dict | None = None) -> None:
    """Loads the newest version under `export_dir` (every version with `version_policy="all"`) and serves it until
    interrupted (Ctrl-C), looking for new versions every `poll_interval_s` seconds (0 or None: never; see
    `tfgen.serving.versions`). REST listens on `port`; with `grpc_port`, TF Serving's gRPC API too (0 for either:
    any free port; needs `pip install "tfgen[serve]"`). `batching`: continuous batching's options
    (`steps_per_call`, `max_queue`; see `tfgen.serving.batching.attach_engine`) for exports with slot signatures,
    None to run every request as a whole call of its signature."""
    check_server_options(port=port, max_request_bytes=max_request_bytes, max_connections=max_connections)
    check_polling_options(poll_interval_s=poll_interval_s, version_policy=version_policy)
    if grpc_port is not None:
        check_server_options(port=grpc_port)
        from tfgen.serving.grpc_api import GrpcModelServer  # tensorflow-serving-api: `pip install "tfgen[serve]"`
    models = ServedModels(export_dir, model_name, version_policy=version_policy, batching=batching)
    try:
        server = ModelServer(models, host, port, max_request_bytes, max_connections)
        try:
            grpc_server = None if grpc_port is None else GrpcModelServer(models, host, grpc_port, max_request_bytes,
                                                                         max_connections)
        except BaseException:
            server.server_close()
            raise
        if poll_interval_s:
            models.start_polling(poll_interval_s)
        model = models.latest
        polling = f", polling every {poll_interval_s:g} s" if poll_interval_s else ""
        print(f"serving {model.name!r} version {', '.join(str(each.version) for each in models.available())} "
              f"({', '.join(sorted(model.signatures))}) at {server.url}/v1/models/{model.name}{polling}",
              file=sys.stderr, flush=True)
        if grpc_server is not None:
            grpc_server.start()
            print(f"gRPC (TF Serving's PredictionService, ModelService) for {model.name!r} at {grpc_server.target}",
                  file=sys.stderr, flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            if grpc_server is not None:
                grpc_server.stop()
            server.server_close()
    finally:
        models.close()
