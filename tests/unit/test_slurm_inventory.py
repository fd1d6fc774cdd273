"""slurm:PARTITION[:VARS] inventories, from scontrol output captured on the lab's Slurm."""

from __future__ import annotations

import os
import stat
import textwrap
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.errors import InventoryError
from gpufleet.slurm import inventory as slurm_inventory
from tests.conftest import FIXTURES

SLURM = FIXTURES / "slurm"


@pytest.fixture
def scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scontrol that answers show partition/node with the captured output."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in
          *"show partition"*) cat {SLURM / "scontrol_show_partition.txt"};;
          *"show node"*) cat {SLURM / "scontrol_show_node.txt"};;
          *) exit 1;;
        esac
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def _vars_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "prod"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(textwrap.dedent("""\
        all:
          vars:
            ansible_user: root
          children:
            lab: {}
            h200: {}
            special:
              hosts:
                node03:
                  ansible_host: 192.0.2.13
                  gpu_count: 4
        """))
    (inv / "group_vars" / "all.yml").write_text("gpu_count: 8\nnccl_version: '2.21.5'\n")
    (inv / "group_vars" / "h200.yml").write_text("gpu_count: 2\n")
    (inv / "group_vars" / "lab.yml").write_text("nccl_version: '2.23.4'\n")
    (inv / "group_vars" / "ib.yml").write_text("rdma_expected: true\n")
    return inv


@pytest.mark.parametrize(("source", "parsed"), [
    ("slurm:gpu", ("gpu", None)),
    ("slurm:gpu:prod", ("gpu", "prod")),
    ("slurm:gpu:inventory/prod", ("gpu", "inventory/prod")),
])
def test_source_syntax(source: str, parsed: tuple[str, str | None]) -> None:
    assert slurm_inventory.is_slurm_source(source)
    assert slurm_inventory.parse_source(source) == parsed


def test_a_source_without_partition_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"give a Slurm partition, as in slurm:gpu"):
        slurm_inventory.parse_source("slurm:")


@pytest.mark.usefixtures("scontrol")
def test_hosts_addresses_and_groups_come_from_slurm() -> None:
    target = app.load_target("slurm:lab", None)
    assert [h.name for h in target.hosts] == ["node01", "node03", "node04", "node05"]
    node04 = target.inventory.hosts["node04"]
    assert node04.address == "10.119.0.14"
    assert node04.groups == {"all", "lab", "h200", "ib"}
    assert target.inventory.groups["h200"] == {"node04"}
    assert [h.name for h in target.inventory.select("lab:&ib")] == ["node04"]


@pytest.mark.usefixtures("scontrol")
def test_variables_come_from_the_vars_inventory(tmp_path: Path) -> None:
    inv = _vars_inventory(tmp_path)
    target = app.load_target(f"slurm:lab:{inv}", None)
    hosts = target.inventory.hosts
    assert hosts["node01"].vars["ansible_user"] == "root"
    assert hosts["node01"].vars["nccl_version"] == "2.23.4"
    assert hosts["node01"].vars["gpu_count"] == 8
    assert hosts["node04"].vars["gpu_count"] == 2
    assert "rdma_expected" not in hosts["node04"].vars  # group ib is not in the inventory
    assert hosts["node03"].address == "192.0.2.13" and hosts["node03"].vars["gpu_count"] == 4
    assert "special" in hosts["node03"].groups
    assert target.inventory.path == inv and target.inventory.base == inv
    assert target.inventory.digest() == app.load_source(str(inv)).digest()


@pytest.mark.usefixtures("scontrol")
def test_an_unknown_partition_names_the_known_ones() -> None:
    with pytest.raises(InventoryError, match=r"^inventory 'slurm:gpu': Slurm has no partition "
                                             r"'gpu' \(partitions: lab\)$"):
        app.load_target("slurm:gpu", None)


def test_without_slurm_the_error_is_one_clear_line(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert app.facts("slurm:lab") == 2


def test_an_unknown_scheduler_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu1: {ansible_host: 127.0.0.1, gpufleet_scheduler: pbs}\n")
    assert app.conformance_cmd(str(inv), suites="firewall", drain_failed=True) == 2
    assert capsys.readouterr().err == (
        "error: host gpu1: variable gpufleet_scheduler must be slurm or none, got 'pbs'\n")
