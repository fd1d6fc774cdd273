"""Drift, facts and the probes look where the roles put things: the pytorch venv, nccl.conf."""

from __future__ import annotations

from pathlib import Path

from gpufleet.inventory.load import load_inventory
from gpufleet.roles import consistency_request, training_python


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


def test_consistency_reads_nccl_conf_where_the_role_writes_it(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    moved: {nccl_conf_path: /etc/nccl/nccl.conf}\n    default: {}\n")
    hosts = load_inventory(tmp_path / "hosts.yml").hosts
    assert consistency_request(hosts["moved"]).files == frozenset({"/etc/nccl/nccl.conf"})
    assert consistency_request(hosts["default"]).files == frozenset({"/etc/nccl.conf"})
