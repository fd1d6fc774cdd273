"""Fabric ports as declared: the rdma fact over real sysfs trees, the declaration and its
per-model defaults, the port and rail verdicts, the variables' validation, and the line-rate
gate held to the declared rate (tests/fixtures/fabric/README.md says where each input
comes from)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpufleet.conformance.checks import fabric
from gpufleet.conformance.launch import NodeOutput, ProbeRun
from gpufleet.conformance.measure.allreduce import line_rate_share, problem, trained_down
from gpufleet.conformance.nic_counters import (
    LineRate,
    Port,
    Sample,
    declared_line_rate,
    line_rate,
    parse_sample,
)
from gpufleet.conformance.registry import suite
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.fabric import STAND_IN, FabricSettings, declared, pkey
from gpufleet.connect.connection import ConnectOptions
from gpufleet.facts import formats, script
from gpufleet.facts.catalog import BASE_FACTS, rdma_fact
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers.nvidia_smi import nvidia_topo
from gpufleet.inventory.load import load_inventory
from gpufleet.provision.role import VarError
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
GPUD = FIXTURES / "watch" / "gpud" / "sys"  # an H100 node: 8 NDR ports and a RoCE bond
PROCFS = FIXTURES / "watch" / "procfs" / "sys"
PKEYS = FIXTURES / "fabric" / "azure-setup-mpi-pkeys.txt"
H100X4_TOPO = FIXTURES / "nvidia" / "h100x4_topo_m_spaces_nccl1617.txt"
A100X4_TOPO = FIXTURES / "nvidia" / "a100x4_topo_m_spaces_nccltests331.txt"
H100 = "NVIDIA H100 80GB HBM3"
IB_PORTS = [f"mlx5_{i}/1" for i in (0, 1, 4, 5, 6, 7, 8, 9)]


def _read(root: Path) -> list[dict[str, Any]]:
    """The rdma fact's own snippet run over a tree, parsed."""
    fact = rdma_fact(str(root))
    out = subprocess.run(["sh", "-c", fact.shell], capture_output=True, text=True, check=True)
    result: list[dict[str, Any]] = fact.parse(out.stdout)
    return result


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(GPUD, root)
    return root


def _port_file(root: Path, name: str, leaf: str) -> Path:
    device, number = name.split("/")
    return root / "class" / "infiniband" / device / "ports" / number / leaf


def _pkeys(root: Path) -> None:
    """The partition keys Azure's documentation shows, at indexes 0 and 1 of every port."""
    lines = [line for line in PKEYS.read_text().splitlines() if line.startswith("0x")]
    for name in (*IB_PORTS, "mlx5_bond_0/1"):
        (_port_file(root, name, "pkeys")).mkdir()
        for index, key in enumerate(lines):
            _port_file(root, name, f"pkeys/{index}").write_text(key + "\n")


def _gpus(count: int = 8, name: str = H100) -> list[dict[str, Any]]:
    return [{"index": i, "name": name} for i in range(count)]


# ---- the fact ---------------------------------------------------------------------------

def test_the_fact_reads_the_h100_node_s_ports_rate_width_and_states() -> None:
    ports = {fabric.port_name(p): p for p in _read(GPUD)}
    assert sorted(ports) == sorted([*IB_PORTS, "mlx5_bond_0/1"])
    ndr = ports["mlx5_0/1"]
    assert (ndr["link_layer"], ndr["state"], ndr["phys_state"], ndr["rate_gbps"],
            ndr["width"], ndr["speed"], ndr["pkeys"]) == (
        "InfiniBand", "ACTIVE", "LinkUp", 400.0, "4X", "NDR", [])
    bond = ports["mlx5_bond_0/1"]
    assert (bond["link_layer"], bond["rate_gbps"], bond["width"]) == ("Ethernet", 200.0, "2X")


