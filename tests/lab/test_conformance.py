"""Conformance on real lab nodes: gloo AllReduce across 2-4 nodes, reachability with a
firewall closing ports on one node, hang handling, and the JUnit/JSON reports."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.conformance.measure.allreduce import probe_args, run_allreduce
from gpufleet.conformance.measure.reachability import Matrix, probe_ports, run_matrix
from gpufleet.conformance.options import ConformanceOptions as SessionOptions
from gpufleet.conformance.session import ConformanceSession
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.fleet import FleetOptions
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from tests.junit_schema import check_junit
from tests.lab.conftest import PROVISIONED, node_processes, node_sh
from tests.lab.test_provision import run

PORTS = probe_ports(29500, 49152, 65535, 1)


@pytest.fixture
def session(provisioned: Path) -> Iterator[ConformanceSession]:
    inventory = load_inventory(provisioned)
    state = ConformanceSession.start(
        inventory, inventory.select(PROVISIONED), SessionOptions(
            pairs="all", fleet=FleetOptions(connect=ConnectOptions(known_hosts_base=provisioned))))
    yield state
    state.close()


def _probe_processes(lab: Lab) -> list[str]:
    """The AllReduce probe's processes left on the lab's nodes."""
    return [line for node in lab.nodes() for line in node_processes(lab, node.name)
            if "gpufleet-allreduce-" in line]


@pytest.mark.parametrize("count", [2, 3, 4])
def test_gloo_allreduce_across_nodes(session: ConformanceSession, lab: Lab,
                                     count: int) -> None:
    nodes = list(session.nodes.values())[:count]
    result = run_allreduce(nodes, probe_args(nodes[0]), 120)
    assert result.error() is None, result.error()
    summary = result.summary
    assert summary is not None
    world = 2 * count  # allreduce_cpu_procs: 2 in the lab's group_vars
    assert (summary["world_size"], summary["nodes"], summary["backend"]) == (world, count, "gloo")
    assert [r["size"] for r in result.results] == [64 * 1024, 1024**2, 8 * 1024**2]
    for row in result.results:
        assert row["wrong"] == 0
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * (world - 1) / world)
        assert row["busbw"] > 0
    assert result.leftovers == {}
    assert _probe_processes(lab) == []


def test_reachability_names_the_node_and_port_a_firewall_closes(
        lab: Lab, session: ConformanceSession, provisioned: Path) -> None:
    node_sh(lab, "node02", "nft insert rule inet gpufleet input tcp dport 29500 drop")
    try:
        matrix = run_matrix(session, PORTS, "all")
    finally:
        run(provisioned, "node02", role_names="firewall")
    assert matrix.failures_to("node02") == {
        29500: ["node01 (filtered)", "node03 (filtered)", "node04 (filtered)"]}
    for other in ("node01", "node03", "node04"):
        assert matrix.failures_to(other) == {}
    _assert_every_pair_probed(matrix, 4)


def _assert_every_pair_probed(matrix: Matrix, count: int) -> None:
    """Every source probed every fixed port of every target, except a port the target's
    own connections held when its listener started (a gloo or ssh connection's local port
    in the range), which its listener names."""
    targets = {t for _, t, _ in matrix.results}
    assert len(targets) == count
    for target in targets:
        probed = {p for s, t, p in matrix.results if t == target}
        skipped = set(PORTS) - probed
        if skipped:
            assert f"not probed: {sorted(skipped)}" in matrix.listeners[target]
        assert sum(1 for _, t, _ in matrix.results if t == target) == (count - 1) * len(probed)


def test_a_blocked_port_range_makes_allreduce_fail_cleanly_within_its_timeout(
        lab: Lab, session: ConformanceSession, provisioned: Path) -> None:
    node_sh(lab, "node03", "nft insert rule inet gpufleet input tcp dport 49152-65535 drop")
    nodes = list(session.nodes.values())
    try:
        matrix = run_matrix(session, PORTS, "ring")
        result = run_allreduce(nodes, probe_args(nodes[0]), 30)
    finally:
        run(provisioned, "node03", role_names="firewall")
    assert set(matrix.failures_to("node03")) == {49152, 57343, 65535}
    assert result.timed_out
    assert result.duration < 30 + 30
    error = result.error() or ""
    assert error.startswith("timed out after")
    assert "hung in rendezvous" in error or "hung in the first collective" in error
    assert result.leftovers == {}
    assert _probe_processes(lab) == []


def test_pairs_ring_and_sample_cover_every_node(session: ConformanceSession) -> None:
    ring = run_matrix(session, [29500], "ring")
    sample = run_matrix(session, [29500], "sample:1")
    for matrix in (ring, sample):
        assert isinstance(matrix, Matrix)
        sources = {s for s, _, _ in matrix.results}
        targets = {t for _, t, _ in matrix.results}
        assert sources == targets == {"node01", "node02", "node03", "node04"}
        assert set(matrix.results.values()) == {"open"}
    assert len(ring.results) == 8


def test_invoke_conformance_reports_junit_and_json(provisioned: Path, tmp_path: Path,
                                                  lab: Lab) -> None:
    junit, report = tmp_path / "conformance.xml", tmp_path / "conformance.json"
    code = app.conformance_cmd(str(provisioned), limit="node01:node02",
                               suites="stack,reachability,gpu,rdma",
                               junit_path=str(junit), json_path=str(report))
    assert code == 0
    doc = json.loads(report.read_text())
    assert doc["schema"] == "gpufleet.conformance/1"
    assert doc["hosts"]["node01"]["status"] == "PASS"
    checks = {(r["suite"], r["check"], r["host"]): r for r in doc["results"]}
    assert checks[("stack", "test_role_converged[driver]", "node01")]["outcome"] == "pass"
    assert checks[("stack", "test_role_converged[nccl]", "node01")]["outcome"] == "pass"
    gpu = checks[("gpu", "test_health", "node02")]
    assert (gpu["outcome"], gpu["message"]) == (
        "skip", "no NVIDIA GPU: nvidia-smi not found (no NVIDIA driver user space on this host)")
    assert checks[("rdma", "test_roce_qos", "node01")]["message"] == \
        "no RDMA devices (/sys/class/infiniband is empty)"
    matrix = doc["data"]["reachability"]["matrix"]["matrix"]
    assert matrix["node01"]["node02"]["29500"] == "open"
    counts = check_junit(junit)
    hosts = [h for h in doc["hosts"] if h != "fleet"]
    assert counts == {"tests": len(doc["results"]) + len(hosts), "errors": 0,
                      "failures": doc["summary"]["fail"], "skipped": doc["summary"]["skip"]}
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "gpufleet.conformance"
    names = {(c.get("classname"), c.get("name")) for c in suite.iter("testcase")}
    assert ("conformance.node01", "stack/role_converged[driver]") in names
    assert ("conformance.node02", "reachable") in names


def test_invoke_conformance_fails_when_a_check_fails(provisioned: Path, tmp_path: Path,
                                                    lab: Lab) -> None:
    node_sh(lab, "node01", "sysctl -qw net.ipv4.ip_local_port_range='32768 60999'")
    try:
        code = app.conformance_cmd(str(provisioned), limit="node01", suites="reachability",
                                   json_path=str(tmp_path / "r.json"))
    finally:
        run(provisioned, "node01", role_names="nccl_env")
    assert code == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    failed = [r for r in doc["results"] if r["outcome"] == "fail"]
    assert [(r["check"], r["host"]) for r in failed] == [
        ("test_ephemeral_ports_inside_the_open_range", "node01"),
        ("test_firewall_opens_every_ephemeral_port", "node01")]
    assert failed[0]["message"].startswith(
        "net.ipv4.ip_local_port_range is 32768-60999, outside the open range 49152-65535")
    assert failed[1]["message"] == (
        "net.ipv4.ip_local_port_range is 32768-60999 but the firewall "
        "(/etc/gpufleet/firewall.nft) opens only 22, 29500, 49152-65535: ephemeral ports "
        "32768-49151 are closed")
    assert app.conformance_cmd(str(provisioned), suites="nosuch") == 2
