"""GPUDirect RDMA: NCCL's own log read on real captures of several NCCL versions and layouts
(tests/fixtures/nccl-gdr/, provenance in its README; the real H200's in
tests/fixtures/real-node/), the ``gpudirect`` fact's snippet run on stand-in trees, the
causes diagnosed from facts, the allreduce verdict across nodes, and the peermem role's
choice between nvidia-peermem and dma-buf."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.conformance.checks.gpudirect import (
    NO_GDRDMA,
    causes,
    gdr_settings,
    log_problem,
    nvlink_node,
    read_log,
    reads_gpu_memory,
    route,
    route_problem,
    setting_problem,
)
from gpufleet.conformance.launch import ProbeRun, _parse
from gpufleet.conformance.measure.allreduce import problem, transport_problem
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.errors import ParseError, VarError
from gpufleet.facts.catalog import gpudirect_fact
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.gpudirect import dmabuf_route
from gpufleet.facts.parsers.gpudirect import gpudirect_state
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision.plan import MANUAL
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import kernel, peermem
from tests.conftest import ROOT

GDR = ROOT / "tests" / "fixtures" / "nccl-gdr"
REAL_NODE = ROOT / "tests" / "fixtures" / "real-node"
# The first line of /proc/driver/nvidia/version on the real H200 (real-driver-h200x2.txt).
OPEN_MODULE = next(line for line in (REAL_NODE / "real-driver-h200x2.txt").read_text()
                   .splitlines() if line.startswith("NVRM version"))
PROPRIETARY_MODULE = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  "
                      "Tue Oct  8 03:22:07 UTC 2024")
PEERMEM_KO = "updates/dkms/nvidia-peermem.ko.zst"


def fixture(name: str) -> str:
    return (GDR / name).read_text()


def state(**changes: Any) -> dict[str, Any]:
    """An open-module node on Ubuntu 24.04's kernel with two HCAs, as the fact reads it."""
    return {"kernel": "6.8.0-90-generic", "peermem_loaded": False, "nvidia_loaded": True,
            "peermem_file": None, "flavor": "open", "rdma": ["mlx5_0", "mlx5_1"],
            "dma_buf": True, "nccl_conf": {}, **changes}


# --------------------------------------------------------------------------- the logs


def test_no_module_ib_log_of_nccl_2_1x_stages_through_host_memory() -> None:
    log = read_log(fixture("nccl-2.1x-ib-no-module-issue899.txt"))
    assert log.used is False
    assert {lk.detail for lk in log.staged(reads=True)} == {"NET/IB/0"}
    assert log.hcas == {"mlx5_1": "disabled (no module)", "mlx5_2": "disabled (no module)",
                        "mlx5_3": "disabled (no module)"}
    assert log_problem(log, {}, "gpu01") == (
        "NCCL staged inter-node data through host memory: channel 00 : 0[1a000] -> 1[1a000] "
        f"[receive] via NET/IB/0 {NO_GDRDMA} (and 3 more channel(s)); NCCL: GPU Direct RDMA "
        "mlx5_1 disabled (no module), mlx5_2 disabled (no module), mlx5_3 disabled (no "
        "module)")


def test_sends_from_host_memory_are_nccl_s_default_off_nvlink_platforms() -> None:
    """NCCL_NET_GDR_READ is on by default on NVLink platforms only (NCCL's environment
    documentation): elsewhere a send ``via NET/IB/0`` beside a GDRDMA receive is expected."""
    log = read_log("h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
                   "h:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via "
                   "NET/IB/0/GDRDMA\n")
    assert log_problem(log, {}, "gpu01", reads=False) is None
    assert NO_GDRDMA in str(log_problem(log, {}, "gpu01", reads=True))
    assert reads_gpu_memory({}, log, nvlink=True) is True
    assert reads_gpu_memory({}, log, nvlink=False) is False
    assert reads_gpu_memory({"NCCL_NET_GDR_READ": "1"}, log, nvlink=False) is True
    assert reads_gpu_memory({}, read_log("h:1:2 [0] NCCL INFO NCCL_NET_GDR_READ set by "
                                         "environment to 0\n"), nvlink=True) is False
    assert nvlink_node({"0": [26.562, 26.562], "1": [26.562]}) is True
    assert nvlink_node({"0": [], "1": [None]}) is nvlink_node({}) is False


