"""The versions of one exported model that `tfgen serve` holds, how a request names one of them, and how new
versions are picked up while serving.

TF Serving's model of versions: `EXPORT_DIR/<n>/` folders, the newest one served by default (its `latest`
policy), a request may name a version (`/versions/<n>`, or `model_spec.version` over gRPC). The REST server
(`tfgen/serving/http.py`) and the gRPC server (`tfgen/serving/grpc_api.py`) both find the model a request is for through
`ServedModels.resolve`, so they answer the same way.

Like TF Serving's file system source (`--file_system_poll_wait_seconds`), `ServedModels.start_polling` looks at
`export_dir` every few seconds: a new complete version folder is loaded (its warm-up requests replayed) and then
served; under the `latest` policy the older versions are unloaded once it is ready, under `all` every version on
disk is served. A version folder removed from disk is unloaded. A version being unloaded lets the requests using
it (`acquire`) finish first, within `drain_timeout` seconds, then drops its SavedModel and hands the memory back
(`release_memory`; for an XLA export its compiled programs too, and the versions still served warm up again). A
version that fails to load is logged and left out (tried again if its folder is removed and written anew); the
versions already served keep serving.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from http import HTTPStatus

from tfgen.serving.errors import RequestError
from tfgen.serving.options import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    VERSION_POLICIES,
    check_drain_timeout,
    check_polling_options,
)
from tfgen.serving.served_model import ServedModel, export_versions, load_export, release_memory
from tfgen.value_types import is_real

# Re-exported: the options' defaults and checks live in `tfgen.serving.options` (TF-free, for the command line).
__all__ = ["DEFAULT_POLL_INTERVAL", "VERSION_POLICIES", "ServedModels", "check_polling_options"]

logger = logging.getLogger(__name__)


class ServedModels:
    """The loaded versions of one model name, served from `export_dir`.

    `resolve(name, version)` returns the `ServedModel` a request names (the newest version when it names
    none); `latest` is that newest version. `version_policy` "latest" serves the newest version under
    `export_dir` (the one loaded at construction, or `loaded`), "all" every version there. `poll()` brings the
    versions served in line with the folder once; `start_polling(interval_s)` does it in a background thread
    until `close()`. `warmup`: replay each version's warm-up requests when it loads. `drain_timeout`: seconds an
    unloaded version gives the requests using it (`acquire`) to finish. Thread safe: servers call
    `resolve` from many threads while the poll thread swaps versions.
    """

    def __init__(self, export_dir, model_name: str | None = None, *, loaded: ServedModel | None = None,
                 version_policy: str = "latest", warmup: bool = True, batching: dict | None = None,
                 drain_timeout: float = DEFAULT_DRAIN_TIMEOUT):
        check_polling_options(version_policy=version_policy)
        check_drain_timeout(drain_timeout)
        self.drain_timeout = drain_timeout
        self.export_dir = os.fspath(export_dir) if export_dir is not None else None
        self.version_policy = version_policy
        self.warmup = warmup
        self.batching = batching  # `load_export`'s continuous-batching options for every version loaded
        first = loaded if loaded is not None else load_export(export_dir, model_name, warmup=warmup, batching=batching)
        self.name = first.name
        self._lock = threading.RLock()  # guards _versions (re-entered: `acquire` calls `resolve` under it)
        self._poll_lock = threading.Lock()  # one poll at a time
        self._versions: dict[int, ServedModel] = {first.version: first}
        self._failed: set[int] = set()  # versions that failed to load, not tried again while on disk
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if version_policy == "all" and loaded is None:
            self.poll()  # the other versions on disk

    @classmethod
    def of(cls, model: ServedModel, **options) -> ServedModels:
        """A registry holding one already loaded version (`model.directory`'s parent is its export folder)."""
        return cls(os.path.dirname(model.directory), loaded=model, **options)

    @property
    def latest(self) -> ServedModel:
        """The newest version served; a 404 RequestError when none is (every version folder was removed)."""
        with self._lock:
            if self._versions:
                return self._versions[max(self._versions)]
        raise RequestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: no version of {self.name!r} "
                           f"is served now (none left in {self.export_dir})")

    def available(self) -> list[ServedModel]:
        """Every loaded version, oldest first."""
        with self._lock:
            return [self._versions[version] for version in sorted(self._versions)]

    def resolve(self, name: str, version: int | None = None) -> ServedModel:
        """The version a request names (the newest when `version` is None); a 404 RequestError in TF Serving's
        words for another model name or a version not served."""
        if name != self.name:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: model {name!r}")
        if version is None:
            return self.latest
        with self._lock:
            found = self._versions.get(int(version))
            served = sorted(self._versions)
        if found is None:
            raise RequestError(HTTPStatus.NOT_FOUND, f"Servable not found for request: version {version} of "
                               f"{self.name!r} (serving {', '.join(map(str, served)) or 'none'})")
        return found

    @contextlib.contextmanager
    def acquire(self, name: str, version: int | None = None):
        """`resolve(name, version)` for the length of a request: the version is not closed (unloaded) until the
        block ends or `drain_timeout` passes."""
        with self._lock:  # the version cannot be taken out of the registry between finding and holding it
            model = self.resolve(name, version)
            model.hold()
        try:
            yield model
        finally:
            model.release()

    def poll(self) -> None:
        """Looks at `export_dir` once: loads the versions the policy wants that are not loaded yet (newest first;
        under `latest`, the newest that loads), then unloads those no longer wanted — under `latest` every other
        version once the newest is ready, under both policies a version whose folder is gone. Load failures are
        logged, never raised."""
        if self.export_dir is None:
            return
        with self._poll_lock:
            on_disk = export_versions(self.export_dir)
            self._failed &= set(on_disk)  # a folder removed and written again gets another try
            candidates = [version for version in reversed(on_disk) if version not in self._failed]
            with self._lock:
                loaded = set(self._versions)
            target = None
            for version in candidates:
                if version not in loaded and not self._load(version):
                    continue
                if self.version_policy == "latest":
                    target = version
                    break
            with self._lock:
                gone = [version for version in self._versions
                        if version not in on_disk or (target is not None and version != target)]
                unloaded = [self._versions.pop(version) for version in gone]
            for model in unloaded:
                logger.info("unloaded version %d of %r (%s)", model.version, self.name,
                            "newer version served" if model.version in on_disk else "its folder is gone")
                self._unload(model)

    def start_polling(self, interval_s: float = DEFAULT_POLL_INTERVAL) -> None:
        """Calls `poll()` every `interval_s` seconds in a daemon thread until `close()` (or `stop_polling()`).
        ValueError for an interval that is not a positive number, or when already polling."""
        if not is_real(interval_s) or not 0 < interval_s < float("inf"):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        if self._thread is not None:
            raise ValueError("interval_s: already polling; stop_polling() first")
        if self.export_dir is None:
            raise ValueError("export_dir: nothing to poll (the registry was built without a folder)")
        self._stop.clear()
        self._thread = threading.Thread(target=self._poll_every, args=(float(interval_s),),
                                        name=f"tfgen-poll-{self.name}", daemon=True)
        self._thread.start()

    def stop_polling(self) -> None:
        """Stops the poll thread (waits for a load in progress to end)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def close(self, timeout: float | None = None) -> None:
        """Stops polling and unloads every version, each after the requests using it finished (within `timeout`
        seconds in all; None: `drain_timeout`)."""
        self.stop_polling()
        with self._lock:
            models, self._versions = list(self._versions.values()), {}
        deadline = time.monotonic() + (self.drain_timeout if timeout is None else timeout)
        for model in models:
            self._unload(model, max(0.0, deadline - time.monotonic()))

    def _unload(self, model: ServedModel, timeout: float | None = None) -> None:
        cut = model.close(self.drain_timeout if timeout is None else timeout)
        if cut:
            logger.warning("version %d of %r unloaded with %d requests still running (cut off after %g s)",
                           model.version, self.name, cut, self.drain_timeout if timeout is None else timeout)
        release_memory(model.xla, self.available() if self.warmup else ())

    def _poll_every(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.poll()
            except Exception:  # the server keeps serving what it has, whatever one look at the folder did
                logger.exception("polling %s failed", self.export_dir)

    def _load(self, version: int) -> bool:
        """Loads `version` (warm-up included) and serves it; False, logged, when it fails."""
        started = time.monotonic()
        try:
            model = load_export(self.export_dir, self.name, version=version, warmup=self.warmup,
                                batching=self.batching)
        except Exception:
            logger.exception("version %d of %r failed to load; still serving %s", version, self.name,
                             [served.version for served in self.available()] or "nothing")
            self._failed.add(version)
            return False
        with self._lock:
            self._versions[version] = model
        logger.info("loaded version %d of %r in %.1f s", version, self.name, time.monotonic() - started)
        return True
