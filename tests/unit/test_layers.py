"""The rules import-linter cannot state (docs/architecture.md, "Layers"): only the
conformance runner calls ``pytest.main``; programs shipped to nodes import the standard
library (and torch, for the probes) and each other, nothing else; every resource is read
from the package, never by walking up from ``__file__``; and the import contracts hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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
