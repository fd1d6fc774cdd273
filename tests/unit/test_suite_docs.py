"""docs/conformance.md agrees with the suites the registry discovers: a section for every
suite and none for a suite that is gone, every check named, and ``--suite``'s sets as the
declarations make them."""

from __future__ import annotations

import ast
import re

from gpufleet.conformance import registry
from tests.conftest import ROOT

DOC = ROOT / "docs" / "conformance.md"


def checks_of(suite: registry.Suite) -> list[str]:
    """The check functions of a suite's file, as pytest collects them (``test_*``)."""
    tree = ast.parse(suite.path().read_text())
    return [node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


def documented_suites(text: str) -> list[str]:
    """The suites the doc gives a section of their own: a ``### name`` heading between
    "Suites and checks" and the training images' section, and that one (``image``)."""
    part = text.split("## Suites and checks", 1)[1].split("## Training images", 1)[0]
    found = re.findall(r"^### (\w+)$", part, flags=re.MULTILINE)
    return found + (["image"] if "## Training images: `--image` and the `image` suite" in text
                    else [])


def test_every_suite_has_its_section_and_no_section_is_stale() -> None:
    assert sorted(documented_suites(DOC.read_text())) == sorted(registry.all_suites())


def test_every_check_is_named_in_the_doc() -> None:
    text = DOC.read_text()
    missing = [f"{s.name}/{c}" for s in registry.all_suites().values() for c in checks_of(s)
               if f"`{c}" not in text]
    assert missing == []


def test_the_sets_in_the_flag_table_are_the_registry_s() -> None:
    row = next(line for line in DOC.read_text().splitlines() if line.startswith("| `--suite` |"))
    for name in registry.SETS:
        listed = re.search(rf"`{name}` = `([\w,]+)`", row)
        assert listed is not None, name
        assert listed.group(1).split(",") == registry.members_of(name)


def test_a_suite_without_a_section_would_be_found() -> None:
    text = "## Suites and checks\n\n### stack\n\n### gone\n\n## Training images\n"
    assert documented_suites(text) == ["stack", "gone"]
