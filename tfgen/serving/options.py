"""The options of `tfgen serve` / `tfgen.serving.ModelServer`, their defaults and checks. TF-free, so that
`tfgen serve --help` shows the defaults and the command refuses a bad option or a port in use at once, before it
imports TensorFlow or spends time loading (or exporting) a model."""

from __future__ import annotations

import errno
import importlib.util
import socket

from tfgen.value_types import is_integer, is_real

DEFAULT_PORT = 8501  # TF Serving's REST port (its --rest_api_port)
DEFAULT_GRPC_PORT = 8500  # TF Serving's gRPC port (its --port)
GRPC_INSTALL_HINT = 'pip install "tfgen[serve]"'
DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 64
#: Seconds between two looks at the export folder for new versions (TF Serving's `--file_system_poll_wait_seconds`
#: default).
DEFAULT_POLL_INTERVAL = 1.0
#: Seconds a stopping server (SIGTERM, Ctrl-C) and a version being unloaded give the requests already running to
#: finish (`tfgen serve --drain-timeout`); what is still running after it is cut off.
DEFAULT_DRAIN_TIMEOUT = 30.0
#: TF Serving's version policies: `latest` serves the newest version only, `all` every version on disk.
VERSION_POLICIES = ("latest", "all")


def check_server_options(*, port: int, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                         max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
    """Raises ValueError naming the first bad option: port in 0..65535 (0: any free port), positive limits."""
    check_port(port)
    for name, value in (("max_request_bytes", max_request_bytes), ("max_connections", max_connections)):
        if not is_integer(value) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_port(port, name: str = "port") -> None:
    """Raises ValueError, naming the option `name`, unless `port` is an integer in 0..65535 (0: any free port)."""
    if not is_integer(port) or not 0 <= port <= 65535:
        raise ValueError(f"{name} must be an integer in 0..65535 (0: any free port), got {port!r}")


def check_polling_options(*, poll_interval_s=DEFAULT_POLL_INTERVAL, version_policy: str = "latest") -> None:
    """Raises ValueError naming the first bad option: `poll_interval_s` a number >= 0 (0 or None: no polling),
    `version_policy` one of VERSION_POLICIES."""
    if poll_interval_s is not None and (not is_real(poll_interval_s) or not 0 <= poll_interval_s < float("inf")):
        raise ValueError(f"poll_interval_s must be a finite number of seconds >= 0 (0: no polling), got "
                         f"{poll_interval_s!r}")
    if version_policy not in VERSION_POLICIES:
        raise ValueError(f"version_policy must be one of {', '.join(VERSION_POLICIES)}, got {version_policy!r}")


def check_drain_timeout(drain_timeout) -> None:
    """Raises ValueError unless `drain_timeout` is a finite number of seconds >= 0."""
    if not is_real(drain_timeout) or not 0 <= drain_timeout < float("inf"):
        raise ValueError(f"drain_timeout must be a finite number of seconds >= 0, got {drain_timeout!r}")


def check_port_free(host: str, port: int, option: str | None = None) -> None:
    """Raises ValueError for a bad port, OSError ("port 8501 is in use ...") when the server could not listen on
    host:port now; `option` (e.g. "--rest_api_port") is named in the message."""
    check_port(port, (option or "port").lstrip("-"))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((host, port))
        except OSError as error:
            raise OSError(bind_failure(host, port, error, option)) from None


def grpc_available() -> bool:
    """Whether `grpcio` and `tensorflow-serving-api` (the `serve` extra) are installed, found without importing
    them (their stubs import TensorFlow)."""
    return all(importlib.util.find_spec(name) is not None for name in ("grpc", "tensorflow_serving"))


def bind_failure(host: str, port: int, error: OSError, option: str | None = None) -> str:
    """One line saying why the server cannot listen on host:port (`option`, the flag that chose the port, named)."""
    where = f"{host} ({option})" if option else host
    if error.errno == errno.EADDRINUSE:
        return f"port {port} is in use on {where}: stop the other server or choose another port (0: any free port)"
    if error.errno == errno.EACCES:
        return f"port {port} on {where}: permission denied (ports below 1024 need privileges)"
    if isinstance(error, socket.gaierror) or error.errno == errno.EADDRNOTAVAIL:
        return f"host {host!r} is not an address of this machine ({error.strerror or error})"
    return f"cannot listen on {host}:{port}: {error.strerror or error}"

