"""`tfgen serve [EXPORT_DIR]`: a local server speaking TF Serving's REST and gRPC APIs for an exported model
(without EXPORT_DIR, for the shipped model, exported to a temporary folder first). Its flags are TF Serving's:
`--port` is the gRPC port (8500), `--rest_api_port` the REST port (8501), `--model_name` the model's name.
`tfgen serve --model NAME|DIR|FILE.gguf` serves a model directly, exported into tfgen's cache on first use
(`tfgen.commands.export_cache`)."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time

# TF-free, so `tfgen serve --help` answers without TensorFlow.
from tfgen.commands import add_model_argument
from tfgen.commands.export_cache import DEFAULT_STRUCTURED_INPUTS
from tfgen.commands.interrupts import INTERRUPTED_STATUS
from tfgen.engine.options import DEFAULT_STEPS_PER_CALL
from tfgen.serving.options import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_GRPC_PORT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_PORT,
    GRPC_INSTALL_HINT,
    check_drain_timeout,
    check_port,
    check_port_free,
    check_server_options,
    grpc_available,
)

logger = logging.getLogger(__name__)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve",
        # No prefixes: `--model` once matched both `--model-name` and `--model_name`.
        allow_abbrev=False,
        help="serve an export folder over TF Serving's REST and gRPC APIs (plus :generate for text)",
        description="Serves the newest version under EXPORT_DIR at /v1/models/<name>: :predict (TF Serving's row "
        "and columnar formats), status, /metadata, and :generate {\"text\": ...} over REST (--rest_api_port), and "
        "TF Serving's gRPC PredictionService (Predict, GetModelMetadata) and ModelService (GetModelStatus) on "
        "--port. With --model, exports that model (every signature, XLA) into tfgen's cache on first use and "
        "serves it from there after; without EXPORT_DIR or --model, exports the shipped model to a temporary folder "
        "first and serves it as stdlib-gpt2. See docs/serving.md.",
    )
    parser.add_argument(
        "export_dir", metavar="EXPORT_DIR", nargs="?",
        help="folder written by `tfgen export` (default: --model's, exported at start)",
    )
    add_model_argument(parser)
    exporting = parser.add_argument_group("the export of --model (or of the shipped model), part of its cache key")
    exporting.add_argument("--max-new-tokens", type=int, help="token buffer of every signature (`tfgen export`'s)")
    exporting.add_argument("--no-jit", action="store_true", help="plain TF graph instead of XLA")
    exporting.add_argument("--no-text", action="store_true", help="skip generate_text (`tfgen export --no-text`)")
    exporting.add_argument("--signatures", type=lambda names: names.split(","), metavar="NAMES",
                           help="comma-separated signatures to export (default: all but "
                           f"{', '.join(WHOLE_CALL_ONLY)}, which only whole calls run; `all`: every one)")
    exporting.add_argument("--slots", type=int, help="decode rows of continuous batching (`tfgen export --slots`)")
    exporting.add_argument("--slot-length", type=int, help="buffer columns of a slot (`tfgen export --slot-length`)")
    default_tables = ",".join(map(str, DEFAULT_STRUCTURED_INPUTS))
    exporting.add_argument("--structured-inputs", type=_table_sizes, metavar="STATES,CLASSES",
                           help="automaton table sizes of the `structured` signature, which serves the OpenAI "
                           f"routes' response_format (default {default_tables}; 0: leave it out)")
    exporting.add_argument("--slot-logprobs", type=int, metavar="K", help="log-probabilities recorded per token for "
                           "OpenAI's logprobs (`tfgen export --slot-logprobs`; default 20, OpenAI's limit; 0: none)")
    parser.add_argument(
        "--port", type=int, default=None,
        help=f"gRPC port (default {DEFAULT_GRPC_PORT}, TF Serving's; 0: any free). gRPC needs tensorflow-serving-api "
        f"({GRPC_INSTALL_HINT}); without it the server answers REST only, and refuses an explicit --port",
    )
    parser.add_argument(
        "--rest_api_port", "--rest-api-port", dest="rest_api_port", type=int, default=DEFAULT_PORT,
        help=f"REST port (default {DEFAULT_PORT}, TF Serving's usual one; 0: any free)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: localhost only)")
    parser.add_argument("--model-name", "--model_name", dest="model_name",
                        help="the model's name in URLs and gRPC model_spec.name (TF Serving's flag; default: "
                        "EXPORT_DIR's folder name, or --model's registered name, folder name or file stem)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help=f"larger request bodies get 413 (default {DEFAULT_MAX_REQUEST_BYTES})")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="connections served at once, one thread each; more are answered 503 with Retry-After "
                        f"(default {DEFAULT_MAX_CONNECTIONS})")
    parser.add_argument("--file_system_poll_wait_seconds", "--file-system-poll-wait-seconds", type=float,
                        dest="file_system_poll_wait_seconds", default=DEFAULT_POLL_INTERVAL,
                        help="seconds between looks at EXPORT_DIR for new version folders, which are loaded, warmed "
                        "up and served in place of the older one (TF Serving's flag; "
                        f"default {DEFAULT_POLL_INTERVAL:g}; 0: never)")
    parser.add_argument("--drain-timeout", type=float, default=DEFAULT_DRAIN_TIMEOUT,
                        help="on SIGTERM or Ctrl-C: seconds the requests running get to finish once the server stops "
                        f"taking new ones (default {DEFAULT_DRAIN_TIMEOUT:g}); exit status 0 after SIGTERM, 130 after "
                        "Ctrl-C (a second Ctrl-C ends it at once)")
    parser.add_argument("--steps-per-call", type=int, default=DEFAULT_STEPS_PER_CALL,
                        help="continuous batching: tokens every running request gets per engine call; a new request "
                        f"waits at most that long to join the batch (default {DEFAULT_STEPS_PER_CALL})")
    parser.add_argument("--max-queue", type=int, default=None,
                        help="continuous batching: requests rows that may wait for a decode slot; more are answered "
                        "503 with Retry-After (default 8 per slot; the export fixes the slots, `tfgen export --slots`)")
    parser.add_argument("--no-batching", action="store_true",
                        help="run every request as its own call of its signature, even where the export has slot "
                        "signatures")
    parser.set_defaults(handler=run)


def grpc_port(args) -> int | None:
    """The gRPC port to serve on (`--port`, else TF Serving's 8500), or None for REST only when the gRPC stubs are
    not installed and `--port` was not given (a warning says how to install them). ValueError for a bad port, or
    for an explicit `--port` without the stubs."""
    port = DEFAULT_GRPC_PORT if args.port is None else args.port
    check_port(port)
    if grpc_available():
        return port
    if args.port is not None:
        raise ValueError(f"port {args.port}: gRPC needs tensorflow-serving-api, which is not installed: "
                         f"{GRPC_INSTALL_HINT} (or leave out --port to serve REST only)")
    logger.warning("serving REST only: TF Serving's gRPC API (--port) needs tensorflow-serving-api: %s",
                   GRPC_INSTALL_HINT)
    return None


#: The signatures `tfgen serve --model` leaves out of its export unless `--signatures` names them: the engine
#: decodes none of their rows, and each adds ~3 s to every start (its graph rebuilt when the export loads) and ~7 s
#: of warm-up (its program compiled, or loaded from the compile cache).
WHOLE_CALL_ONLY = ("beam_search", "contrastive", "prompt_lookup")
# The export flags of `tfgen serve` (beside `--no-jit` and `--no-text`), as `export_model` takes them.
EXPORT_OPTIONS = ("max_new_tokens", "signatures", "slots", "slot_length", "slot_logprobs", "quantize",
                  "structured_inputs")


def _table_sizes(text: str) -> tuple:
    """`--structured-inputs`: `(STATES, CLASSES)`, or `()` for "0" (no `structured` signature)."""
    import argparse

    from tfgen.export.structured_inputs import check_structured_inputs

    if text.strip() == "0":
        return ()
    try:
        return check_structured_inputs(text.split(","))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def check_export_flags(args) -> None:
    """Refuses EXPORT_DIR with `--model` or with an export flag (a served export is not exported again), and an
    export flag out of `tfgen export`'s ranges: one-line ValueErrors, before anything loads."""
    from tfgen.commands.export import MAX_NEW_TOKENS, MAX_SLOT_LENGTH, MAX_SLOT_LOGPROBS, MAX_SLOTS

    if args.export_dir is not None and args.model is not None:
        raise ValueError(f"EXPORT_DIR ({args.export_dir}) and --model ({args.model}): give one (an export folder to "
                         "serve, or a model to export and serve)")
    given = [name for name in EXPORT_OPTIONS if getattr(args, name) is not None]
    given += [flag for flag in ("no_jit", "no_text") if getattr(args, flag)]
    if args.export_dir is not None and given:
        raise ValueError(f"--{given[0].replace('_', '-')} shapes the export of --model; EXPORT_DIR is already "
                         "exported (`tfgen export` takes the flag)")
    for option, value, low, high in (("--max-new-tokens", args.max_new_tokens, 1, MAX_NEW_TOKENS),
                                     ("--slots", args.slots, 0, MAX_SLOTS),
                                     ("--slot-length", args.slot_length, 2, MAX_SLOT_LENGTH),
                                     ("--slot-logprobs", args.slot_logprobs, 0, MAX_SLOT_LOGPROBS)):
        if value is not None and not low <= value <= high:
            raise ValueError(f"{option} must be in {low}..{high}, got {value}")


def run(args) -> int:
    started = time.monotonic()
    check_export_flags(args)
    # Bad options and a port in use are reported before the model is loaded (or exported: a minute).
    check_server_options(port=DEFAULT_GRPC_PORT if args.port is None else args.port,
                         max_request_bytes=args.max_request_bytes, max_connections=args.max_connections)
    check_port(args.rest_api_port, "rest_api_port")
    if not 0 <= args.file_system_poll_wait_seconds < float("inf"):  # NaN too
        raise ValueError("--file_system_poll_wait_seconds must be a finite number of seconds >= 0 (0: never), got "
                         f"{args.file_system_poll_wait_seconds}")
    check_drain_timeout(args.drain_timeout)
    for name in ("steps_per_call", "max_queue"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    port = grpc_port(args)
    if port is not None:
        if port == args.rest_api_port != 0:
            raise ValueError(f"port and rest_api_port are both {port}: gRPC and REST need a port each")
        check_port_free(args.host, port, "--port")
    check_port_free(args.host, args.rest_api_port, "--rest_api_port")
    from tfgen.serving import serve

    options = dict(host=args.host, port=args.rest_api_port, grpc_port=port, model_name=args.model_name,
                   poll_interval_s=args.file_system_poll_wait_seconds,
                   max_request_bytes=args.max_request_bytes, max_connections=args.max_connections,
                   drain_timeout=args.drain_timeout,
                   batching=None if args.no_batching else {"steps_per_call": args.steps_per_call,
                                                          "max_queue": args.max_queue})
    if args.export_dir is not None:
        return _status(serve(args.export_dir, started=started, **options))
    export_options = {name: getattr(args, name) for name in EXPORT_OPTIONS if getattr(args, name) is not None}
    if export_options.get("signatures") == ["all"]:
        del export_options["signatures"]
    elif "signatures" not in export_options:
        export_options["leave_out"] = list(WHOLE_CALL_ONLY)
    export_options.setdefault("structured_inputs", DEFAULT_STRUCTURED_INPUTS)
    if not export_options["structured_inputs"]:
        del export_options["structured_inputs"]
    if args.no_jit:
        export_options["jit_compile"] = False
    if args.no_text:
        export_options["text"] = False
    if args.model is not None:
        from tfgen.commands.export_cache import cached_export

        export_dir, name = cached_export(args.model, export_options)
        options["model_name"] = args.model_name or name
        return _status(serve(export_dir, started=started, **options))

    from tfgen.commands.export import export_model
    from tfgen.hub.default_model import default_model_path

    with tempfile.TemporaryDirectory(prefix="tfgen-serve-") as folder:
        # The folder's name is the model's name in the URLs.
        export_dir = os.path.join(folder, os.path.basename(default_model_path()))
        logger.info("no EXPORT_DIR: exporting the shipped model to %s first (`tfgen serve --model DIR` caches the "
                    "export, `tfgen export DIR` then `tfgen serve DIR` skips it)", export_dir)
        export_model(None, export_dir, **export_options)
        return _status(serve(export_dir, started=started, **options))


def _status(stopped_by) -> int:
    """The exit status after `serve` drained: 130 (the shell's for SIGINT) after Ctrl-C, else 0 (SIGTERM is how a
    process manager stops a server: a clean exit)."""
    return INTERRUPTED_STATUS if stopped_by == signal.SIGINT else 0
