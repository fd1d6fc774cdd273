"""GPUDirect RDMA on lab nodes: each fault injected on node02 fails node02 alone, naming the
cause; no provisioning.

Lab nodes have no GPU, no RDMA NIC and no NVIDIA module, and run gloo (no NCCL), so each node
gets stand-ins: tests/lab/fakegpu.py's nvidia-smi (the GPU facts), a tree under ROOT
(``kernel_state_root``) holding what the ``gpudirect`` fact reads (the NVIDIA module's
version line and taint, nvidia_peermem in /sys/module and in modules.dep, two RDMA devices,
the kernel's release and dma-buf config, nccl.conf), and an NCCL INFO log at LOG
(``gpudirect_nccl_log``): a public capture with GDRDMA on every channel, or node02's without
(tests/fixtures/nccl-gdr). node01 takes the dma-buf route (open module, kernel 6.8), node02
and node03 nvidia-peermem (the proprietary module). What this proves and what only a real
fabric can: docs/conformance.md#gpudirect.
"""

from __future__ import annotations

import io
import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.conftest import FIXTURES
from tests.lab import fakegpu
from tests.lab.conftest import lab_up, node_sh

NODES = ("node01", "node02", "node03")
ROOT = "/run/gpufleet-lab/gpudirect"
LOG = "/var/log/gpufleet-lab/nccl.log"
RELEASE = "6.8.0-90-generic"
PEERMEM_KO = "updates/dkms/nvidia-peermem.ko.zst"
OPEN = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(nixbld@)  Tue Jan  1 00:00:00 UTC 1980")
PROPRIETARY = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 "
               "03:22:07 UTC 2024")
WITH_GDR = FIXTURES / "nccl-gdr" / "nccl-2.19plus-ib-gdrdma-aks-pr36.txt"
WITHOUT_GDR = FIXTURES / "nccl-gdr" / "nccl-2.1x-ib-no-module-issue899.txt"
CHECKS = ("gpudirect_route", "gpudirect_in_nccl_log")


def standin(lab: Lab, node: str, *, module: str, peermem_loaded: bool, log: Path,
            nccl_conf: str = "NCCL_IB_HCA=mlx5\n") -> None:
    """The node's stand-in tree and NCCL log (replacing any earlier one)."""
    files = {f"{ROOT}/proc/sys/kernel/osrelease": RELEASE,
             f"{ROOT}/proc/driver/nvidia/version": module,
             f"{ROOT}/sys/module/nvidia/taint": "OE" if "Open" in module else "POE",
             f"{ROOT}/sys/class/infiniband/mlx5_0/node_type": "1: CA",
             f"{ROOT}/sys/class/infiniband/mlx5_1/node_type": "1: CA",
             f"{ROOT}/lib/modules/{RELEASE}/modules.dep":
                 f"{PEERMEM_KO}: kernel/drivers/infiniband/core/ib_core.ko.zst",
             f"{ROOT}/boot/config-{RELEASE}": "CONFIG_DMA_SHARED_BUFFER=y",
             f"{ROOT}/etc/nccl.conf": nccl_conf.rstrip("\n"),
             LOG: log.read_text().rstrip("\n")}
    if peermem_loaded:
        files[f"{ROOT}/sys/module/nvidia_peermem/refcnt"] = "0"
    commands = [f"rm -rf {ROOT}"] + [
        f"mkdir -p {shlex.quote(str(Path(path).parent))} && "
        f"printf '%s\\n' {shlex.quote(text)} > {shlex.quote(path)}"
        for path, text in files.items()]
    node_sh(lab, node, " && ".join(commands))


def healthy(lab: Lab) -> None:
    standin(lab, "node01", module=OPEN, peermem_loaded=False, log=WITH_GDR)
    for node in ("node02", "node03"):
        standin(lab, node, module=PROPRIETARY, peermem_loaded=True, log=WITH_GDR)


@pytest.fixture(scope="module")
def gd_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with lab_up(tmp_path_factory, "gd", 22, len(NODES)) as lab:
        (lab.config.inventory_dir / "group_vars" / "lab.yml").write_text(yaml.safe_dump(
            {"kernel_state_root": ROOT, "gpudirect_nccl_log": LOG}))
        for node in NODES:
            fakegpu.install(lab, node)
        healthy(lab)
        yield lab


def run(lab: Lab, tmp_path: Path, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The gpudirect suite on the lab: each (node, check)'s result."""
    report = tmp_path / f"{name}.json"
    app.conformance_cmd(str(lab.config.inventory_dir), limit=":".join(NODES),
                        suites="gpudirect", json_path=str(report), out=io.StringIO())
    return {(r["host"], r["check"].removeprefix("test_")): r
            for r in json.loads(report.read_text())["results"]}


def test_the_healthy_lab_passes_by_both_routes(gd_lab: Lab, tmp_path: Path) -> None:
    found = run(gd_lab, tmp_path, "healthy")
    assert {key: r["outcome"] for key, r in found.items()} == {
        (node, check): "pass" for node in NODES for check in CHECKS}
    routes = {node: found[(node, "gpudirect_route")]["properties"]["gpudirect_route"]
              for node in NODES}
    assert routes == {"node01": "dma-buf", "node02": "nvidia-peermem",
                      "node03": "nvidia-peermem"}


FAULTS: dict[str, tuple[dict[str, Any], str]] = {
    "nvidia-peermem not loaded": (
        {"module": PROPRIETARY, "peermem_loaded": False},
        f"nvidia-peermem is not loaded (the module is installed: {PEERMEM_KO}), and the "
        "dma-buf route is unavailable: the NVIDIA kernel module is proprietary (dma-buf needs "
        "the open kernel module)"),
    "NCCL_NET_GDR_LEVEL=LOC in nccl.conf": (
        {"module": OPEN, "peermem_loaded": False,
         "nccl_conf": "NCCL_IB_HCA=mlx5\nNCCL_NET_GDR_LEVEL=LOC\n"},
        "NCCL_NET_GDR_LEVEL=LOC turns GPUDirect RDMA off"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_gdr_off_fails_node02_alone_naming_the_cause(gd_lab: Lab, tmp_path: Path,
                                                     fault: str) -> None:
    state, cause = FAULTS[fault]
    standin(gd_lab, "node02", log=WITHOUT_GDR, **state)
    try:
        found = run(gd_lab, tmp_path, "fault")
    finally:
        healthy(gd_lab)
    failed = {key for key, r in found.items() if r["outcome"] != "pass"}
    assert failed == {("node02", check) for check in CHECKS}, found
    route = found[("node02", "gpudirect_route")]
    assert route["message"].endswith(f"node02: GPUDirect RDMA is off: {cause}"), route
    log = found[("node02", "gpudirect_in_nccl_log")]
    assert "node02: NCCL staged inter-node data through host memory: channel 00 : 0[1a000] " \
        "-> 1[1a000] [receive] via NET/IB/0 has no GDRDMA" in log["message"], log
    assert f"-- cause: {cause}" in log["message"], log
    assert {route["properties"]["finding_class"], log["properties"]["finding_class"]} == {
        "configuration"}
