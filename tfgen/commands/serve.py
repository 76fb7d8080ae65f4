"""`tfgen serve [EXPORT_DIR]`: a local server speaking TF Serving's REST API for an exported model (without
EXPORT_DIR, for the shipped model, exported to a temporary folder first)."""

from __future__ import annotations

import logging
import os
import tempfile

from tfgen.serving_options import (  # TF-free, so `tfgen serve --help` answers without TensorFlow
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_PORT,
    check_port_free,
    check_server_options,
)

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve an export folder over TF Serving's REST API (plus :generate for text)",
        description="Serves the newest version under EXPORT_DIR at /v1/models/<name>: :predict (TF Serving's row "
        "and columnar formats), status, /metadata, and :generate {\"text\": ...}. Without EXPORT_DIR, exports the "
        "shipped model (every signature, XLA) to a temporary folder first and serves it as stdlib-gpt2. See "
        "docs/serving.md.",
    )
    parser.add_argument(
        "export_dir", metavar="EXPORT_DIR", nargs="?",
        help="folder written by `tfgen export` (default: the shipped model, exported at start)",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}, TF Serving's REST port (0: any free)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: localhost only)")
    parser.add_argument("--model-name", help="name in the URLs (default: EXPORT_DIR's folder name)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help=f"larger request bodies get 413 (default {DEFAULT_MAX_REQUEST_BYTES})")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="connections served at once, one thread each; more are answered 503 with Retry-After "
                        f"(default {DEFAULT_MAX_CONNECTIONS})")
    parser.set_defaults(handler=run)


def run(args) -> int:
    # Bad options and a port in use are reported before the model is loaded (or exported: a minute).
    check_server_options(port=args.port, max_request_bytes=args.max_request_bytes,
                         max_connections=args.max_connections)
    check_port_free(args.host, args.port)
    from tfgen.serving import serve

    options = dict(host=args.host, port=args.port, model_name=args.model_name,
                   max_request_bytes=args.max_request_bytes, max_connections=args.max_connections)
    if args.export_dir is not None:
        serve(args.export_dir, **options)
        return 0

    from tfgen.commands.export import export_model
    from tfgen.defaults import default_model_path

    with tempfile.TemporaryDirectory(prefix="tfgen-serve-") as folder:
        # The folder's name is the model's name in the URLs.
        export_dir = os.path.join(folder, os.path.basename(default_model_path()))
        logger.info("no EXPORT_DIR: exporting the shipped model to %s first (`tfgen export DIR` once, then "
                    "`tfgen serve DIR`, skips this at every start)", export_dir)
        export_model(None, export_dir)
        serve(export_dir, **options)
    return 0
