"""XLA's persistent compilation cache, on by default: a later process loads the programs an earlier one compiled.

TensorFlow 2.21 saves every executable that `tf.function(jit_compile=True)` compiles to the directory that
`--tf_xla_persistent_cache_directory` in `TF_XLA_FLAGS` names, and a later process compiling the same program
loads it instead of running XLA's optimisation and code generation (tracing and the lowering to HLO still run,
and TensorFlow checks that the saved HLO equals the new one).

The cache starts in two steps, so that `import tfgen` creates no file, folder or thread:

* `configure()`, called by `tfgen/__init__.py` on import, only chooses this process's private directory (a path,
  not created) and adds the flag to the process's `TF_XLA_FLAGS`. It must run then: TensorFlow reads
  `TF_XLA_FLAGS` once, when its runtime starts (the first op, e.g. building a model, long before the first
  generate call), and a later change has no effect.
* `start()`, called where tfgen makes a compiled program (`programs.cached_program`, `load_export`), creates the
  directory, removes abandoned ones, fills it from the store in a thread and registers the publisher that runs at
  exit. It runs once; later calls return at once.

Two properties of TensorFlow's cache shape this module:

* An entry TensorFlow cannot load fails the call instead of recompiling, and an entry written by another
  TensorFlow build, for another CPU or under other XLA flags would load code built for them. So the entries live
  in a store per TensorFlow build, host and XLA flags (`store_directory()`), each file named after its SHA-256,
  and TensorFlow only sees a private directory per process, holding hard links to the store entries that pass
  `cache_entries.stored_entry_problem` (a regular file, never read through a link, whose checksum, key and HLO
  match); the others are deleted with one warning and their programs compile again. A first call that fails
  anyway has `heal()` delete what this process took from the store and runs again (`programs.HealingProgram`).
  At exit the entries TensorFlow wrote move into the store; the oldest beyond `MAX_STORE_BYTES` are deleted.
* TensorFlow keys an entry by the traced function's name and HLO, and the name carries a per-process trace
  counter: a process hits the cache when it traces the same functions in the same order, as repeated `tfgen`
  commands do.

TensorFlow also fails every compile whose entry it cannot write, including when it cannot create the directory
the flag names. So `configure()` sets the flag only when the directory's nearest existing parent is a folder this
process may write (a few `stat` calls), and `start()` warns when the cache is off for that reason.

Environment: `TFGEN_COMPILE_CACHE=0` (or off, false, no) turns the cache off; `TFGEN_CACHE_DIR` moves tfgen's cache
folder (default `$XDG_CACHE_HOME/tfgen`, else `~/.cache/tfgen`); a `TF_XLA_FLAGS` that already names a cache
directory is left alone. See `docs/compile-cache.md`.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import logging
import os
import platform
import re
import secrets
import shutil
import threading
from pathlib import Path

from tfgen.generation.cache_entries import stored_entry_problem

logger = logging.getLogger(__name__)

ENABLE_VARIABLE = "TFGEN_COMPILE_CACHE"
ROOT_VARIABLE = "TFGEN_CACHE_DIR"
DIRECTORY_FLAG = "--tf_xla_persistent_cache_directory"
# The flag text configure() added to TF_XLA_FLAGS, so that a child process (which inherits both variables) can
# tell the parent's private directory from a directory the user chose, and take its own.
_ADDED_FLAG_VARIABLE = "_TFGEN_ADDED_XLA_FLAG"
# At exit, the store's oldest entries beyond this size are deleted (the shipped model's programs take ~1 MB each).
MAX_STORE_BYTES = 256 * 2**20
_OFF_VALUES = ("0", "off", "false", "no")
_ON_VALUES = ("", "1", "on", "true", "yes")
# TensorFlow names an entry <prefix>__<signature hash>__<HLO hash>__<device type>.pb; the store appends its SHA-256.
_STORED_ENTRY = re.compile(r"(?P<name>.+\.pb)\.(?P<digest>[0-9a-f]{64})")
# /proc/cpuinfo fields that decide which instructions XLA's CPU code generation may use.
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags", "Features", "CPU implementer",
               "CPU architecture", "CPU variant", "CPU part")

_configured = False
_directory: str | None = None
_configured_pid: int | None = None
# Why the cache is off although enabled (its folder cannot be created): warned by start(), not on import.
_off_reason: str | None = None
_started = False
_start_lock = threading.Lock()
# The thread that filled this process's private directory (None before start() or without the cache): what heal()
# deletes when a program loaded from the cache fails.
_filler: _Filler | None = None


def enabled() -> bool:
    """Whether `TFGEN_COMPILE_CACHE` leaves the cache on (unset, 1, on, true, yes) or turns it off (0, off, false,
    no). Raises ValueError naming the variable for any other value."""
    value = os.environ.get(ENABLE_VARIABLE, "").strip().lower()
    if value not in _OFF_VALUES + _ON_VALUES:
        raise ValueError(
            f"{ENABLE_VARIABLE}={os.environ[ENABLE_VARIABLE]!r}: expected one of {', '.join(_OFF_VALUES)} (off) or "
            f"{', '.join(v for v in _ON_VALUES if v)} (on)"
        )
    return value not in _OFF_VALUES


def cache_root() -> Path:
    """tfgen's cache folder: `$TFGEN_CACHE_DIR`, else `$XDG_CACHE_HOME/tfgen`, else `~/.cache/tfgen`."""
    if os.environ.get(ROOT_VARIABLE):
        return Path(os.environ[ROOT_VARIABLE]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfgen"


def store_directory() -> Path:
    """The store of this TensorFlow build, host and XLA flags: `<cache_root()>/xla/<fingerprint>`."""
    return cache_root() / "xla" / _fingerprint()


def configure() -> str | None:
    """Chooses this process's private cache directory and points TensorFlow's persistent compilation cache at it
    (`TF_XLA_FLAGS`), creating nothing: `start()` creates the directory when tfgen makes its first compiled program.

    Does nothing when `TFGEN_COMPILE_CACHE` turns the cache off or `TF_XLA_FLAGS` already names a cache directory,
    and leaves the cache off (warned by `start()`) when the directory could not be created. Returns the directory
    TensorFlow will use, or None; later calls return the first call's answer. It takes effect only before
    TensorFlow starts its runtime (its first op or device query), which reads the flags.
    """
    global _configured, _directory, _off_reason, _configured_pid
    if not _configured:
        _directory, _off_reason = _configure()
        _configured, _configured_pid = True, os.getpid()
    return _directory


def _configure() -> tuple[str | None, str | None]:
    """`(private directory, None)` with the flag set, else `(None, why the cache is off)` (None: turned off or the
    user's own directory)."""
    flags = _user_xla_flags()
    # A parent tfgen process's directory: this process takes its own (or none).
    os.environ.pop(_ADDED_FLAG_VARIABLE, None)
    _set_xla_flags(flags)
    if not enabled() or DIRECTORY_FLAG in flags:
        return None, None
    runs = store_directory() / "runs"
    if '"' in str(runs):
        # TensorFlow reads the flag's value up to the closing double quote.
        raise ValueError(f"{ROOT_VARIABLE}: the cache folder {str(runs)!r} must not contain a double quote")
    if not _creatable(runs):
        # TensorFlow would fail every compile, unable to create the directory the flag names.
        return None, f"cannot create folders in {runs}"
    private = runs / f"{os.getpid()}@{platform.node()}@{secrets.token_hex(4)}"
    flag = f'{DIRECTORY_FLAG}="{private}"'
    _set_xla_flags(f"{flags} {flag}".strip())
    os.environ[_ADDED_FLAG_VARIABLE] = flag
    return str(private), None


def _creatable(folder: Path) -> bool:
    """Whether `folder` exists or could be created: its nearest existing ancestor is a directory this process may
    write and enter (`stat` / `access` calls only)."""
    for path in (folder, *folder.parents):
        if os.path.lexists(path):
            return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)
    return False


