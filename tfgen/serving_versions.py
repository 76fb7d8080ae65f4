"""The versions of one exported model that `tfgen serve` holds, and how a request names one of them.

TF Serving's model of versions: `EXPORT_DIR/<n>/` folders, the newest one served by default (its
`latest` policy), a request may name a version (`/versions/<n>`, or `model_spec.version` over gRPC).
The REST server (`tfgen/serving.py`) and the gRPC server (`tfgen/serving_grpc.py`) both find the model a
request is for through `ServedModels.resolve`, so they answer the same way.
"""

from __future__ import annotations

import os
import threading
from http import HTTPStatus
from typing import Optional

from tfgen.serving_requests import RequestError, ServedModel, load_export


class ServedModels:
    """The loaded versions of one model name, served from `export_dir`.

    `resolve(name, version)` returns the `ServedModel` a request names (the newest version when it names
    none); `latest` is that newest version. Thread safe: servers call `resolve` from many threads.
    """

    def __init__(self, export_dir, model_name: Optional[str] = None, *, loaded: Optional[ServedModel] = None):
        self.export_dir = os.fspath(export_dir) if export_dir is not None else None
        first = loaded if loaded is not None else load_export(export_dir, model_name)
        self.name = first.name
        self._lock = threading.Lock()
        self._versions: dict[int, ServedModel] = {first.version: first}

    @classmethod
    def of(cls, model: ServedModel) -> "ServedModels":
        """A registry holding one already loaded version (`model.directory`'s parent is its export folder)."""
        return cls(os.path.dirname(model.directory), loaded=model)

    @property
    def latest(self) -> ServedModel:
        with self._lock:
            return self._versions[max(self._versions)]

    def available(self) -> list[ServedModel]:
        """Every loaded version, oldest first."""
        with self._lock:
            return [self._versions[version] for version in sorted(self._versions)]

    def resolve(self, name: str, version: Optional[int] = None) -> ServedModel:
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
                               f"{self.name!r} (serving {', '.join(map(str, served))})")
        return found

    def close(self) -> None:
        """Stops what the versions run in the background (the continuous-batching engines)."""
        for model in self.available():
            model.close()