def test_roce_hcas_disabled_without_channels_is_not_a_verdict_on_use() -> None:
    log = read_log(fixture("nccl-roce-gdr-disabled-issue1537.txt"))
    assert log.used is None
    assert log.hcas == {"mlx5_0": "disabled", "mlx5_1": "disabled"}


@pytest.mark.parametrize("name", ["nccl-2.19plus-ib-gdrdma-aks-pr36.txt",
                                  "nccl-2.1x-a100-gdrdma-issue707.txt",
                                  "nccl-ibext-gdrdma-deepep-issue106.txt"])
def test_gdrdma_channels_of_three_layouts_pass(name: str) -> None:
    log = read_log(fixture(name))
    assert log.used is True
    assert log.net and not log.staged(reads=True)
    assert log_problem(log, {}, "gpu01") is None


def test_the_environment_nccl_read_is_kept() -> None:
    log = read_log(fixture("nccl-2.19plus-ib-gdrdma-aks-pr36.txt"))
    assert log.environment == {"NCCL_NET_GDR_LEVEL": "SYS"}
    assert setting_problem(log.environment) is None


def test_dma_buf_on_the_gpu_alone_says_nothing_about_the_network() -> None:
    log = read_log(fixture("nccl-tests-ofi-dmabuf-available-issue245.txt"))
    assert (log.dmabuf_gpus, log.used, log.hcas) == (True, None, {})


@pytest.mark.parametrize("name", ["default", "socket-fallback"])
def test_the_real_h200_has_no_rdma_channel(name: str) -> None:
    log = read_log((REAL_NODE / f"nccl-debug-info-h200x2-{name}.txt").read_text())
    assert (log.version, log.used) == ("2.28.9+cuda13.0", None)
    assert log.hcas == {"eth0": "disabled"}


def test_the_route_lines_and_the_distance_verdict_in_nccl_s_formats() -> None:
    """Lines in the formats of the HPC-X/DOCA plugin (nccl-rdma-sharp-plugins p2p_plugin.c:
    its format string has no closing quote) and of NCCL's topology (src/graph/paths.cc)."""
    log = read_log(textwrap.dedent("""\
        h1:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA (nvidia-peermem) enabled for HCA 0 'mlx5_0
        h1:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 'mlx5_0
        h1:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1'
        h1:1:2 [0] NCCL INFO GPU Direct RDMA Disabled for GPU 0 / HCA 1 (distance 8 > 5)
        h:1:2 [0] NCCL INFO Channel 03/0 : 11[3] -> 3[3] [send] via NET/NCCL RDMA Plugin v9/3/GDRDMA
        """))
    assert log.hcas == {"mlx5_0": "enabled (DMABUF)", "mlx5_1": "disabled"}
    assert log.routes() == ["DMABUF"]
    assert log.too_far == ["GPU 0 / HCA 1 (distance 8 > 5)"]
    assert log.used is True and log.net[0].detail == "NET/NCCL RDMA Plugin v9/3/GDRDMA"


def test_a_log_is_read_up_to_its_bound() -> None:
    line = "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
    log = read_log("x" * (9 * 1024 * 1024) + line)
    assert log.net == []


# --------------------------------------------------------------------------- the fact


def tree(root: Path, *, module: str = OPEN_MODULE, peermem_loaded: bool = False,
         peermem_file: bool = True, config: str = "CONFIG_DMA_SHARED_BUFFER=y",
         nccl_conf: str = "NCCL_IB_HCA=mlx5\n", release: str = "6.8.0-90-generic") -> None:
    files = {"proc/sys/kernel/osrelease": release, "proc/driver/nvidia/version": module,
             "sys/module/nvidia/taint": "OE" if "Open" in module else "POE",
             "sys/class/infiniband/mlx5_0/node_type": "1: CA",
             "sys/class/infiniband/mlx5_1/node_type": "1: CA",
             f"lib/modules/{release}/modules.dep":
                 "kernel/drivers/infiniband/core/ib_core.ko.zst:\n"
                 + (f"{PEERMEM_KO}: kernel/drivers/infiniband/core/ib_core.ko.zst\n"
                    if peermem_file else ""),
             f"boot/config-{release}": f"CONFIG_MODULES=y\n{config}\n",
             "etc/nccl.conf": nccl_conf}
    if peermem_loaded:
        files["sys/module/nvidia_peermem/refcnt"] = "0"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text + "\n")


