"""The codebase's own rules, checked on the source: no module reaches into another module's private names, no
module grows past ~400 lines, no import circle among tfgen's modules (function-level and TYPE_CHECKING imports
included), and the package root holds only the entry points and a few leaf utilities."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

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


# The package root: `__init__` (lazy public names), `cli` (the command's entry point) and leaf utilities that import
# no tfgen module (docs/design.md, "The structure").
ROOT_MODULES = {"__init__", "cli", "lazy", "local_files", "memory", "value_types"}
LEAF_UTILITIES = ROOT_MODULES - {"__init__", "cli"}


def _module_name(path: pathlib.Path) -> str:
    parts = ("tfgen",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: pathlib.Path, known: set[str]) -> set[str]:
    """The tfgen modules `path` imports anywhere (top level, inside functions, under TYPE_CHECKING): for
    `from a.b import c`, `a.b.c` when that is a module, else `a.b`."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            imported.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    return {module for module in imported if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    paths = _modules()
    known = {_module_name(path) for path in paths}
    return {_module_name(path): _imported_modules(path, known) for path in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for node in graph:
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_circles():
    assert circles(import_graph()) == []


def test_no_package_imports_a_package_that_imports_it():
    """Packages form layers (docs/design.md, "The structure"): the package graph has no circle either."""
    packages = {}
    for module, targets in import_graph().items():
        package = module.split(".")[1] if module.count(".") else "tfgen"
        packages.setdefault(package, set()).update(
            target.split(".")[1] if target.count(".") else "tfgen" for target in targets)
    for package, targets in packages.items():
        targets.discard(package)
    assert circles(packages) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_root_holds_entry_points_and_leaf_utilities_only():
    graph = import_graph()
    root = {path.stem for path in PACKAGE.glob("*.py")}
    assert root == ROOT_MODULES
    assert {name: sorted(graph[f"tfgen.{name}"]) for name in LEAF_UTILITIES if graph[f"tfgen.{name}"]} == {}


OPTIONAL_DEPENDENCIES = ("keras_hub", "tensorflow_text", "tensorflow_serving", "grpc")


def test_optional_dependencies_stay_optional():
    """With keras-hub, TF Text and the TF Serving stubs missing (the extras not installed), the Auto classes load and
    generate: no tfgen module a plain generate imports pulls them in at its top."""
    code = (
        "import importlib.abc, sys\n"
        "class Missing(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name.split('.')[0] in {OPTIONAL_DEPENDENCIES!r}:\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Missing())\n"
        "import tfgen\n"
        "from tfgen.hub.default_model import default_model_path\n"
        "model = tfgen.AutoModelForCausalLM.from_pretrained(default_model_path())\n"
        "tokenizer = tfgen.AutoTokenizer.from_pretrained(default_model_path())\n"
        "ids = tokenizer('def f(x):')['input_ids']\n"
        "print(model.generate(ids, max_new_tokens=2, do_sample=False, jit_compile=False).shape[1] - ids.shape[1])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "2"


def test_the_test_runner_runs_every_test_file_once_and_reports_a_failing_group(tmp_path):
    """tools/run_tests.py: each tests/test_*.py in exactly one group (a new file too), and a group that fails makes
    the run fail even when another lane passes."""
    sys.path.insert(0, str(PACKAGE.parent / "tools"))
    try:
        import run_tests
    finally:
        sys.path.pop(0)
    names = sorted(path.name for path in (PACKAGE.parent / "tests").glob("test_*.py")) + ["test_zz_new_file.py"]
    grouped = [name for group in run_tests.grouped_files(names) for name in group]
    assert sorted(grouped) == names
    assert run_tests.grouped_files(names)[-1][-1] == "test_zz_new_file.py"
    assert run_tests.parse_lanes(["-x", "--lanes", "1", "-q"]) == (1, ["-x", "-q"])
    with pytest.raises(SystemExit, match="--lanes"):
        run_tests.parse_lanes(["--lanes", "two"])
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_passes():\n    pass\n")
    (tmp_path / "tests" / "test_b.py").write_text("def test_fails():\n    assert False\n")
    code, output, _ = run_tests.run_group(["test_a.py", "test_b.py"], ["-q", "-p", "no:cacheprovider"], tmp_path)
    assert code == 1 and "1 failed, 1 passed" in output
