"""The lab cluster for tests: real nodes (network namespaces, overlays, sshd) on this machine.

One session-wide lab of 16 nodes, separate from the user's lab (its own name,
bridge, subnet and state directory). ``provisioned`` brings node01-node04 to the
inventory's pinned stack once per session; tests that change a node restore it. Modules
whose tests would hold the session lab too long bring up a lab of their own
(``lab_up``), which CI runs beside it. Every JSON document a lab test has gpufleet
write on the controller is checked against its shipped schema.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.ssh import SSHConnection
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host, Inventory
from gpufleet.lab.cluster import Lab
from gpufleet.lab.model import LabConfig
from gpufleet.report import jsonfile
from gpufleet.report.schemas import SchemaError, validate
from tests.conftest import ROOT

LAB_NODES = 16
PROVISIONED = "node01:node02:node03:node04"
# Several checkouts may run their lab tests at once on one machine: each picks its own
# second octet (GPUFLEET_TEST_NET, default 78), from which every test lab takes its subnet,
# name and state directory. Each test lab has its own offset, so its own /16: t 0, dn 1, 32 2,
# sl 3, bs 4, hs 5, the firewall-against-the-kernel namespaces (test_firewall_kernel) 6, and
# the network placement lab (test_network_placement) 7, the shared mounts lab
# (test_shared_mounts) 8, the image conformance lab (test_image_conformance) 9, the
# baseline lab (test_baseline) 10, the combined Slurm step lab (test_slurm_fanout) 11, the
# Slurm jobs lab (test_slurm_jobs) 12, the line-rate lab (test_line_rate) 13, the watch lab
# (test_watch) 14, the kernel and clock lab (test_kernel_time) 15, the bootstrap lab
# (test_bootstrap) 16, the host tuning lab (test_host_tuning) 18, the firmware lab
# (test_firmware) 19, the PCIe lab (test_pcie) 20, the fabric ports lab (test_fabric_ports) 21.
# Under `pytest -n` the labs run side by side (tests/conftest.py).
TEST_NET = int(os.environ.get("GPUFLEET_TEST_NET", "78"))
SUBNET = f"10.{TEST_NET}.0"


def lab_config_for(role: str, offset: int, inventory_dir: Path) -> LabConfig:
    """A test lab's config: ``role`` names it (``t`` is the session lab), ``offset`` moves its
    subnet away from the session lab's."""
    suffix = "" if TEST_NET == 78 else str(TEST_NET)
    name = f"gf{role}{suffix}"
    root = Path(f"/srv/gpufleet-lab-{name}")
    return LabConfig(name=name, root=root, subnet=f"10.{TEST_NET + offset}.0",
                     inventory_dir=inventory_dir)


@pytest.fixture(autouse=True)
def documents_validate(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Each JSON document gpufleet writes during the test (reports, the drift history) is
    validated against its schema as it is written; the test fails on any that is not."""
    problems: list[str] = []
    put = jsonfile.local_put

    def validated_put(path: str, content: bytes, mode: int = 0o644) -> None:
        try:
            validate(json.loads(content))
        except SchemaError as exc:
            problems.append(f"{path}: {exc}")
        put(path, content, mode)

    monkeypatch.setattr(jsonfile, "local_put", validated_put)
    yield problems
    assert not problems, "documents that do not match their schema:\n" + "\n".join(problems)


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")


@contextmanager
def lab_up(tmp_path_factory: pytest.TempPathFactory, role: str, offset: int, nodes: int,
           provision: str | None = None) -> Iterator[Lab]:
    """A lab of ``nodes`` nodes on the lab inventory's group_vars (``role`` and ``offset`` as
    in ``lab_config_for``), the nodes ``provision`` names provisioned with reboot as the
    session lab's ``provisioned`` are; torn down on exit."""
    _require_root()
    inventory_dir = tmp_path_factory.mktemp(f"{role}-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    the_lab = Lab(lab_config_for(role, offset, inventory_dir))
    the_lab.down()
    the_lab.up(nodes)
    try:
        if provision:
            code = app.provision_cmd(str(inventory_dir), limit=provision, reboot=True)
            assert code == 0, f"provisioning {provision} of the lab {the_lab.config.name} failed"
        yield the_lab
    finally:
        the_lab.down()


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """A 16-node lab, torn down at the end of the session."""
    with lab_up(tmp_path_factory, "t", 0, LAB_NODES) as the_lab:
        yield the_lab


@pytest.fixture(scope="session")
def inventory_path(lab: Lab) -> Path:
    return lab.config.inventory_dir


@pytest.fixture
def inventory(inventory_path: Path) -> Inventory:
    return load_inventory(inventory_path)


@pytest.fixture(scope="session")
def provisioned(lab: Lab, inventory_path: Path) -> Path:
    """node01-node04 provisioned (with reboot) to the lab's pinned stack."""
    code = app.provision_cmd(str(inventory_path), limit=PROVISIONED, reboot=True)
    assert code == 0, "provisioning the test lab failed"
    return inventory_path


def node_sh(lab: Lab, node: str, command: str, check: bool = True) -> str:
    """Run a command inside a node through its namespaces (not through SSH)."""
    proc = subprocess.run(lab.exec_argv(node, command), capture_output=True, text=True,
                          timeout=120, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{node}: {command!r} failed ({proc.returncode}): {proc.stderr}")
    return proc.stdout


def node_processes(lab: Lab, node: str) -> list[str]:
    """The command lines of the processes in ``node``'s network namespace (lab nodes share
    the controller's PID namespace, so pgrep inside a node would see every process)."""
    pids = subprocess.run(["ip", "netns", "pids", lab.node(node).netns], capture_output=True,
                          text=True, check=True).stdout.split()
    lines = []
    for pid in pids:
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip())
        except OSError:
            continue
    return lines


def foreign_table(lab: Lab, node: str, rule: str) -> None:
    """Add a table no gpufleet role wrote (inet site), its input chain ahead of gpufleet's."""
    node_sh(lab, node, "nft add table inet site && nft 'add chain inet site in { type filter "
            f"hook input priority -10; policy accept; }}' && nft add rule inet site in {rule}")


def ssh(host: Host, base: Path, **options: object) -> SSHConnection:
    """An SSH connection to a lab host, verifying host keys against the lab's known_hosts."""
    return SSHConnection(host, ConnectOptions(known_hosts_base=base, **options))  # type: ignore[arg-type]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.lab)