def start() -> None:
    """Starts the cache `configure()` planned: creates the private directory (TensorFlow may have made it already),
    removes the directories of ended processes, starts the thread that fills it from the store and registers the
    publisher that runs at exit. Called before tfgen's compiled programs first run; runs once (thread-safe), later
    calls return at once. Logs one warning when the cache is off because its folder cannot be created."""
    global _started
    if _started:
        return
    with _start_lock:
        if _started:
            return
        _started = True
        private = configure()
        if _off_reason is not None:
            logger.warning("tfgen's compile cache is off: %s", _off_reason)
        # A child forked before the parent's first program shares the parent's directory (and TensorFlow may have
        # read the parent's flag already): the parent creates, fills and publishes it, the child never deletes it.
        if private is not None and os.getpid() == _configured_pid:
            _start(Path(private))


def _start(private: Path) -> None:
    """Creates `private` (warning when it cannot), removes abandoned runs beside it, starts the filler and registers
    the publisher."""
    runs = private.parent
    store = runs.parent
    try:
        private.mkdir(mode=0o700, parents=True, exist_ok=True)  # as private as tempfile.mkdtemp's
    except OSError as error:
        # Its parent looked writable on import, so the flag is set, and TensorFlow read it long ago: it fails the
        # compiles until the folder can be made (a full disk, a file system that refuses it).
        logger.warning("tfgen's compile cache cannot create its folder (%s): XLA compiles fail until it can be "
                       "created; set %s=0 to run without the cache", error, ENABLE_VARIABLE)
        return
    try:
        _remove_abandoned_runs(runs)
    except OSError:  # another process is removing them too: what is left goes at a later start
        pass
    global _filler
    filler = _filler = _Filler(private, store)
    filler.start()
    atexit.register(_publish, filler, os.getpid())


