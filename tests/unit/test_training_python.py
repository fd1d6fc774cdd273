"""The interpreter drift, facts and the probes look at is the one the pytorch role manages."""

from __future__ import annotations

from pathlib import Path

from gpufleet.drift import training_python
from gpufleet.inventory import load_inventory


def test_training_python_follows_the_pytorch_role(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n"
        "    pinned: {pytorch_version: '2.13.0'}\n"
        "    placed: {pytorch_version: '2.13.0', pytorch_venv: /srv/torch/}\n"
        "    venv_only: {pytorch_venv: /srv/other}\n"
        "    bare: {}\n")
    hosts = load_inventory(tmp_path / "hosts.yml").hosts
    assert training_python(hosts["pinned"]) == "/opt/gpufleet/venv/bin/python"
    assert training_python(hosts["placed"]) == "/srv/torch/bin/python"
    assert training_python(hosts["venv_only"]) == "/srv/other/bin/python"
    assert training_python(hosts["bare"]) == "python3"
