"""`tfgen.serving.serve`: load an export folder's versions, serve them over REST (and TF Serving's gRPC API) until
SIGTERM or Ctrl-C, polling for new versions, then drain: no new connection or request is taken, the requests
running finish (within `drain_timeout` seconds), and one line says what was done."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time

from tfgen.serving.http import ModelServer, start_in_thread
from tfgen.serving.options import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_PORT,
    check_drain_timeout,
    check_server_options,
)
from tfgen.serving.versions import DEFAULT_POLL_INTERVAL, ServedModels, check_polling_options

# The signals that stop the server (a process manager's SIGTERM; SIGINT: Ctrl-C).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve(export_dir, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, model_name: str | None = None,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, max_connections: int = DEFAULT_MAX_CONNECTIONS,
          poll_interval_s: float | None = DEFAULT_POLL_INTERVAL, version_policy: str = "latest",
          grpc_port: int | None = None, batching: dict | None = None,
          drain_timeout: float = DEFAULT_DRAIN_TIMEOUT, started: float | None = None) -> signal.Signals | None:
    """Loads the newest version under `export_dir` (every version with `version_policy="all"`) and serves it until
    SIGTERM or SIGINT (Ctrl-C), looking for new versions every `poll_interval_s` seconds (0 or None: never; see
    `tfgen.serving.versions`). REST listens on `port`; with `grpc_port`, TF Serving's gRPC API too (0 for either:
    any free port; needs `pip install "tfgen[serve]"`). `batching`: continuous batching's options
    (`steps_per_call`, `max_queue`; see `tfgen.serving.batching.attach_engine`) for exports with slot signatures,
    None to run every request as a whole call of its signature. Once both ports listen, one line says "ready on
    REST port N, gRPC port M (S s)", S counted from `started` (a `time.monotonic()`; default: this call).

    On the signal it drains: the ports close (new connections are refused), a new request on an open connection
    gets 503, the requests running get `drain_timeout` seconds to finish, then the versions unload; one line on
    stderr says what was done. Returns the signal that stopped it (None outside the main thread, where signals
    cannot be caught: there a KeyboardInterrupt stops it the same way)."""
    started = time.monotonic() if started is None else started
    check_server_options(port=port, max_request_bytes=max_request_bytes, max_connections=max_connections)
    check_polling_options(poll_interval_s=poll_interval_s, version_policy=version_policy)
    check_drain_timeout(drain_timeout)
    if grpc_port is not None:
        check_server_options(port=grpc_port)
        from tfgen.serving.grpc_api import GrpcModelServer  # tensorflow-serving-api: `pip install "tfgen[serve]"`
    models = ServedModels(export_dir, model_name, version_policy=version_policy, batching=batching,
                          drain_timeout=drain_timeout)
    try:
        server = ModelServer(models, host, port, max_request_bytes, max_connections)
        try:
            grpc_server = None if grpc_port is None else GrpcModelServer(models, host, grpc_port, max_request_bytes,
                                                                         max_connections)
        except BaseException:
            server.server_close()
            raise
    except BaseException:
        models.close(0)
        raise
    try:
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
        with _stop_signals() as stopped:
            # Said once SIGTERM drains: a process manager may stop the server as soon as it reads this line.
            grpc = "" if grpc_server is None else f", gRPC port {grpc_server.port}"
            print(f"ready on REST port {server.server_address[1]}{grpc} ({time.monotonic() - started:.1f} s)",
                  file=sys.stderr, flush=True)
            started = _serve_until_stopped(server, stopped)
            report = _drain(server, grpc_server, models, drain_timeout, started)
        name = stopped["signal"].name if stopped.get("signal") else "interrupted"
        print(f"tfgen serve: {name}: {report}", file=sys.stderr, flush=True)
        return stopped.get("signal")
    finally:
        if grpc_server is not None:
            grpc_server.stop()  # (again: a no-op after the drain)
        server.server_close()
        models.close(0)


@contextlib.contextmanager
def _stop_signals():
    """Within the block, SIGTERM and SIGINT set the yielded dict's "signal" and "event" instead of ending the
    process (in the main thread only; elsewhere nothing changes). A second Ctrl-C during the drain still ends a
    `tfgen` command at once (`tfgen.commands.interrupts` counts them from the signal wakeup fd)."""
    stopped = {"event": threading.Event()}

    def handle(number, frame):
        stopped.setdefault("signal", signal.Signals(number))
        stopped["event"].set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        # A signal the process was started ignoring (`nohup`, a background job's SIGINT) stays ignored.
        previous = {number: signal.signal(number, handle) for number in STOP_SIGNALS
                    if signal.getsignal(number) is not signal.SIG_IGN}
    try:
        yield stopped
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _serve_until_stopped(server: ModelServer, stopped: dict) -> float:
    """Serves in a thread until the stop event (or a KeyboardInterrupt here); returns when the stop came."""
    thread = start_in_thread(server)
    try:
        while thread.is_alive() and not stopped["event"].wait(0.5):
            pass
    except KeyboardInterrupt:
        stopped.setdefault("signal", signal.SIGINT)
    return time.monotonic()


def _drain(server: ModelServer, grpc_server, models: ServedModels, drain_timeout: float, started: float) -> str:
    """Stops taking work, lets the requests running finish until `drain_timeout` after `started`, unloads the
    versions; returns what was done, in words."""
    deadline = started + drain_timeout
    models.stop_polling()
    running = server.stop_accepting()
    grpc_stopped = None if grpc_server is None else grpc_server.stop(drain_timeout, wait=False)
    cut = server.wait_closed(deadline)
    if grpc_stopped is not None:
        grpc_stopped.wait(max(0.0, deadline - time.monotonic()))
    server.server_close()
    models.close(max(0.0, deadline - time.monotonic()))
    cut_off = f"; {cut} still running after {drain_timeout:g} s were cut off" if cut else ""
    return (f"stopped accepting connections, finished {running - cut} in-flight requests in "
            f"{time.monotonic() - started:.1f} s{cut_off}; exiting")
