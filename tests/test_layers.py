"""The package's layers import one way: the model (planner/model) <- the search (formulations)
<- the application (planner/app). Every import counts, those inside functions included, so a
layer can never reach up into a layer built on it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: folder -> its rank; a module may import only from folders of the same or a lower rank
LAYERS = {"planner/model": 0, "formulations": 1, "planner/app": 2}


def _folder_of_module(name: str) -> str | None:
    """The layer folder a dotted module name lives in (None: not one of ours)."""
    parts = name.split(".")
    if parts[0] == "formulations":
        return "formulations"
    if parts[0] == "planner" and len(parts) > 1 and parts[1] in ("model", "app"):
        return f"planner/{parts[1]}"
    if parts[0] == "planner":
        return "planner"
    return None


def _module_of(path: Path) -> str:
    """The dotted module name of a file under the root (a package's ``__init__`` is the
    package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str | None = None) -> list[tuple[int, str]]:
    """Every imported module of a file, with its line, wherever the import statement stands;
    a relative import (``from ..app import cli``) resolved against ``module``, the file's
    dotted name (default: from its path under the root)."""
    if module is None:
        module = _module_of(path) if path.is_relative_to(ROOT) else path.stem
    parts = module.removesuffix(".__init__").split(".")
    package = parts if path.name == "__init__.py" else parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:         # (from . import x: the package; each further dot one up)
                if node.level - 1 >= len(package):
                    raise AssertionError(f"{path}:{node.lineno}: a relative import above the root")
                base = package[:len(package) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module
            if name:
                out.append((node.lineno, name))
            out += [(node.lineno, f"{name}.{a.name}" if name else a.name) for a in node.names]
    return out


def _edges(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> the places, over every module under planner/
    and formulations/, subpackages included."""
    edges: dict[tuple[str, str], list[str]] = {}
    for top in ("planner", "formulations"):
        for path in sorted((root / top).rglob("*.py")):
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            folder = _folder_of_module(module.removesuffix(".__init__"))
            for line, name in _imports(path, module):
                target = _folder_of_module(name)
                if target and target != folder:
                    edges.setdefault((folder, target), []).append(
                        f"{path.relative_to(root)}:{line} imports {name}")
    return edges


def _upward(edges) -> list[str]:
    return [where for (src, dst), places in edges.items()
            if src in LAYERS and dst in LAYERS and LAYERS[dst] > LAYERS[src] for where in places]


def test_layers_import_one_way():
    wrong = _upward(_edges())
    assert not wrong, "\n".join(wrong)


def test_no_import_circle_between_folders():
    edges = _edges()
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)

    def reaches(a: str, b: str, seen: frozenset = frozenset()) -> bool:
        return any(n == b or (n not in seen and reaches(n, b, seen | {n}))
                   for n in graph.get(a, ()))

    circles = [(a, b) for a, b in edges if reaches(b, a)]
    assert not circles, circles


def test_the_planner_package_itself_holds_no_code():
    """``planner/`` is only the parent of the model and the application (and their data), so
    "planner imports formulations imports planner" cannot happen through it."""
    init = ROOT / "planner" / "__init__.py"
    assert not init.read_text().strip()
    assert sorted(p.name for p in (ROOT / "planner").glob("*.py")) == ["__init__.py"]


def test_the_check_sees_function_level_imports(tmp_path):
    """The walker finds an import inside a function body (so the layer test could fail)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from planner.app import cli\n    return cli\n")
    assert (2, "planner.app") in _imports(f)


def test_the_check_resolves_relative_imports_and_walks_subpackages(tmp_path):
    """A relative import (``from ..app import cli`` in planner/model) and a module of a
    subpackage (planner/model/sub/) were never checked (an audit); both are now upward
    imports the layer test reports."""
    model = tmp_path / "planner" / "model"
    (model / "sub").mkdir(parents=True)
    (tmp_path / "formulations").mkdir()
    (tmp_path / "planner" / "__init__.py").write_text("")
    (model / "__init__.py").write_text("")
    (model / "m.py").write_text("def f():\n    from ..app import cli\n    return cli\n")
    (model / "sub" / "__init__.py").write_text("from ...app.report import x\n")
    (model / "sub" / "deep.py").write_text("from formulations import solve\nfrom . import m\n")
    assert (2, "planner.app") in _imports(model / "m.py", "planner.model.m")
    assert (1, "planner.app.report.x") in _imports(model / "sub" / "__init__.py",
                                                   "planner.model.sub.__init__")
    assert (2, "planner.model.sub.m") in _imports(model / "sub" / "deep.py",
                                                  "planner.model.sub.deep")
    wrong = _upward(_edges(tmp_path))
    assert sorted(w.split(" imports ")[0] for w in wrong) == [
        "planner/model/m.py:2", "planner/model/m.py:2", "planner/model/sub/__init__.py:1",
        "planner/model/sub/__init__.py:1", "planner/model/sub/deep.py:1",
        "planner/model/sub/deep.py:1"]
