"""The codebase's own rules, checked on the source: no module reaches into another module's private names, and
no module grows past ~400 lines."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tfgen"
# The NamedTuple API is public despite its underscores.
_PUBLIC_UNDERSCORED = {"_replace", "_fields", "_asdict", "_make"}
MAX_LINES = 420


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in _PUBLIC_UNDERSCORED


def _defined_names(tree: ast.Module) -> set[str]:
    """Every name a module binds anywhere (functions, classes, attributes, assignments)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


@pytest.mark.parametrize("path", _modules(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_module_uses_another_modules_private_names(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = _defined_names(tree)
    offences = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfgen"):
            offences += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names
                         if _is_private(a.name)]
        elif isinstance(node, ast.Attribute) and _is_private(node.attr) and node.attr not in own:
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue  # a subclass using its base class's protected members
            offences.append(f"line {node.lineno}: {ast.unparse(node)}")
    assert not offences, "private names used outside their module:\n" + "\n".join(offences)


def test_modules_stay_small():
    too_long = {str(path.relative_to(PACKAGE)): lines for path in _modules()
                if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines (one concern each): {too_long}"
