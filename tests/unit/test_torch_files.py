"""torch facts read from a virtual environment's files, without starting Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.facts import script
from gpufleet.facts.catalog import torch_fact
from gpufleet.facts.formats import torch_files
from gpufleet.facts.gather import parse_sections

LAB_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '2.13.0+cpu'
debug = False
cuda: Optional[str] = None
git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'
"""


def test_venv_files_with_an_nccl_wheel() -> None:
    text = ("@venv 3.12.3\n@nccl /opt/torch/.venv/lib/python3.12/site-packages/"
            "nvidia_nccl_cu13-2.28.9.dist-info\n"
            + LAB_VERSION_PY.replace("'2.13.0+cpu'", "'2.11.0+cu130'")
            .replace("cuda: Optional[str] = None", "cuda: Optional[str] = '13.0'"))
    assert torch_files(text) == {"python": "3.12.3", "torch": "2.11.0+cu130", "cuda": "13.0",
                                 "nccl": "2.28.9"}


def test_cpu_build_without_nccl() -> None:
    assert torch_files("@venv 3.11.2\n@nccl \n" + LAB_VERSION_PY) == {
        "python": "3.11.2", "torch": "2.13.0+cpu", "cuda": None, "nccl": None}


def test_the_fact_reads_a_real_venv_like_the_probe_would(tmp_path: Path) -> None:
    """The shell path and the Python probe agree on this project's own venv."""
    python = str(Path(sys.executable).parent / "python")
    fact = torch_fact(python)
    nonce = script.new_nonce()
    output = subprocess.run(["sh", "-c", script.compose([(fact.name, fact.shell)], nonce)],
                            capture_output=True, text=True, check=True).stdout
    assert "@venv" in script.split(output, nonce)[fact.name].text
    facts = parse_sections("local", output, [fact], nonce)
    value = facts.values[fact.name]
    import torch

    assert value["torch"] == torch.__version__
    assert value["cuda"] == torch.version.cuda
    assert value["python"] == ".".join(map(str, sys.version_info[:3]))


PUBLISHED = Path(__file__).resolve().parents[1] / "fixtures" / "published"


@pytest.mark.parametrize(("name", "torch", "cuda"), [
    ("torch-version-py-1.3.1.txt", "1.3.1", "10.1"),
    ("torch-version-py-1.5.0-cpu.txt", "1.5.0+cpu", None),
    ("torch-version-py-2.7.1-cuda12.9.txt", "2.7.1-700", "12.9"),
    ("torch-version-py-2.10.0a0-cuda13.0.txt", "2.10.0a0+gite67e3d9", "13.0"),
])
def test_published_torch_version_files(name: str, torch: str, cuda: str | None) -> None:
    """torch/version.py as wheels and source builds ship it: 1.x's bare ``cuda = '10.1'``
    and ``cuda = None``, 2.x's ``cuda: Optional[str] = '12.9'`` (published/README.md)."""
    text = "@venv 3.10.12\n@nccl \n" + (PUBLISHED / name).read_text()
    assert torch_files(text) == {"python": "3.10.12", "torch": torch, "cuda": cuda,
                                 "nccl": None}
