"""Every probe runs on a node from the files shipped there: itself and probe_common.py."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.conformance.launch import PROBES, SHARED
from gpufleet.suites.probes.probe_common import EXIT_USAGE

# Beyond the standard library: what each probe may import on a node.
NEEDS = {
    "allreduce": {"torch", "probe_common"},
    "ddp": {"torch", "probe_common"},
    "p2p": {"torch", "probe_common"},
    "thermal": {"torch", "probe_common"},
    "storage": {"probe_common"},
    "probe_common": {"torch"},
    "reachability": set(),
    "image_stack": {"torch"},  # inside the image, when it has torch
    "job_view": set(),
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), feature_version=(3, 9))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            assert node.module is None and [a.name for a in node.names] == ["probe_common"]
            roots.add("probe_common")
        elif isinstance(node, ast.ImportFrom):
            assert node.module is not None
            roots.add(node.module.split(".")[0])
    return roots - set(sys.stdlib_module_names) - {"__future__"}


def test_every_probe_is_listed() -> None:
    assert {p.stem for p in PROBES.glob("*.py")} - {"__init__"} == set(NEEDS)
    assert (PROBES / SHARED).is_file()


@pytest.mark.parametrize("name", sorted(NEEDS))
def test_probe_needs_only_stdlib_torch_and_probe_common_on_python_3_9(name: str) -> None:
    assert _imports(PROBES / f"{name}.py") == NEEDS[name]


@pytest.mark.parametrize("name", sorted(n for n in NEEDS if "torch" in NEEDS[n]))
def test_importing_a_probe_leaves_torch_unloaded(name: str) -> None:
    code = f"import sys, gpufleet.suites.probes.{name}; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                          text=True, timeout=30, cwd=PROBES.parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


@pytest.mark.parametrize("name", sorted(n for n in NEEDS if "probe_common" in NEEDS[n]))
def test_a_probe_runs_from_the_two_shipped_files_alone(name: str, tmp_path: Path) -> None:
    for file in (f"{name}.py", SHARED):
        shutil.copy(PROBES / file, tmp_path / file)
    done = subprocess.run([sys.executable, str(tmp_path / f"{name}.py"), "--no-such-option"],
                          check=False, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == EXIT_USAGE, done.stderr
    (tmp_path / SHARED).unlink()
    done = subprocess.run([sys.executable, str(tmp_path / f"{name}.py"), "--help"],
                          check=False, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert "No module named 'probe_common'" in done.stderr


@pytest.mark.parametrize(("name", "argv", "says"), [
    ("allreduce", ["--sizes", "1X"], "bad message size '1X'"),
    ("ddp", ["--steps", "0"], "error:"),
    ("ddp", ["--warmup-steps", "0"], "error:"),
    ("ddp", ["--lr", "0"], "error:"),
    ("ddp", ["--optimizer", "lbfgs"], "error:"),
    ("p2p", ["--size-mb", "0"], "error:"),
    ("p2p", ["--iters", "-1"], "error:"),
    ("p2p", ["--iters", "x"], "error:"),
    ("storage", [], "error:"),
    ("storage", ["--path", "/tmp", "--readers", "0"], "error:"),
    ("storage", ["--path", "/tmp", "--file-gb", "-1"], "error:"),
    ("thermal", ["--seconds", "0"], "must be above 0"),
])
def test_bad_usage_exits_64(name: str, argv: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, str(PROBES / f"{name}.py"), *argv], check=False,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == EXIT_USAGE
    assert says in done.stderr
    assert done.stdout == ""

