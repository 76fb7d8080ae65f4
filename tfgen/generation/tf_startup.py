"""TensorFlow's C++ start-up lines, held to `TF_CPP_MIN_LOG_LEVEL` (3 unless the user set it) when tfgen is the one
that imports TensorFlow: the `tfgen` command (`tfgen/cli.py`) and the library alike. TensorFlow-free: it runs before
TensorFlow is imported.

Importing TensorFlow prints lines such as "Could not find cuda drivers" (twice: two of its shared libraries log it as
they load, before absl's logging is set up, so no setting silences them), absl's notice of early logging, oneDNN's
and the CPU-instruction notices, and at the first op "failed call to cuInit" on a machine without a GPU. TensorFlow
reads `TF_CPP_MIN_LOG_LEVEL` once, while it is imported; the lines printed before that are dropped here instead: file
descriptor 2 points at a temporary file during the import, and what was written there is replayed on stderr without
the TensorFlow log lines below the level (all of it when the import fails). To see them, set
`TF_CPP_MIN_LOG_LEVEL=0` (or 1, 2) before the first import.

`import tfgen` installs `quiet_first_import()`'s hook: the first import of TensorFlow made by a tfgen module
(directly or through Keras) goes through `import_tensorflow_quietly`. An import made by the user's own code, before
or after `import tfgen`, is left alone.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import inspect
import os
import re
import sys
import tempfile
import threading

#: The level tfgen uses when the user set none: only lines of errors that end the process.
QUIET_LEVEL = 3
LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"

# The first line of a TensorFlow C++ log message: severity, date, time, thread, file:line. Before absl's logging
# is set up the time reads "00:00:<seconds since 1970>": "I0000 00:00:1795452449.924579    3605 cudart_stub.cc:31] ".
_TF_LOG_LINE = re.compile(r"(?P<severity>[IWEF])\d{4} [\d:.]+ +\d+ \S+:\d+\] ")
# absl prints it, at warning level, before the first message logged ahead of its initialisation.
_ABSL_EARLY_NOTICE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY_LEVELS = {"I": 0, "W": 1, "E": 2, "F": 3}


def min_log_level() -> int:
    """The level `TF_CPP_MIN_LOG_LEVEL` sets (`QUIET_LEVEL` when unset; 0, as TensorFlow reads it, when it is not a
    number)."""
    try:
        return int(os.environ.get(LEVEL_VARIABLE, QUIET_LEVEL))
    except ValueError:
        return 0


def import_tensorflow_quietly(min_level: int) -> None:
    """Imports TensorFlow (nothing when it is imported already), dropping the C++ log lines below `min_level` that
    it prints while loading (see the module docstring). The caller sets `TF_CPP_MIN_LOG_LEVEL` for the lines after."""
    if "tensorflow" in sys.modules:
        return
    uninstall_hook()
    with tf_lines_below_dropped(min_level):
        import tensorflow  # noqa: F401


@contextlib.contextmanager
def tf_lines_below_dropped(min_level: int):
    """Runs the block with file descriptor 2 captured, then replays what was written there on stderr without the
    TensorFlow C++ log lines below `min_level` (all of it when the block raises). Without a usable descriptor 2 or
    `sys.stderr`, runs the block as it is."""
    try:
        real_stderr = os.dup(2)
    except OSError:  # closed: nothing to keep quiet
        yield
        return
    if sys.stderr is not None:
        sys.stderr.flush()
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            min_level = 0  # everything: it may explain the failure
            raise
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(real_stderr, 2)
            os.close(real_stderr)
            captured.seek(0)
            text = without_tf_lines_below(captured.read().decode(errors="replace"), min_level)
            if text and sys.stderr is not None:
                sys.stderr.write(text)
                sys.stderr.flush()


# TensorFlow before 2.21 logs "Compiled cluster using XLA!" (INFO) at a process's first XLA compile through absl before
# absl's logging is set up, which prints it whatever `TF_CPP_MIN_LOG_LEVEL` says (2.21 holds it to the level).
_FIRST_COMPILE = threading.Lock()
_first_compile_pending = True


@contextlib.contextmanager
def first_compile_quiet(tf_version: str):
    """Runs the block (a compiled program's first call) with the TensorFlow log lines below `min_log_level()` dropped
    from descriptor 2 (`tf_lines_below_dropped`) when it is the process's first such block and `tf_version` is
    older than 2.21; else as it is."""
    global _first_compile_pending
    with _FIRST_COMPILE:
        needed, _first_compile_pending = _first_compile_pending and _older_than_2_21(tf_version), False
    if not needed:
        yield
        return
    with tf_lines_below_dropped(min_log_level()):
        yield


def _older_than_2_21(version: str) -> bool:
    """Whether a TensorFlow version string ("2.20.0", "2.20.0-rc1") names a release before 2.21."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return bool(found) and (int(found[1]), int(found[2])) < (2, 21)


def without_tf_lines_below(text: str, min_level: int) -> str:
    """`text` without the lines of TensorFlow C++ log messages below `min_level`, and without absl's notice of
    early logging when warnings are below it too."""
    kept = []
    for line in text.splitlines(keepends=True):
        message = _TF_LOG_LINE.match(line)
        if message:
            level = _SEVERITY_LEVELS[message["severity"]]
        elif line.rstrip("\n") == _ABSL_EARLY_NOTICE:
            level = _SEVERITY_LEVELS["W"]
        else:
            level = min_level  # not TensorFlow's log: always kept
        if level >= min_level:
            kept.append(line)
    return "".join(kept)


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """An import hook for the name "tensorflow" only: when a tfgen module imports it first, its module runs with the
    start-up lines below the level dropped and `TF_CPP_MIN_LOG_LEVEL` at `QUIET_LEVEL` unless the user set it (set
    for the import only: TensorFlow has read it by then). Removes itself at the first import of TensorFlow."""

    def find_spec(self, name, path=None, target=None):
        if name != "tensorflow":
            return None
        uninstall_hook()
        if not _imported_by_tfgen():
            return None  # the user's own import: theirs to configure
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    """Runs TensorFlow's real loader with the start-up lines dropped, and puts the real loader back on the module
    (and its spec) before its code runs, so that TensorFlow sees the loader it always has."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        user_set = LEVEL_VARIABLE in os.environ
        min_level = min_log_level()
        os.environ.setdefault(LEVEL_VARIABLE, str(QUIET_LEVEL))
        try:
            with tf_lines_below_dropped(min_level):
                self.loader.exec_module(module)
        finally:
            if not user_set:
                os.environ.pop(LEVEL_VARIABLE, None)  # TensorFlow has read it; child processes get the user's


def _imported_by_tfgen() -> bool:
    """Whether a tfgen module is on the stack of the import being found (Keras importing TensorFlow for tfgen
    counts)."""
    frame = inspect.currentframe().f_back
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if (name == "tfgen" or name.startswith("tfgen.")) and frame.f_globals is not globals():
            return True
        frame = frame.f_back
    return False


_HOOK = _QuietFirstImport()


def quiet_first_import() -> None:
    """Installs the hook that quiets the first import of TensorFlow made by tfgen (nothing when TensorFlow is already
    imported). `import tfgen` calls it; it imports nothing."""
    if "tensorflow" not in sys.modules and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def uninstall_hook() -> None:
    """Removes the hook (once TensorFlow is imported, or about to be, it has nothing left to do)."""
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_HOOK)
