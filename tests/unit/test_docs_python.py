"""The Python examples of the user docs name modules and names that exist."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from tests.conftest import ROOT

BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", re.MULTILINE | re.DOTALL)
EXAMPLES = [(path.relative_to(ROOT).as_posix(), n, match["code"])
            for path in sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
            for n, match in enumerate(BLOCK.finditer(path.read_text()), start=1)]


def test_the_docs_have_python_examples() -> None:
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize(("doc", "number", "code"), EXAMPLES,
                         ids=[f"{d}#{n}" for d, n, _ in EXAMPLES])
def test_an_example_imports_what_exists(doc: str, number: int, code: str) -> None:
    tree = ast.parse(code, filename=f"{doc} example {number}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    importlib.import_module(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