def gathered(root: Path) -> dict[str, Any]:
    fact = gpudirect_fact(str(root))
    out = subprocess.run(["sh", "-c", fact.shell], capture_output=True, text=True, check=True)
    parsed: dict[str, Any] = fact.parse(out.stdout)
    return parsed


def test_the_snippet_reads_an_open_module_node(tmp_path: Path) -> None:
    tree(tmp_path, nccl_conf="NCCL_IB_HCA=mlx5\nNCCL_NET_GDR_LEVEL = PHB\n")
    assert gathered(tmp_path) == state(peermem_file=PEERMEM_KO,
                                       nccl_conf={"NCCL_NET_GDR_LEVEL": "PHB"})


def test_the_snippet_reads_a_proprietary_module_without_dma_buf(tmp_path: Path) -> None:
    tree(tmp_path, module=PROPRIETARY_MODULE, peermem_file=False, peermem_loaded=True,
         config="# CONFIG_DMA_SHARED_BUFFER is not set")
    found = gathered(tmp_path)
    assert (found["flavor"], found["peermem_loaded"], found["peermem_file"],
            found["dma_buf"]) == ("proprietary", True, None, False)


def test_the_flavor_falls_back_to_the_module_s_taint() -> None:
    text = ("kernel 6.8.0-90-generic\npeermem_loaded no\nnvidia_loaded yes\npeermem_file \n"
            "module \ntaint POE\nrdma \ndma_buf \n")
    assert gpudirect_state(text)["flavor"] == "proprietary"
    assert gpudirect_state(text.replace("POE", "OE"))["flavor"] == "open"
    assert gpudirect_state(text.replace("yes", "no"))["flavor"] is None


def test_a_truncated_snippet_is_unknown() -> None:
    with pytest.raises(ParseError, match="gpudirect snippet"):
        gpudirect_state("kernel 6.8.0\npeermem_loaded no\n")


# --------------------------------------------------------------------------- the causes


def test_dma_buf_needs_the_open_module_a_5_12_kernel_and_dma_buf() -> None:
    assert dmabuf_route(state()) is None
    assert "proprietary" in str(dmabuf_route(state(flavor="proprietary")))
    assert "older than 5.12" in str(dmabuf_route(state(kernel="5.4.0-216-generic")))
    assert "CONFIG_DMA_SHARED_BUFFER" in str(dmabuf_route(state(dma_buf=False)))
    assert dmabuf_route(state(dma_buf=None)) is None  # no readable config: not held against it


def test_route_problems_name_the_module_and_the_dma_buf_reason() -> None:
    assert route(state()) == "dma-buf" and route_problem(state()) is None
    assert route(state(flavor="proprietary", peermem_loaded=True)) == "nvidia-peermem"
    assert route_problem(state(flavor="proprietary", peermem_file=PEERMEM_KO)) == (
        f"nvidia-peermem is not loaded (the module is installed: {PEERMEM_KO}), and the "
        "dma-buf route is unavailable: the NVIDIA kernel module is proprietary (dma-buf "
        "needs the open kernel module)")
    assert route_problem(state(kernel="5.4.0-216-generic")) == (
        "nvidia-peermem is absent (no nvidia-peermem.ko in kernel 5.4.0-216-generic's "
        "modules.dep), and the dma-buf route is unavailable: kernel 5.4.0-216-generic is "
        "older than 5.12 (dma-buf needs 5.12 or later)")


