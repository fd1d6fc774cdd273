"""The rules import-linter cannot state (docs/architecture.md, "Layers"): only the
conformance runner calls ``pytest.main``; programs shipped to nodes import the standard
library (and torch, for the probes) and each other, nothing else; every resource is read
from the package, never by walking up from ``__file__``; no import, type-only ones
included, runs up the layers or closes a cycle; the import contracts hold; and
docs/architecture.md names every module there is and none that is gone."""

from __future__ import annotations

import ast
import fnmatch
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from tests.conftest import ROOT

PACKAGE = ROOT / "gpufleet"
NODE_PROGRAMS = sorted([*(PACKAGE / "node").glob("*.py"),
                        *(PACKAGE / "suites" / "probes").glob("*.py")])
STDLIB = set(sys.stdlib_module_names)


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_only_the_runner_calls_pytest_main() -> None:
    callers = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "main" and isinstance(node.func.value, ast.Name) \
                    and node.func.value.id == "pytest":
                callers.append(path.relative_to(PACKAGE).as_posix())
    assert callers == ["conformance/runner.py"]


@pytest.mark.parametrize("path", NODE_PROGRAMS, ids=lambda p: p.name)
def test_node_programs_need_only_the_standard_library(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a sibling shipped beside it
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top in STDLIB or top in ("torch", "probe_common"), f"{path.name}: {name}"


def test_no_resource_is_found_by_walking_up_from_a_module() -> None:
    found = [p.relative_to(PACKAGE).as_posix() for p in modules()
             if "Path(__file__)" in p.read_text() or ".parents[" in p.read_text()]
    assert found == []


# Imports that run up the layers and are known, each (importer, imported) with why; the
# layers contract in pyproject.toml ignores the same edges.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def package_modules() -> dict[str, Path]:
    """Every module of the package by dotted name, the linked roles and suites included
    (``rglob`` does not follow their links)."""
    found: dict[str, Path] = {}
    for folder, dirs, files in os.walk(PACKAGE, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = list(path.relative_to(ROOT).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """The package modules ``name`` imports and where: every import statement, those under
    ``if TYPE_CHECKING:`` and inside functions included."""

    def nearest(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [nearest(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *filter(None, [base])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else nearest(base)
                       for a in node.names]
        else:
            continue
        for target in targets:
            if target and target != name:
                yield target, node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    """Each module's imports of other package modules, with the line of the first."""
    known = package_modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges: dict[str, int] = {}
        for target, line in _imports(name, path, known):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layers() -> list[list[str]]:
    """The layers contract of pyproject.toml, top first, each layer's independent siblings."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers"]
    return [[s.strip() for s in layer.split("|")] for layer in contract["layers"]]


def placed(module: str, order: list[list[str]]) -> tuple[int, str] | None:
    """The layer (its index, top 0) and sibling a module belongs to; None outside them."""
    for depth, siblings in enumerate(order):
        for sibling in siblings:
            if module == sibling or module.startswith(sibling + "."):
                return depth, sibling
    return None


def upward(graph: dict[str, dict[str, int]], order: list[list[str]]
           ) -> dict[tuple[str, str], int]:
    """Every import of a higher layer, or of an independent sibling in the same layer."""
    found: dict[tuple[str, str], int] = {}
    for importer, edges in graph.items():
        here = placed(importer, order)
        for imported, line in edges.items():
            there = placed(imported, order)
            if here and there and (there[0] < here[0] or
                                   (there[0] == here[0] and there[1] != here[1])):
                found[(importer, imported)] = line
    return found


def test_every_module_has_a_layer() -> None:
    """A new package gets its place in the layers contract; only the package's own
    ``__init__`` (the version) and the node-side programs (a contract of their own) have
    none."""
    order = layers()
    unplaced = [m for m in package_modules() if placed(m, order) is None
                and m != "gpufleet" and not m.startswith("gpufleet.node")]
    assert unplaced == []


def test_no_import_runs_up_the_layers() -> None:
    """Type-only and function-level imports count as much as the others: each one makes the
    importer depend on the imported module."""
    graph = import_graph()
    found = upward(graph, layers())
    known = package_modules()
    shown = [f"{known[a].relative_to(ROOT)}:{line}: {a} -> {b}"
             for (a, b), line in sorted(found.items()) if (a, b) not in ALLOWED_UPWARD]
    assert shown == []
    gone = sorted(ALLOWED_UPWARD - set(found))
    assert gone == [], "no longer imported: remove from ALLOWED_UPWARD and pyproject.toml"


def test_no_import_cycle() -> None:
    """No two modules import each other, even through others or only for annotations: a
    type-only import still says each side needs the other."""
    graph = import_graph()
    known = package_modules()
    shown = [[f"{known[a].relative_to(ROOT)}:{graph[a][b]}: {a} -> {b}"
              for a in component for b in component if b in graph[a]]
             for component in cycles(graph)]
    assert shown == []


@pytest.mark.parametrize(("source", "expected"), [
    ("from gpufleet.lab.cluster import Lab\n", ["gpufleet.lab.cluster"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from gpufleet.slurm import launcher\n", ["gpufleet.slurm.launcher"]),
    ("def f() -> None:\n    import gpufleet.errors.missing\n", ["gpufleet.errors"]),
    ("from . import model\nfrom .model import Node\n", ["gpufleet.lab.model"]),
    ("from .. import errors\n", ["gpufleet.errors"]),
])
def test_the_import_graph_reads_every_kind_of_import(tmp_path: Path, source: str,
                                                     expected: list[str]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    known = package_modules()
    assert sorted({t for t, _ in _imports("gpufleet.lab.mod", path, known)}) == expected


def test_cycles_and_upward_imports_are_found() -> None:
    """The checks above catch what they look for: a cycle through a type-only import (as
    lab/cluster and lab/slurm had) and an import of a higher layer."""
    graph = {"gpufleet.lab.cluster": {"gpufleet.lab.slurm": 1},
             "gpufleet.lab.slurm": {"gpufleet.lab.cluster": 30, "gpufleet.errors": 2},
             "gpufleet.errors": {}}
    assert cycles(graph) == [["gpufleet.lab.cluster", "gpufleet.lab.slurm"]]
    order = layers()
    assert upward({"gpufleet.facts.gather": {"gpufleet.provision.plan": 3},
                   "gpufleet.slurm.client": {"gpufleet.bmc.target": 4, "gpufleet.errors": 5}},
                  order) == {("gpufleet.facts.gather", "gpufleet.provision.plan"): 3,
                             ("gpufleet.slurm.client", "gpufleet.bmc.target"): 4}


def test_the_import_contracts_hold() -> None:
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports"))], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _layout_tree() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    return block.splitlines()


def test_the_layout_in_architecture_md_matches_the_tree() -> None:
    """Every directory git tracks, down to gpufleet/*/*/, is in docs/architecture.md's
    tree, and the tree names none that is not there."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    wanted: set[str] = set()
    for path in tracked:
        parts = path.split("/")
        if len(parts) > 1:
            wanted.add(parts[0] + "/")
        if parts[0] == "gpufleet" and len(parts) > 2:
            wanted.add("/".join(parts[:2]) + "/")
        if parts[0] == "gpufleet" and len(parts) > 3:
            wanted.add("/".join(parts[:3]) + "/")
        if parts[0] == "gpufleet" and len(parts) == 2 and (ROOT / path).is_symlink():
            wanted.add(path + "/")
    shown: set[str] = set()
    parents: list[str] = []
    for line in _layout_tree():
        if not line.strip() or (line[0] == " " and not line.lstrip()[0].isalnum() and \
                line.lstrip()[0] not in "._"):
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        name = line.split()[0]
        if depth > len(parents) or (depth and not parents):
            continue  # a continuation line of a description
        parents = parents[:depth]
        if "/" in name.rstrip("/") and not name.endswith("/"):
            name = name.split("/")[0] + "/"  # .ci/run
        if line.split()[1:2] == ["->"]:
            name += "/"
        if name.endswith("/"):
            full = "".join(parents) + name
            shown.add(full)
            parents.append(name)
    assert shown == wanted


def test_commands_other_than_conformance_start_without_pytest() -> None:
    """Importing the command line (what drift, provision and facts load) brings in neither
    pytest nor testinfra: they load when suites run."""
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, gpufleet.cli; "
         "print(sorted(m for m in ('pytest', 'testinfra', '_pytest') if m in sys.modules))"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def module_map() -> list[str]:
    """The paths docs/architecture.md's module map names, in order (a path ending in ``/``
    stands for the folder, one with ``*`` for the files it matches)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE)


def covers(entry: str, path: str) -> bool:
    return path.startswith(entry) if entry.endswith("/") else fnmatch.fnmatch(path, entry)


def mapped_modules(tracked: list[str]) -> list[str]:
    """The modules the map must name: every tracked Python file of the package and of the
    folders it links (roles/, conformance/), packages' ``__init__`` aside."""
    return [p for p in tracked if p.endswith(".py") and not p.endswith("__init__.py")
            and p.split("/")[0] in ("gpufleet", "roles", "conformance")]


def test_the_module_map_in_architecture_md_names_every_module_and_none_that_is_gone() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    entries = module_map()
    assert [e for e in set(entries) if entries.count(e) > 1] == []
    unnamed = [p for p in mapped_modules(tracked) if not any(covers(e, p) for e in entries)]
    assert unnamed == []
    stale = [e for e in entries if not any(covers(e, p) for p in tracked)]
    assert stale == []


def test_the_module_map_check_finds_an_unnamed_module_and_a_stale_entry() -> None:
    tracked = ["gpufleet/a/new.py", "gpufleet/a/__init__.py", "roles/x.py", "docs/x.md"]
    assert mapped_modules(tracked) == ["gpufleet/a/new.py", "roles/x.py"]
    assert covers("roles/*.py", "roles/x.py") and covers("gpufleet/a/", "gpufleet/a/new.py")
    assert not covers("gpufleet/a/old.py", "gpufleet/a/new.py")
