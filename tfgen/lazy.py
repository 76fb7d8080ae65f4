"""Packages whose public names load on first use (PEP 562), so importing a package stays cheap and, where it
matters, free of TensorFlow until a name that needs it is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """`(__getattr__, __dir__)` for `package`, whose name `n` lives in module `exports[n]`; a loaded name is
    stored in `namespace` (the package's globals) so it loads once."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__():
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