def test_the_job_s_settings_nccl_env_over_nccl_conf() -> None:
    conf = state(nccl_conf={"NCCL_NET_GDR_LEVEL": "LOC"})
    assert setting_problem(gdr_settings(None, conf)) == (
        "NCCL_NET_GDR_LEVEL=LOC turns GPUDirect RDMA off")
    assert setting_problem(gdr_settings({"NCCL_NET_GDR_LEVEL": "SYS"}, conf)) is None
    assert setting_problem(gdr_settings({"NCCL_IB_GDR_LEVEL": 0}, state())) == (
        "NCCL_IB_GDR_LEVEL=0 turns GPUDirect RDMA off")


def test_unexplained_causes_name_acs_as_possible() -> None:
    [why] = causes(state(), "", {})
    assert "possibly ACS on the PCIe switch" in why and "dma-buf available" in why
    assert causes(None, "timed out", {}) == [
        "the node's GPUDirect facts are unknown (timed out)"]


# --------------------------------------------------------------------------- the allreduce


def two_nodes(tmp_path: Path, facts: dict[str, dict[str, Any]], extra: str = "") -> list[Node]:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    allreduce_timeout_s: 90\n" + extra + "  hosts:\n"
                    + "".join(f"    {name}:\n" for name in facts))
    return [Node(h, ConnectOptions(), Facts(h.name, values=facts[h.name]))
            for h in load_inventory(path).select("all")]


def pair_run(text: str) -> ProbeRun:
    """The issue 899 capture as two nodes' outputs: each host's lines, with its rank's
    ``comm .. rank`` line (NCCL prints one per rank; the excerpt left them out)."""
    hosts = {"21346d5cefce": ("node01", 0), "6a5a91752e39": ("node02", 1)}
    result = ('{"event": "result", "size": 1048576, "busbw": 100.0, "wrong": 0, '
              '"world_size": 2, "backend": "nccl"}')
    outputs = {}
    for host, (name, rank) in hosts.items():
        lines = [line for line in text.splitlines() if line.startswith(host)]
        comm = f"{host}:1:1 [0] NCCL INFO comm 0x1 rank {rank} nranks 2 cudaDev 0 busId 1a000"
        outputs[name] = _parse("\n".join([comm, *lines, result, "@@gpufleet-probe-rc=0"]), "")
    return ProbeRun(["node01", "node02"], outputs)


GPU = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}


def test_the_pair_without_gdrdma_fails_naming_the_node_and_its_cause(tmp_path: Path) -> None:
    first, second = two_nodes(tmp_path, {
        "node01": {**GPU, "gpudirect": state(flavor="proprietary", peermem_file=PEERMEM_KO)},
        "node02": {**GPU, "gpudirect": state(flavor="proprietary", peermem_loaded=True)}})
    run = pair_run(fixture("nccl-2.1x-ib-no-module-issue899.txt"))
    peers = {first.name: first, second.name: second}
    message = str(transport_problem(run, first, peers))
    assert message.startswith("node01: NCCL staged inter-node data through host memory: "
                              "channel 00 : 0[1a000] -> 1[1a000] [receive] via NET/IB/0 "
                              f"{NO_GDRDMA}")
    assert f"cause: nvidia-peermem is not loaded (the module is installed: {PEERMEM_KO})" \
        in message
    assert "node02: " in message and "possibly ACS" in message  # loaded, yet staged
    assert problem(run, first, 2, None, peers) == message


def test_nodes_without_rdma_or_gpus_or_the_requirement_are_not_held_to_it(
        tmp_path: Path) -> None:
    run = pair_run(fixture("nccl-2.1x-ib-no-module-issue899.txt"))
    for facts, extra in (({**GPU, "gpudirect": state(rdma=[])}, ""),
                         ({"gpudirect": state()}, ""),
                         ({**GPU, "gpudirect": state()}, "    gpudirect_required: false\n"),
                         ({**GPU, "gpudirect": state()},
                          "    allreduce_transport_inter: socket\n")):
        first, second = two_nodes(tmp_path, {"node01": facts, "node02": facts}, extra)
        assert transport_problem(run, first, {"node01": first, "node02": second}) is None


# --------------------------------------------------------------------------- the role


