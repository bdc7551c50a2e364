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


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every imported module of a file, with its line, wherever the import statement stands."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = {}
    for folder in ("planner", *LAYERS):
        for path in sorted((ROOT / folder).glob("*.py")):
            for line, name in _imports(path):
                target = _folder_of_module(name)
                if target and target != folder:
                    edges.setdefault((folder, target), []).append(
                        f"{path.relative_to(ROOT)}:{line} imports {name}")
    return edges


def test_layers_import_one_way():
    wrong = [where for (src, dst), places in _edges().items()
             if src in LAYERS and dst in LAYERS and LAYERS[dst] > LAYERS[src] for where in places]
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
