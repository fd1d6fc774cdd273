"""Shared test configuration."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
LAB_TESTS = ROOT / "tests" / "lab"


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    """An executable shell script ``bin_dir/name`` that stands in for a system tool."""
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


# The fixtures of tests/lab/conftest.py that stand for the session's 16-node lab.
SESSION_LAB_FIXTURES = frozenset({"lab", "inventory_path", "inventory", "provisioned"})


def run_group(item: pytest.Item) -> str:
    """The worker group an item runs in under ``pytest -n``: every test of the session lab in
    one group (one worker brings that lab up), each other lab module in its own group (its
    module-scoped lab), and the unit tests in one group (one
    worker runs them in order, as one process did before)."""
    path = Path(str(item.fspath))
    if LAB_TESTS not in path.parents:
        return "unit"
    if SESSION_LAB_FIXTURES & set(getattr(item, "fixturenames", ())):
        return "lab-session"
    return f"lab-{path.stem.removeprefix('test_')}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each item with its worker group, and put the session lab's group first and the
    unit tests next: under ``-n 3 --dist loadgroup --no-loadscope-reorder`` one worker
    brings up the session lab at once, another runs the unit tests and the third the labs
    of their own; a worker takes another group only once its own is all but done."""
    groups = {item: run_group(item) for item in items}
    rank = {"lab-session": 0, "unit": 1}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[item]))
    items.sort(key=lambda item: rank.get(groups[item], 2))