def heal(error: BaseException) -> bool:
    """Called when a compiled program's first call failed with `error` (a TensorFlow error): TensorFlow may have
    read an entry from this cache that it could not use, and it does not say which. So this deletes every entry
    this process took from the store (from the store and the private directory), stops taking more, logs one
    warning and returns True: the caller runs the program once more, traced anew (TensorFlow remembers the failure
    of the traced function for the rest of the process), and it compiles. Returns False when this process took no
    entry from the store (the failure is not the cache's: the caller raises it)."""
    filler = _filler
    if filler is None:
        return False
    filler.stopping.set()
    filler.join()
    with _start_lock:
        taken = sorted(filler.sources.items())
        for name, source in taken:
            source.unlink(missing_ok=True)
            (filler.private / name).unlink(missing_ok=True)
            filler.linked.discard(name)
            del filler.sources[name]
    if not taken:
        return False
    # A graph's error opens with "Graph execution error:" and the trace of the node: say what failed instead.
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and not line[0].isspace()]
    summary = next((line for line in lines if not line.endswith(":")), "")[:200]
    logger.warning("tfgen's compile cache: a program loaded from it failed (%s: %s); removed the %d entr%s this "
                   "process took from the cache and compiling again", type(error).__name__, summary, len(taken),
                   "y" if len(taken) == 1 else "ies")
    return True


def compiled_here() -> int | None:
    """How many programs this process compiled itself (not loaded from the store) so far; None without the cache."""
    filler = _filler
    return None if filler is None else sum(path.name not in filler.linked for path in filler.private.glob("*.pb"))


def _user_xla_flags() -> str:
    """`TF_XLA_FLAGS` without the flag `configure()` added, here or in a parent process."""
    flags = os.environ.get("TF_XLA_FLAGS", "")
    added = os.environ.get(_ADDED_FLAG_VARIABLE)
    return (flags.replace(added, "") if added else flags).strip()


def _set_xla_flags(flags: str) -> None:
    if flags:
        os.environ["TF_XLA_FLAGS"] = flags
    else:
        os.environ.pop("TF_XLA_FLAGS", None)


def _fingerprint() -> str:
    """A hash of what makes a compiled executable valid: the TensorFlow build (its package files' sizes and
    times, read without importing it), the CPU and GPU models, and the XLA flags in the environment."""
    parts = [platform.machine(), os.environ.get("XLA_FLAGS", ""), _user_xla_flags()]
    spec = importlib.util.find_spec("tensorflow")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        with os.scandir(folder) as entries:
            parts += sorted(f"{e.name}:{e.stat().st_size}:{e.stat().st_mtime_ns}" for e in entries if e.is_file())
    parts += _cpu_identity() + _gpu_models()
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _cpu_identity() -> list[str]:
    """The first processor's model and instruction-set lines of /proc/cpuinfo (elsewhere: `platform.processor()`)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            first_processor = cpuinfo.read().split("\n\n", 1)[0]
    except OSError:
        return [platform.processor()]
    return [line for line in first_processor.splitlines() if line.split(":", 1)[0].strip() in _CPU_FIELDS]


def _gpu_models() -> list[str]:
    """The NVIDIA driver's model line of every GPU (none without the driver)."""
    models = []
    for information in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            models += [line for line in information.read_text().splitlines() if line.startswith("Model:")]
        except OSError:
            continue
    return models


