"""Suites declare themselves: a module in ``gpufleet/conformance/suites/`` that exports
``SUITE`` is discovered, selected, validated and listed with no central file touched; the
registry names no suite, and no module outside the declarations lists suites."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.conformance import registry
from gpufleet.conformance import suites as declarations
from gpufleet.conformance.registry import Settings, setting
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.provision.role import Var
from tests.conftest import ROOT

NEW_SUITE = '''
"""A suite added by dropping its declaration in."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance.registry import Settings, Suite, always, setting
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class CountersSettings(Settings):
    gpu_counters_max_retired: int = setting(0, "integer", "retired pages")


def _check(v: RoleVars) -> None:
    if v.integer("gpu_counters_max_retired") < 0:
        raise v.fail("gpu_counters_max_retired", "an integer of 0 or more",
                     v.get("gpu_counters_max_retired"))


SUITE = Suite("gpu_counters", ("acceptance",), "the GPUs' counters", order=135,
              settings=CountersSettings,
              cross_node=frozenset({"state_agrees"}), with_peer=frozenset({"state_agrees"}),
              required_when=always, check=_check)
'''


@pytest.fixture
def dropped_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A new declaration module on the declarations package's search path, and the
    registry's discovery run afresh over it (and again once the path is restored)."""
    (tmp_path / "gpu_counters.py").write_text(NEW_SUITE)
    monkeypatch.setattr(declarations, "__path__", [*declarations.__path__, str(tmp_path)])
    registry.all_suites.cache_clear()
    yield tmp_path
    sys.modules.pop(f"{registry.DECLARATIONS}.gpu_counters", None)
    registry.all_suites.cache_clear()


def test_a_dropped_in_declaration_is_selected_in_its_order(dropped_in: Path) -> None:
    assert [s.name for s in registry.select("acceptance")] == [
        "ddp", "thermal", "storage", "host_sizing", "bmc", "mounts", "network",
        "gpu_counters", "p2p"]
    assert [s.name for s in registry.select("gpu_counters,stack")] == ["gpu_counters", "stack"]
    assert "gpu_counters" in [s.name for s in registry.select("all")]
    new = registry.suite("gpu_counters")
    assert new in registry.bootstrap_suites()
    assert new in registry.peer_suites()
    assert not new.node_local("test_state_agrees")
    host = Host("gpu01", {}, frozenset({"all"}))
    assert "gpu_counters" in registry.required(host, None)
    assert registry.defaults()["gpu_counters_max_retired"] == 0


def test_a_dropped_in_declaration_is_listed(dropped_in: Path) -> None:
    assert "network, gpu_counters, p2p" in registry.sets_help()
    with pytest.raises(GpufleetError,
                       match=r"suites are .*, network, gpu_counters, p2p, .*image;"):
        registry.select("gpu_stat")


def test_a_dropped_in_declaration_is_validated_before_any_host(dropped_in: Path) -> None:
    """Through the command: its variables are checked by kind and by its own check, and
    the run stops with exit 2 before a host is contacted (the address is unroutable)."""
    inventory = dropped_in / "inventory"
    inventory.mkdir()
    (inventory / "hosts.yml").write_text(
        "all:\n  hosts:\n    gpu07: {ansible_host: 192.0.2.7, gpu_counters_max_retired: -1}\n"
        "    gpu08: {ansible_host: 192.0.2.8, gpu_counters_max_retired: many}\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert app.conformance_cmd(str(inventory), suites="gpu_counters") == 2
    message = err.getvalue()
    assert "host gpu07: variable gpu_counters_max_retired must be an integer of 0 or more, " \
           "got -1" in message
    assert "host gpu08: variable gpu_counters_max_retired must be" in message
    assert len(message.splitlines()) == 1


def test_a_declaration_must_be_named_after_its_suite(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gpu_counters_typo.py").write_text(NEW_SUITE)
    monkeypatch.setattr(declarations, "__path__", [*declarations.__path__, str(tmp_path)])
    try:
        with pytest.raises(AssertionError, match=r"gpu_counters_typo\.SUITE is not the Suite"):
            registry.discover()
    finally:
        sys.modules.pop(f"{registry.DECLARATIONS}.gpu_counters_typo", None)


def test_every_suite_file_has_its_declaration_and_back() -> None:
    files = sorted(p.stem.removeprefix("test_")
                   for p in registry.suites_dir().glob("test_*.py"))
    assert sorted(registry.all_suites()) == files


@dataclass(frozen=True, kw_only=True)
class Typed(Settings):
    count: int | None = setting(None, "integer", "how many")
    limit: float = setting(85, "number", "how much")
    wanted: bool = setting(True, "boolean", "whether")
    names: list[str] = setting(["a"], "list", "which")
    table: dict[str, Any] | None = setting(None, "mapping", "by key")


def test_settings_are_read_typed_over_their_defaults() -> None:
    host = Host("gpu01", {"count": "4", "wanted": "no", "names": "x, y"}, frozenset({"all"}))
    node = Node(host, ConnectOptions())
    read = node.typed(Typed)
    assert read == Typed(count=4, limit=85.0, wanted=False, names=["x", "y"], table=None)
    assert Typed.variables()["limit"] == Var(85, "number", "how much")
    assert Typed().names == ["a"] and Typed().names is not Typed().names


def test_settings_annotations_must_say_their_kind() -> None:
    @dataclass(frozen=True, kw_only=True)
    class Wrong(Settings):
        count: str | None = setting(None, "integer", "how many")
        limit: float | None = setting(85, "number", "how much")

    assert Wrong.mistyped() == ["count: str | None (integer, default None)",
                                "limit: float | None (number, default 85)"]
    assert Typed.mistyped() == []


def test_every_suite_settings_field_says_its_kind() -> None:
    for entry in registry.all_suites().values():
        assert entry.settings.mistyped() == [], entry.name


def _suite_names() -> set[str]:
    return set(registry.all_suites())


def test_the_registry_names_no_suite() -> None:
    source = (ROOT / "gpufleet" / "conformance" / "registry.py").read_text()
    assert set(re.findall(r"[A-Za-z0-9_]+", source)) & _suite_names() == set()


def _central_lists(path: Path) -> list[str]:
    """Sequence literals of three or more suite names, and strings naming three or more
    suites in a row: lists of suites kept by hand."""
    names = _suite_names()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            listed = [e.value for e in node.elts
                      if isinstance(e, ast.Constant) and e.value in names]
            if len(listed) >= 3:
                found.append(f"{path.name}:{node.lineno}: {listed}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for run in re.findall(r"\b\w+(?:, \w+){2,}", node.value):
                if sum(word in names for word in run.split(", ")) >= 3:
                    found.append(f"{path.name}:{node.lineno}: {run}")
    return found


def test_no_module_outside_the_declarations_lists_suites() -> None:
    package = ROOT / "gpufleet"
    paths = [p for p in package.rglob("*.py") if "__pycache__" not in p.parts
             and p.parent != Path(declarations.__path__[0])
             and not p.is_relative_to(package / "suites")]
    assert [line for p in paths for line in _central_lists(p)] == []