def inventory(tmp_path: Path, text: str) -> Inventory:
    body = "all:\n  hosts:\n    gpu01:\n      ansible_host: 10.0.0.11\n" + \
        textwrap.indent(textwrap.dedent(text), " " * 6)
    (tmp_path / "hosts.yml").write_text(body)
    return load_inventory(tmp_path / "hosts.yml")


def planned(tmp_path: Path, text: str, fact: dict[str, Any]) -> list[Any]:
    inv = inventory(tmp_path, "gpudirect_rdma: true\n" + text)
    host = inv.hosts["gpu01"]
    facts = Facts("gpu01", values={"gpudirect": fact,
                                   f"file:{peermem.MODULES_LOAD}":
                                       FileState(peermem.MODULES_LOAD, exists=False)})
    return peermem.ROLE.plan(facts, RoleVars(host, peermem.ROLE.defaults),
                             PlanContext(inv, host))


def test_auto_takes_dma_buf_with_the_open_module_and_says_why(tmp_path: Path) -> None:
    [change] = planned(tmp_path, "", state())
    assert change.item == f"peermem/file {peermem.MODULES_LOAD}"
    assert "GPUDirect RDMA through dma-buf (open kernel module, kernel 6.8.0-90-generic): " \
        "nvidia-peermem is not needed and not loaded (gpudirect_route: auto)" in change.diff
    assert "\nnvidia-peermem\n" not in change.diff


def test_auto_loads_peermem_with_the_proprietary_module(tmp_path: Path) -> None:
    changes = planned(tmp_path, "", state(flavor="proprietary"))
    assert [c.item for c in changes] == [f"peermem/file {peermem.MODULES_LOAD}",
                                         "peermem/module nvidia_peermem"]


def test_peermem_chosen_is_loaded_even_where_dma_buf_would_do(tmp_path: Path) -> None:
    changes = planned(tmp_path, "gpudirect_route: peermem\n", state())
    assert changes[-1].steps[0].describe() == "modprobe nvidia-peermem"


def test_dma_buf_chosen_where_it_is_unavailable_is_for_an_operator(tmp_path: Path) -> None:
    [change] = planned(tmp_path, "gpudirect_route: dmabuf\n", state(kernel="5.15.0-1-generic",
                                                                     flavor="proprietary"))
    assert (change.action, change.before) == (MANUAL, "the NVIDIA kernel module is "
                                              "proprietary (dma-buf needs the open kernel "
                                              "module)")


def test_the_route_is_validated_before_any_host_is_contacted(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "gpudirect_rdma: true\ngpudirect_route: gdrcopy\n")
    with pytest.raises(VarError, match="gpudirect_route"):
        peermem.ROLE.check(RoleVars(inv.hosts["gpu01"], peermem.ROLE.defaults))


def test_the_kernel_role_builds_no_peermem_for_dma_buf(tmp_path: Path) -> None:
    for route_value, modules in (("auto", ("nvidia-peermem",)), ("dmabuf", ())):
        inv = inventory(tmp_path, f"gpudirect_rdma: true\ngpudirect_route: {route_value}\n")
        v = RoleVars(inv.hosts["gpu01"], kernel.ROLE.defaults)
        assert kernel.ROLE.modules(v) == modules


# --------------------------------------------------------------------------- the variables


@pytest.mark.parametrize(("line", "message"), [
    ("gpudirect_required: maybe", "variable gpudirect_required must be a boolean"),
    ("gpudirect_nccl_log: nccl.log", "variable gpudirect_nccl_log must be an absolute path"),
    ("kernel_state_root: run/lab", "variable kernel_state_root must be an absolute path"),
])
def test_the_suite_s_variables_are_checked_before_any_host_is_contacted(
        tmp_path: Path, line: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    gpu1:\n      ansible_host: 192.0.2.1\n      {line}\n")
    assert app.conformance_cmd(str(inv), suites="gpudirect") == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: host gpu1: {message}") and err.endswith(f"({inv}:5)\n")


def test_a_channel_over_the_network_inside_one_host_is_not_inter_node() -> None:
    text = ("a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1a000\n"
            "a:1:1 [1] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 1 busId 1b000\n"
            "a:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0\n")
    assert read_log(text).used is None
    assert read_log(text, {0: "a", 1: "b"}).used is False