def _remove_abandoned_runs(runs: Path) -> None:
    """Deletes the private directories of this host's processes that ended without publishing (killed, crashed):
    what TensorFlow wrote there was never checksummed."""
    if os.name != "posix":
        return  # os.kill(pid, 0), the liveness probe, terminates the process on Windows
    host = platform.node()
    for run in runs.iterdir():
        pid, _, rest = run.name.partition("@")
        if rest.rpartition("@")[0] == host and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(run, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


class _Filler(threading.Thread):
    """Links each healthy store entry (`cache_entries.stored_entry_problem`) into the private directory under
    TensorFlow's name, newest first, and deletes the others, with one warning listing them.

    It runs in a thread so that the first compiled program does not wait for the hashing: TensorFlow looks for an
    entry only after tracing the program, and compiles the program itself when the entry is not there yet.
    """

    def __init__(self, private: Path, store: Path):
        super().__init__(name="tfgen-compile-cache", daemon=True)
        self.private = private
        self.store = store
        self.linked: set[str] = set()
        #: The store entry each linked name came from (what `heal` deletes).
        self.sources: dict[str, Path] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        removed: list[str] = []
        try:
            status = self.store.stat()
            if status.st_uid != getattr(os, "geteuid", lambda: status.st_uid)() or status.st_mode & 0o002:
                # An entry is machine code this process runs: only its user may have written it.
                logger.warning("tfgen's compile cache does not load from %s: another user owns it or may write to "
                               "it; its programs compile", self.store)
                return
            for path, name, digest in _stored_entries(self.store):
                if self.stopping.is_set():
                    return
                if name in self.linked:
                    # Two processes that compiled the same program both stored it: the newest entry is enough.
                    path.unlink(missing_ok=True)
                    continue
                problem = stored_entry_problem(path, name, digest, MAX_STORE_BYTES)
                if problem is not None:
                    path.unlink(missing_ok=True)
                    removed.append(f"{name}: {problem}")
                elif self._link(path, self.private / name):
                    self.linked.add(name)
                    self.sources[name] = path
        except OSError as error:  # the store was deleted or made unreadable: the programs compile
            logger.warning("tfgen's compile cache could not read %s: %s", self.store, error)
        finally:
            if removed:
                logger.warning("tfgen's compile cache removed %d damaged entr%s (%s); %s compile%s again",
                               len(removed), "y" if len(removed) == 1 else "ies", "; ".join(removed),
                               "its program" if len(removed) == 1 else "their programs",
                               "s" if len(removed) == 1 else "")

    @staticmethod
    def _link(path: Path, target: Path) -> bool:
        """Puts `path` at `target` in one step (TensorFlow may be looking); False when either is taken or gone."""
        try:
            os.link(path, target)
        except (FileNotFoundError, FileExistsError):  # deleted by another process; compiled here meanwhile
            return False
        except OSError:  # a file system without hard links: a copy, renamed into place
            partial = target.with_name(target.name + ".partial")
            try:
                shutil.copyfile(path, partial)
            except FileNotFoundError:
                return False
            os.replace(partial, target)
        return True


def _stored_entries(store: Path) -> list[tuple[Path, str, str]]:
    """`(path, TensorFlow's name, SHA-256)` of the store's entries, newest first."""
    entries = []
    for path in store.iterdir():
        match = _STORED_ENTRY.fullmatch(path.name)
        if match:
            try:
                # lstat: a symbolic link is an entry of its own (removed by the filler), never its target.
                entries.append((path.lstat().st_mtime_ns, path, match["name"], match["digest"]))
            except FileNotFoundError:  # another process deleted it meanwhile
                continue
    return [entry[1:] for entry in sorted(entries, reverse=True)]


def _digest(path: Path) -> str | None:
    """The file's SHA-256 in hex, or None when it is gone."""
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def _publish(filler: _Filler, owner_pid: int) -> None:
    """At exit: moves the entries TensorFlow wrote in this process into the store, each named after its SHA-256,
    deletes the private directory, and trims the store to `MAX_STORE_BYTES`."""
    if os.getpid() != owner_pid:
        return  # a forked child exiting: the directory still belongs to the parent
    filler.stopping.set()
    filler.join()
    for path in filler.private.glob("*.pb"):  # TensorFlow's half-written entries end in .tmp
        if path.name not in filler.linked:
            try:
                os.replace(path, filler.store / f"{path.name}.{_digest(path)}")
            except OSError as error:  # the store was deleted or is full: only this entry is lost
                logger.warning("tfgen's compile cache could not store %s: %s", path.name, error)
    shutil.rmtree(filler.private, ignore_errors=True)
    kept = 0
    try:
        for path, _, _ in _stored_entries(filler.store):
            kept += path.lstat().st_size
            if kept > MAX_STORE_BYTES:
                path.unlink()
    except OSError:  # another process is trimming too, or the store is gone: trimmed at a later exit
        pass
