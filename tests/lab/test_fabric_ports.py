"""Fabric ports as declared, on a lab of their own: each fault injected on one node fails
that node alone, naming it, the port, what was seen, what was expected and the variable.

Four nodes, none provisioned, each with a stand-in RDMA sysfs tree (the kernel's layout and
file formats, as tests/lab/fakesys.py lays out the watch's) under ``rdma_sys_root``: four
ConnectX-7 ports, ACTIVE, LinkUp, ``400 Gb/sec (4X NDR)`` InfiniBand, holding the default
partition key. The lab group declares exactly that; node02 gets a port trained down to
200 Gb/s, node03 loses a device, node04 a different partition key, node01 stays healthy.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.lab import fakesys
from tests.lab.conftest import lab_up, node_sh

NODES = ("node01", "node02", "node03", "node04")
ROOT = "/var/lib/gpufleet-lab-fabric"
DEVICES = ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
DECLARED = {"rdma_sys_root": ROOT, "rdma_port_count": 4, "rdma_port_rate_gbps": 400,
            "rdma_port_width": "4X", "rdma_port_link_layer": "InfiniBand",
            "rdma_port_pkey": "0xffff"}


def tree() -> dict[str, str]:
    """The healthy tree: every file's path (relative to ROOT) and content."""
    files: dict[str, str] = {}
    for device in DEVICES:
        base = fakesys.port(f"{device}/1")
        files.update({f"{base}/state": "4: ACTIVE\n", f"{base}/phys_state": "5: LinkUp\n",
                      f"{base}/link_layer": "InfiniBand\n",
                      f"{base}/rate": "400 Gb/sec (4X NDR)\n",
                      f"{base}/pkeys/0": "0xffff\n", f"{base}/pkeys/1": "0x0000\n"})
    return files


def install(lab: Lab, node: str) -> None:
    files = tree()
    directories = sorted({f"{ROOT}/{path.rsplit('/', 1)[0]}" for path in files})
    node_sh(lab, node, " && ".join([
        f"rm -rf {ROOT}", "mkdir -p " + " ".join(map(shlex.quote, directories)),
        *(f"printf '%s' {shlex.quote(content)} > {shlex.quote(f'{ROOT}/{path}')}"
          for path, content in files.items())]))


@pytest.fixture(scope="module")
def fabric_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab_up(tmp_path_factory, "fp", 21, len(NODES)) as lab:
        (lab.config.inventory_dir / "group_vars" / "lab.yml").write_text(
            yaml.safe_dump(DECLARED))
        for node in NODES:
            install(lab, node)
        yield lab


def test_each_port_fault_fails_its_node_alone_naming_it(fabric_lab: Lab, tmp_path: Path
                                                        ) -> None:
    port = fakesys.port
    node_sh(fabric_lab, "node02", f"echo '200 Gb/sec (4X HDR)' > {ROOT}/{port('mlx5_2/1')}/rate")
    node_sh(fabric_lab, "node03", f"rm -rf {ROOT}/class/infiniband/mlx5_3")
    node_sh(fabric_lab, "node04", f"echo 0x8001 > {ROOT}/{port('mlx5_0/1')}/pkeys/0")
    report = tmp_path / "fabric.json"
    code = app.conformance_cmd(str(fabric_lab.config.inventory_dir), suites="fabric",
                               json_path=str(report))
    results = {(r["host"], r["check"]): r for r in json.loads(report.read_text())["results"]}
    ports = {n: results[(n, "test_fabric_ports")] for n in NODES}
    assert code == 1
    assert {n: r["outcome"] for n, r in ports.items()} == {
        "node01": "pass", "node02": "fail", "node03": "fail", "node04": "fail"}, ports
    assert ports["node02"]["message"].startswith(
        "node02: mlx5_2/1: rate 200 Gb/s (trained down), expected 400 Gb/s "
        "(rdma_port_rate_gbps)"), ports["node02"]
    assert ports["node03"]["message"].startswith(
        "node03: 3 ACTIVE InfiniBand RDMA ports, expected 4 (rdma_port_count)"), ports["node03"]
    assert ports["node04"]["message"].startswith(
        "node04: mlx5_0/1: partition keys 0x8001, expected 0xffff (rdma_port_pkey)"), \
        ports["node04"]
    assert {n: r["properties"].get("finding_class") for n, r in ports.items()} == {
        "node01": None, "node02": "hardware", "node03": "hardware",
        "node04": "configuration"}
    assert ports["node01"]["properties"]["ports"]["mlx5_0/1"]["pkeys"] == ["0xffff"]
    assert {results[(n, "test_rail_plan")]["outcome"] for n in NODES} == {"skip"}