def test_the_fact_reads_older_hcas_and_a_file_without_its_newline() -> None:
    ports = {fabric.port_name(p): p for p in _read(PROCFS)}
    assert (ports["mlx4_0/2"]["rate_gbps"], ports["mlx4_0/2"]["speed"]) == (40.0, "QDR")
    assert (ports["mlx5_0/1"]["rate_gbps"], ports["mlx5_0/1"]["width"]) == (25.0, "1X")
    assert ports["hfi1_0/1"]["rate_gbps"] == 100.0


def test_the_fact_reads_the_partition_keys_at_indexes_0_and_1(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _pkeys(root)
    (_port_file(root, "mlx5_4/1", "pkeys/1")).write_text("0x0000\n")  # an empty entry
    ports = {fabric.port_name(p): p for p in _read(root)}
    assert ports["mlx5_0/1"]["pkeys"] == ["0x800b", "0x7fff"]
    assert ports["mlx5_4/1"]["pkeys"] == ["0x800b"]


def test_a_missing_file_is_unknown_and_a_tree_without_devices_is_no_port(tmp_path: Path
                                                                         ) -> None:
    root = _tree(tmp_path)
    _port_file(root, "mlx5_0/1", "rate").unlink()
    ports = {fabric.port_name(p): p for p in _read(root)}
    assert (ports["mlx5_0/1"]["rate_gbps"], ports["mlx5_0/1"]["width"]) == (None, None)
    assert _read(tmp_path / "nothing") == []


def test_the_base_rdma_fact_reads_sys() -> None:
    base = next(f for f in BASE_FACTS if f.name == "rdma")
    assert "for d in /sys/class/infiniband/*;" in base.shell and "$(" not in base.shell


@pytest.mark.parametrize(("text", "expected"), [
    ("400 Gb/sec (4X NDR)\n", (400.0, "4X", "NDR")),
    ("200 Gb/sec (2X NDR)", (200.0, "2X", "NDR")),
    ("10 Gb/sec (4X)", (10.0, "4X", None)),
    ("2.5 Gb/sec (1X)", (2.5, "1X", None)),
])
def test_rate_strings(text: str, expected: tuple[float, str, str | None]) -> None:
    assert formats.rdma_rate(text) == expected


@pytest.mark.parametrize("line", [
    "mlx5_0\t1\tInfiniBand\t4: ACTIVE\t5: LinkUp\tfast\t-\t-",
    "mlx5_0\t1\tInfiniBand\t4: ACTIVE\t5: LinkUp\t-\tffff\t-",
    "mlx5_0\tx\tInfiniBand\t4: ACTIVE\t5: LinkUp\t-\t-\t-",
])
def test_unreadable_port_lines_are_parse_errors(line: str) -> None:
    with pytest.raises(formats.ParseError):
        formats.rdma_devices(line + "\n")


# ---- the declaration --------------------------------------------------------------------

def test_an_hgx_h100_with_infiniband_ports_gets_the_default() -> None:
    decl = fabric.declaration({}, _gpus(), _read(GPUD))
    assert (decl.count, decl.rate_gbps, decl.width, decl.link_layer, decl.pkey) == (
        8, 400.0, "4X", "InfiniBand", None)
    assert decl.variable("rate_gbps") == f"rdma_port_rate_gbps, the default for 8x {H100}"
    assert decl.source == f"8x {H100}: {fabric.HGX_SOURCE}"
    h200 = fabric.declaration({}, _gpus(name="NVIDIA H200"), _read(GPUD))
    assert h200.count == 8


@pytest.mark.parametrize(("gpus", "why"), [
    (_gpus(name="NVIDIA H100 PCIe"), "no default for 8x NVIDIA H100 PCIe"),
    (_gpus(name="NVIDIA H200 NVL"), "no default for 8x NVIDIA H200 NVL"),
    (_gpus(1, "NVIDIA H200"), "no default for 1x NVIDIA H200"),
    (_gpus(name="NVIDIA A100-SXM4-80GB"), "no default for 8x NVIDIA A100-SXM4-80GB"),
    (None, "no default without GPUs"),
])
def test_no_default_elsewhere(gpus: list[dict[str, Any]] | None, why: str) -> None:
    decl = fabric.declaration({}, gpus, _read(GPUD))
    assert decl.empty() and decl.note == why


def test_no_default_where_the_fabric_is_not_infiniband() -> None:
    roce = [p for p in _read(GPUD) if p["link_layer"] == "Ethernet"]
    decl = fabric.declaration({}, _gpus(), roce)
    assert decl.empty() and "its fabric is unknown" in decl.note
    assert fabric.declaration({}, _gpus(), []).empty()


def test_the_inventory_overrides_the_default_field_by_field() -> None:
    decl = fabric.declaration({"rate_gbps": 200, "pkey": "0x800B"}, _gpus(), _read(GPUD))
    assert (decl.count, decl.rate_gbps, decl.pkey) == (8, 200.0, "0x800b")
    assert decl.variable("rate_gbps") == "rdma_port_rate_gbps"
    assert decl.variable("count").startswith("rdma_port_count, the default")
    plain = fabric.declaration({"count": 2, "link_layer": "Ethernet"}, _gpus(1), [])
    assert (plain.count, plain.link_layer, plain.rate_gbps) == (2, "Ethernet", None)


# ---- the port verdicts ------------------------------------------------------------------

def _findings(root: Path, values: dict[str, Any] | None = None, hca: str = "",
              expected: tuple[str, ...] = ()) -> list[fabric.Finding]:
    judged = fabric.judged_ports(_read(root), hca)
    decl = fabric.declaration(values or {}, _gpus(), judged)
    return fabric.port_findings(judged, decl, expected, named=bool(hca))


def test_the_healthy_h100_node_passes_its_default_beside_its_roce_bond() -> None:
    assert _findings(GPUD) == []


def test_a_port_trained_down_to_200_fails_as_hardware(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _port_file(root, "mlx5_5/1", "rate").write_text("200 Gb/sec (4X HDR)\n")
    found = _findings(root, {"rate_gbps": 400})
    assert [(f.text, f.kind) for f in found] == [
        ("mlx5_5/1: rate 200 Gb/s (trained down), expected 400 Gb/s (rdma_port_rate_gbps)",
         "hardware")]


def test_a_narrower_port_fails_naming_its_width(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _port_file(root, "mlx5_6/1", "rate").write_text("200 Gb/sec (2X NDR)\n")
    texts = [f.text for f in _findings(root, {"count": 8, "rate_gbps": 400, "width": "4X"})]
    assert texts == [
        "mlx5_6/1: rate 200 Gb/s (trained down), expected 400 Gb/s (rdma_port_rate_gbps)",
        "mlx5_6/1: width 2X, expected 4X (rdma_port_width)"]


def test_a_port_down_or_gone_fails_the_count(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _port_file(root, "mlx5_7/1", "state").write_text("1: DOWN\n")
    _port_file(root, "mlx5_7/1", "phys_state").write_text("2: Polling\n")
    shutil.rmtree(root / "class" / "infiniband" / "mlx5_9")
    found = _findings(root, expected=("mlx5_0", "mlx5_9"))
    assert [(f.text, f.kind) for f in found] == [(
        f"6 ACTIVE InfiniBand RDMA ports, expected 8 (rdma_port_count, the default for 8x "
        f"{H100}): mlx5_7/1 DOWN (Polling); mlx5_bond_0/1: link layer Ethernet, expected "
        f"InfiniBand (rdma_port_link_layer, the default for 8x {H100}); mlx5_9 absent",
        "hardware")]


def test_a_port_of_the_other_link_layer_is_named_where_it_is_short(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _port_file(root, "mlx5_8/1", "link_layer").write_text("Ethernet\n")
    found = _findings(root, {"count": 8, "link_layer": "InfiniBand"})
    assert [(f.text, f.kind) for f in found] == [(
        "7 ACTIVE InfiniBand RDMA ports, expected 8 (rdma_port_count): mlx5_8/1: link "
        "layer Ethernet, expected InfiniBand (rdma_port_link_layer); mlx5_bond_0/1: link "
        "layer Ethernet, expected InfiniBand (rdma_port_link_layer)", "configuration")]
    named = _findings(GPUD, {"count": 1, "link_layer": "InfiniBand"}, hca="mlx5_0,mlx5_bond")
    assert [f.text for f in named] == [
        "mlx5_bond_0/1: link layer Ethernet, expected InfiniBand (rdma_port_link_layer)"]


def test_a_different_partition_key_fails_as_configuration(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _pkeys(root)
    assert _findings(root, {"pkey": "0x800b"}) == []
    assert _findings(root, {"pkey": "0x7FFF"}) == []
    _port_file(root, "mlx5_1/1", "pkeys/0").write_text("0x8001\n")
    found = _findings(root, {"pkey": "0x800b"})
    assert [(f.text, f.kind) for f in found] == [
        ("mlx5_1/1: partition keys 0x8001, 0x7fff, expected 0x800b (rdma_port_pkey)",
         "configuration")]
    assert fabric.finding_class(found) == "configuration"


def test_nccl_ib_hca_limits_the_ports_judged() -> None:
    judged = fabric.judged_ports(_read(GPUD), "mlx5_0,mlx5_1")
    assert [fabric.port_name(p) for p in judged] == ["mlx5_0/1", "mlx5_1/1"]
    assert len(fabric.judged_ports(_read(GPUD), "^mlx5_bond")) == 8
    assert [f.text for f in _findings(GPUD, {"count": 8}, hca="mlx5_0,mlx5_1")] == [
        "2 ACTIVE InfiniBand RDMA ports, expected 8 (rdma_port_count)"]


def test_a_faster_port_than_declared_is_configuration() -> None:
    found = _findings(GPUD, {"rate_gbps": 200})
    assert {f.kind for f in found} == {"configuration"} and len(found) == 8
    assert fabric.finding_class([*found, fabric.Finding("x", "hardware")]) == "hardware"


# ---- the rail plan ----------------------------------------------------------------------

def test_the_rail_plan_against_the_h100_topology() -> None:
    topology = nvidia_topo(H100X4_TOPO.read_text())
    assert fabric.nearest_nics(topology, "GPU2") == ("PIX", ["NIC2"])
    good = {f"GPU{i}": f"NIC{i}" for i in range(4)}
    assert fabric.rail_findings(good, topology, []) == []
    crossed = fabric.rail_findings({"GPU0": "NIC1", "GPU1": "NIC0"}, topology, [])
    assert [(f.text, f.kind) for f in crossed] == [
        ("GPU0: rail NIC1 is SYS from it, expected the nearest NIC: NIC0 (PIX) (rdma_rails)",
         "configuration"),
        ("GPU1: rail NIC0 is SYS from it, expected the nearest NIC: NIC1 (PIX) (rdma_rails)",
         "configuration")]
    unknown = fabric.rail_findings({"GPU7": "NIC0", "GPU0": "NIC9"}, topology, [])
    assert [f.text for f in unknown] == [
        "GPU0: rail NIC9 is not in nvidia-smi topo -m (NICs: NIC0, NIC1, NIC2, NIC3) "
        "(rdma_rails)",
        "GPU7: not in nvidia-smi topo -m (GPUs: GPU0, GPU1, GPU2, GPU3) (rdma_rails)"]


def test_the_rail_plan_by_the_nic_legend_s_names_and_the_ports_state() -> None:
    topology = nvidia_topo(A100X4_TOPO.read_text())  # legend: NIC0 mlx5_0, NIC1 mlx5_1
    assert fabric.rail_findings({"GPU0": "mlx5_0", "GPU1": "NIC1"}, topology, []) == []
    crossed = fabric.rail_findings({"GPU0": "mlx5_1"}, topology, [])
    assert [f.text for f in crossed] == [
        "GPU0: rail mlx5_1 is SYS from it, expected the nearest NIC: mlx5_0 (PXB) (rdma_rails)"]
    down = [{"device": "mlx5_0", "port": 1, "state": "DOWN"}]
    found = fabric.rail_findings({"GPU0": "mlx5_0"}, topology, down)
    assert [(f.text, f.kind) for f in found] == [
        ("GPU0: rail mlx5_0 has no ACTIVE port (rdma_rails)", "hardware")]


# ---- the variables ----------------------------------------------------------------------

def _host(tmp_path: Path, extra: str, gpus: int = 8) -> Node:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    n1:\n      ansible_host: 10.9.0.11\n" + extra)
    host = load_inventory(path).select("all")[0]
    facts = Facts("n1", {"gpus": _gpus(gpus), "rdma": _read(GPUD),
                         "interfaces": [{"name": "eth0", "addresses": ["10.9.0.11/16"]}]})
    return Node(host, ConnectOptions(), facts)


@pytest.mark.parametrize(("extra", "message"), [
    ("rdma_port_count: 0", "variable rdma_port_count must be an integer of at least 1"),
    ("rdma_port_count: eight", "variable rdma_port_count must be an integer"),
    ("rdma_port_rate_gbps: -400", "variable rdma_port_rate_gbps must be a number of Gb/s"),
    ("rdma_port_width: x4", "variable rdma_port_width must be a width such as 1X"),
    ("rdma_port_link_layer: IB", "variable rdma_port_link_layer must be InfiniBand or "
                                 "Ethernet"),
    ("rdma_port_pkey: ffff", "variable rdma_port_pkey must be a partition key"),
    ("rdma_port_pkey: 0x1ffff", "variable rdma_port_pkey must be a partition key"),
    ("rdma_rails: {gpu0: mlx5_0}", "variable rdma_rails must be a mapping of GPU<n>"),
    ("rdma_rails: [mlx5_0]", "variable rdma_rails must be a mapping"),
    ("rdma_sys_root: relative", "variable rdma_sys_root must be an absolute path"),
])
def test_bad_values_are_refused_naming_host_and_key(tmp_path: Path, extra: str,
                                                    message: str) -> None:
    node = _host(tmp_path, f"      {extra}\n")
    declaration = suite("fabric")
    with pytest.raises(VarError, match=message) as caught:
        v = declaration.vars(node.host)
        for key, var in declaration.variables.items():
            if v.get(key) is not None:
                v.checked(key, var.kind)
        assert declaration.check is not None
        declaration.check(v)
    assert "host n1" in str(caught.value) and "\n" not in str(caught.value)


def test_good_values_pass_and_read_typed(tmp_path: Path) -> None:
    node = _host(tmp_path, "      rdma_port_count: 8\n      rdma_port_rate_gbps: 400\n"
                 "      rdma_port_width: 4X\n      rdma_port_link_layer: InfiniBand\n"
                 "      rdma_port_pkey: 0xffff\n      rdma_rails: {GPU0: mlx5_0}\n")
    declaration = suite("fabric")
    assert declaration.check is not None
    declaration.check(declaration.vars(node.host))
    settings = node.typed(FabricSettings)
    assert settings.rdma_port_pkey == 65535 and pkey(settings.rdma_port_pkey) == "0xffff"
    decl = declared(settings, node.facts, _read(GPUD))
    assert decl.pkey == "0xffff" and decl.variable("pkey") == "rdma_port_pkey"


def test_a_stand_in_root_adds_its_own_fact(tmp_path: Path) -> None:
    declaration = suite("fabric")
    assert declaration.facts is not None
    plain = _host(tmp_path, "")
    assert declaration.facts(plain.host).custom == frozenset()
    stand_in = _host(tmp_path, "      rdma_sys_root: /var/lib/x\n")
    (fact,) = declaration.facts(stand_in.host).custom
    assert fact.name == STAND_IN and "for d in /var/lib/x/class/infiniband/*;" in fact.shell


# ---- the line-rate gate -----------------------------------------------------------------

def _sample(root: Path) -> Sample:
    """The counter sample's own rdma read (grep -H over the tree), parsed."""
    out = subprocess.run(["sh", "-c", "cd class/infiniband && grep -H . */ports/*/rate "
                          "*/ports/*/state */ports/*/counters/* */ports/*/hw_counters/* "
                          "2>/dev/null; true"], cwd=root, capture_output=True, text=True,
                         check=True)
    return parse_sample({"rdma": script.Section("rdma", 0, out.stdout)}, "", 0.0)


def _run(busbw: float) -> ProbeRun:
    result = {"event": "result", "size": 1 << 30, "busbw": busbw, "world_size": 16,
              "wrong": 0, "backend": "gloo"}
    return ProbeRun(["n1", "n2"], {"n1": NodeOutput(0, [result], ""),
                                   "n2": NodeOutput(0, [], "")}, duration=3.0)


def test_the_gate_of_a_healthy_h100_node_is_its_declared_ports(tmp_path: Path) -> None:
    rate = line_rate(_host(tmp_path, ""), _sample(GPUD))
    assert (rate.gbps, rate.short) == (3200.0, ())
    assert rate.nics == f"8 x 400 Gb/s declared (rdma_port_rate_gbps, the default for 8x {H100})"


def test_a_port_trained_down_keeps_the_bar_and_fails_the_gate(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _port_file(root, "mlx5_5/1", "rate").write_text("200 Gb/sec (4X HDR)\n")
    node = _host(tmp_path, "      rdma_port_rate_gbps: 400\n")
    trained = line_rate(node, _sample(root))
    assert trained == LineRate("n1", 3200.0, "8 x 400 Gb/s declared (rdma_port_rate_gbps)",
                               ("mlx5_5/1 at 200 Gb/s",))
    undeclared = line_rate(_host(tmp_path, "", gpus=1), _sample(root))
    assert undeclared.gbps == 3000.0 + 200.0 and undeclared.short == ()  # the old bar
    healthy = LineRate("n2", 3200.0, "8 x 400 Gb/s declared (rdma_port_rate_gbps)")
    rates = {"n1": trained, "n2": healthy}
    fast = _run(380.0)  # 0.95 of 3200 Gb/s: the share alone would pass
    assert line_rate_share(fast, rates) == (0.95, trained)
    assert problem(fast, node, 2, rates) == (
        "n1: mlx5_5/1 at 200 Gb/s, under the declared line rate (8 x 400 Gb/s declared "
        "(rdma_port_rate_gbps))")
    assert problem(fast, node, 1, rates) is None  # one node: no NIC in the path
    assert problem(fast, node, 2, {"n1": healthy, "n2": healthy}) is None


def test_the_gate_names_ports_down_missing_or_unknown() -> None:
    ports = [Port("mlx5_0/1", rate_gbps=400.0, state="ACTIVE", rdma=True),
             Port("mlx5_1/1", rate_gbps=400.0, state="DOWN", rdma=True),
             Port("mlx5_2/1", state="ACTIVE", rdma=True)]
    rate = declared_line_rate("n1", ports, 400.0, 8, "rdma_port_rate_gbps")
    assert rate.gbps == 3200.0
    assert rate.short == ("mlx5_1/1 DOWN", "mlx5_2/1 rate unknown", "2 of 8 ports ACTIVE")
    assert declared_line_rate("n1", ports[:1], 400.0, None, "v").gbps == 400.0
    assert trained_down(_run(1.0), {"n1": rate}) is not None
    assert trained_down(_run(1.0), {}) is None


def test_the_gate_leaves_out_ports_of_another_link_layer(tmp_path: Path) -> None:
    node = _host(tmp_path, "      rdma_port_link_layer: InfiniBand\n"
                 "      rdma_port_rate_gbps: 400\n      rdma_port_count: 8\n", gpus=1)
    rate = line_rate(node, _sample(GPUD))  # the RoCE bond at 200 Gb/s is not a rail
    assert (rate.gbps, rate.short) == (3200.0, ())
    line = _host(tmp_path, "      nic_line_rate_gbps: 1000\n      rdma_port_rate_gbps: 400\n")
    assert line_rate(line, _sample(GPUD)).gbps == 1000.0  # an explicit line rate wins
