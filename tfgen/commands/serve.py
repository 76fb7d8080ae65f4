"""`tfgen serve EXPORT_DIR`: a local server speaking TF Serving's REST API for an exported model."""

from __future__ import annotations


def add_parser(subparsers) -> None:
    from tfgen.serving import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_PORT

    parser = subparsers.add_parser(
        "serve",
        help="serve an export folder over TF Serving's REST API (plus :generate for text)",
        description="Serves the newest version under EXPORT_DIR at /v1/models/<name>: :predict (TF Serving's row "
        "and columnar formats), status, /metadata, and :generate {\"text\": ...}. See docs/serving.md.",
    )
    parser.add_argument("export_dir", metavar="EXPORT_DIR", help="folder written by `tfgen export`")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}, TF Serving's REST port (0: any free)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: localhost only)")
    parser.add_argument("--model-name", help="name in the URLs (default: EXPORT_DIR's folder name)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help=f"larger request bodies get 413 (default {DEFAULT_MAX_REQUEST_BYTES})")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from tfgen.serving import serve

    serve(args.export_dir, host=args.host, port=args.port, model_name=args.model_name,
          max_request_bytes=args.max_request_bytes)
    return 0
