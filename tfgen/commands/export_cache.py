"""The exports `tfgen serve --model NAME|DIR|FILE.gguf` serves: `<cache root>/exports/<name>-<key>/1/`, written on
first use by `tfgen.commands.export.export_model` and reused after. The key is a digest of what shapes the export:
the model (a GGUF file: its SHA-256, as `tfgen.gguf.load_cache` hashes it; a directory: the names, sizes and
modification times of its files, so a rewritten or replaced file gives a new entry without hashing gigabytes at
every start), the export options, and the tfgen and TensorFlow versions (a newer tfgen may export differently).

An export is written into a temporary folder beside the cache entry and renamed into place, so an interrupted one is
never reused; an entry without its `saved_model.pb` (damaged, truncated) is removed and exported again.

The export runs in a child process (`export_in_child`), so that the serving process does exactly what a later start
does: TensorFlow names the functions of a loaded SavedModel after a process-wide counter and the persistent compile
cache keys programs by those names, so an export made in the serving process left the first start's compiled
programs useless to every later start (each compiled them all again); and the exporting model's memory goes back to
the system before serving starts.

TensorFlow-free at import (the export itself imports it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

logger = logging.getLogger(__name__)

# The version folder the cached export is written to (TF Serving's layout: <base>/<version>/saved_model.pb).
VERSION = 1
KEY_FILE = "tfgen-export-key.json"
#: The `structured` signature's table sizes (STATES, CLASSES) in the exports `tfgen serve` makes, which serve the
#: OpenAI routes' `response_format` (`tfgen.serving.openai_structured`). Over SmolLM2's 49k tokens, json_object's
#: automaton has 1624 states and 137 token classes; schemas of a few fields ~50-250 states and 70-230 classes (see
#: docs/serving.md). The tables a request carries: 4 MiB.
DEFAULT_STRUCTURED_INPUTS = (2048, 512)
#: Bumped when what an export holds changes within one tfgen version, so that older cached exports are redone
#: (2: the slot state records log-probabilities, for OpenAI's `logprobs`; 3: it records none unless asked for,
#: `--slot-logprobs`; 4: constants merged and SiLU without its saved gradient, so it loads in about half the time,
#: and the top 20 recorded again by default, now only in the steps of requests that ask for them).
EXPORT_LAYOUT = 4


def exports_root() -> Path:
    """`<tfgen's cache root>/exports` (`TFGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/tfgen`, else `~/.cache/tfgen`)."""
    # Function-level: the compile cache module imports nothing heavy, but `tfgen serve --help` needs none of it.
    from tfgen.generation.compile_cache import cache_root

    return cache_root() / "exports"


def served_name(argument: str) -> str:
    """The name a `--model` argument serves under (TF Serving's model name, in the URLs): a registered name itself,
    a hub id's last part, a folder's name, a GGUF file's stem."""
    from tfgen.hub.registry import MODELS

    if argument in MODELS:
        return argument
    expanded = os.path.expanduser(argument)
    base = os.path.basename(os.path.normpath(expanded)) if os.path.exists(expanded) else argument.rstrip("/")
    base = base.split("/")[-1]
    return base[: -len(".gguf")] if base.lower().endswith(".gguf") else base


def model_digest(path: str | os.PathLike) -> str:
    """A digest of the model at `path`: a file's SHA-256 (`tfgen.gguf.load_cache.file_digest`); for a directory, the
    SHA-256 of its files' relative names, sizes and modification times (ns), hidden files and folders left out."""
    from tfgen.gguf.load_cache import file_digest

    path = os.fspath(path)
    if not os.path.isdir(path):
        return file_digest(path)
    listing = []
    for folder, folders, files in os.walk(path, followlinks=True):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            status = os.stat(os.path.join(folder, name))
            listing.append([os.path.relpath(os.path.join(folder, name), path), status.st_size, status.st_mtime_ns])
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def export_key(digest: str, options: dict) -> dict:
    """What identifies a cached export: the model's digest, the export options and the versions that wrote it."""
    import tfgen

    try:
        tensorflow = metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        tensorflow = None
    # As JSON reads it back from the key file (a tuple option is a list there), so that a written key compares equal.
    options = json.loads(json.dumps(options))
    return {"model": digest, "options": options, "tfgen": tfgen.__version__, "tensorflow": tensorflow,
            "layout": EXPORT_LAYOUT}


def is_complete(folder: Path, key: dict) -> bool:
    """Whether `folder` holds a whole export for `key`: its key file says so and `1/saved_model.pb` is there."""
    try:
        written = json.loads((folder / KEY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return written == key and (folder / str(VERSION) / "saved_model.pb").is_file()


def cached_export(argument: str | None, options: dict | None = None, *, export=None) -> tuple[str, str]:
    """`(export_dir, model_name)` for serving the model a `--model` argument names (`argument`, as
    `tfgen.hub.pull.resolve_model_argument` reads it; a registered name is pulled on first use), exported with
    `options` (keywords of `export_model`) into the cache on first use and reused after; one log line says which.
    `export`: the exporting function, called as `export(path, out_dir, version=..., **options)` (default
    `export_in_child`)."""
    from tfgen.hub.pull import resolve_model_argument

    options = dict(options or {})
    if export is None:
        export = export_in_child
    path = resolve_model_argument(argument)
    if not os.path.exists(path):  # a Hub id: its snapshot, fetched now
        from tfgen.models.loading import resolve_model_directory

        path = os.fspath(resolve_model_directory(path))
    name = served_name(argument) if argument is not None else os.path.basename(os.path.normpath(path))
    started = time.monotonic()
    key = export_key(model_digest(path), options)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    root = exports_root()
    folder = root / f"{name}-{digest}"
    if is_complete(folder, key):
        logger.info("using the export cached in %s (%s; %.1f s to check it)", folder, name,
                    time.monotonic() - started)
        return os.fspath(folder), name
    if folder.exists():
        logger.warning("the cached export in %s is incomplete or damaged: exporting it again", folder)
        shutil.rmtree(folder, ignore_errors=True)
    logger.info("exporting %s to %s (first use) ...", name, folder)
    root.mkdir(parents=True, exist_ok=True)
    # Written beside the entry, renamed into place when whole: an interrupted export is never taken for one.
    partial = Path(tempfile.mkdtemp(prefix=f".partial-{name}-", dir=root))
    umask = os.umask(0)
    os.umask(umask)
    partial.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the entry from another user's TF Serving
    try:
        export(path, os.fspath(partial), version=VERSION, **options)
        (partial / KEY_FILE).write_text(json.dumps(key, sort_keys=True))
        try:
            os.rename(partial, folder)
        except OSError:
            if not is_complete(folder, key):  # another process's entry, just written, is as good as ours
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    logger.info("exported %s in %.1f s", name, time.monotonic() - started)
    return os.fspath(folder), name


#: Export options that are switches of `tfgen export` when false (their flags turn them off).
_OFF_FLAGS = {"jit_compile": "--no-jit", "text": "--no-text"}


def export_command(model_path: str, out_dir: str, *, version: int, **options) -> list[str]:
    """The `tfgen export` command line (argv, this Python) that `export_model(model_path, out_dir, version=version,
    **options)` stands for: an option `some_name=value` is `--some-name value` (a list comma-joined), and
    `jit_compile=False` / `text=False` are `--no-jit` / `--no-text`."""
    argv = [sys.executable, "-m", "tfgen.cli", "export", out_dir, "--model", model_path,
            "--version", str(version)]
    for name, value in options.items():
        if name in _OFF_FLAGS:
            if not value:
                argv.append(_OFF_FLAGS[name])
        elif isinstance(value, bool):
            raise ValueError(f"export option {name}={value!r} has no `tfgen export` flag")
        else:
            argv += [f"--{name.replace('_', '-')}",
                     ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    if logging.getLogger("tfgen").getEffectiveLevel() > logging.INFO:
        argv.append("-q")
    return argv


def export_in_child(model_path: str, out_dir: str, *, version: int, **options) -> None:
    """Runs `tfgen export` (`export_command`) in a child process and waits for it. Its progress lines pass through to
    stderr; its one-line error becomes this process's ValueError (not printed twice). Ctrl-C here stops the child too.
    Why a child: see the module's docstring."""
    child = subprocess.Popen(export_command(model_path, out_dir, version=version, **options),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
    error = None
    try:
        for line in child.stderr:
            if line.startswith("tfgen: error: "):
                error = line[len("tfgen: error: "):].strip()
            else:
                sys.stderr.write(line)
        code = child.wait()
    except BaseException:
        child.kill()
        child.wait()
        raise
    if code == 130:
        raise KeyboardInterrupt
    if code:
        raise ValueError(error or f"exporting {model_path} failed (`tfgen export` exited with status {code}; its "
                                  "messages are above)")
