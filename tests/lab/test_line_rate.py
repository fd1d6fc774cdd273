"""Line rate and the NIC's counters on the session lab's provisioned nodes: a clean lab of
four passes the line-rate gate (its veths report 10 Gb/s) and every counter check of the
reachability and allreduce suites; then, of three nodes, node03's link is throttled to
20 Mbit/s (``tc tbf``) and the multi-node AllReduce fails on its share of the line rate,
searched to node03; then, of node03 and node04, node04's link loses 5% of its large TCP
segments (nftables, ``numgen random``: this kernel has no sch_netem) and node04 alone fails
its counter check on the TCP retransmits that loss caused."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.lab.conftest import PROVISIONED, node_sh
from tests.lab.test_provision import override

# Small sizes, one timed all-reduce each, and no absolute threshold across nodes: the
# line-rate gate is what fails.
FAST = {"allreduce_sizes": "64K,1M", "allreduce_iters": 1, "allreduce_timeout_s": 60,
        "allreduce_bisect_timeout_s": 30, "allreduce_busbw_thresholds": {"cpu": {1: 0.01, 2: 0}}}


def _run(inventory: Path, tmp_path: Path, name: str, suites: str, limit: str = PROVISIONED
         ) -> tuple[int, dict[tuple[str, str], dict[str, Any]], dict[str, Any]]:
    report = tmp_path / f"{name}.json"
    with override(inventory, "group_vars", "lab", FAST):
        code = app.conformance_cmd(str(inventory), limit=limit, suites=suites,
                                   json_path=str(report))
    doc = json.loads(report.read_text())
    return code, {(r["host"], r["check"].removeprefix("test_")): r
                  for r in doc["results"]}, doc["data"]


@pytest.fixture
def throttled(lab: Lab) -> Iterator[None]:
    node_sh(lab, "node03", "tc qdisc add dev eth0 root tbf rate 20mbit burst 32kbit "
                           "latency 400ms")
    try:
        yield
    finally:
        node_sh(lab, "node03", "tc qdisc del dev eth0 root", check=False)


def _nft(*args: str, check: bool = True) -> None:
    subprocess.run(["nft", *args], check=check, capture_output=True, text=True)


@pytest.fixture
def lossy(lab: Lab) -> Iterator[None]:
    """5% of node04's large TCP segments lost on its link, past its own stack (the netdev
    ingress of its veth's bridge end): node04's TCP retransmits them. A drop inside the
    node's own output path would be a local error that TCP sends again uncounted."""
    table = f"{lab.config.name}loss"
    veth = lab.node("node04").veth
    _nft("add", "table", "netdev", table)
    try:
        _nft("add", "chain", "netdev", table, "in", f"{{ type filter hook ingress device "
             f'"{veth}" priority 0; policy accept; }}')
        _nft("add", "rule", "netdev", table, "in", "meta", "l4proto", "tcp", "meta", "length",
             "gt", "1000", "numgen", "random", "mod", "100", "lt", "5", "drop")
        yield
    finally:
        _nft("delete", "table", "netdev", table, check=False)


def test_a_clean_lab_passes_the_line_rate_and_every_counter(provisioned: Path,
                                                            tmp_path: Path) -> None:
    code, results, data = _run(provisioned, tmp_path, "clean", "reachability,allreduce")
    outcomes = {k: r["outcome"] for k, r in results.items()}
    assert code == 0, {k: r.get("message") for k, r in results.items() if r["outcome"] != "pass"}
    for node in PROVISIONED.split(":"):
        assert outcomes[(node, "nic_counters_during_allreduce")] == "pass"
        assert outcomes[(node, "nic_counters_during_reachability")] == "pass"
    together = results[("fleet", "all_nodes_together")]["properties"]
    assert together["line_rate_gbps"] == 10
    assert together["line_rate_nics"].endswith(": eth0 10 Gb/s")
    assert together["line_rate_fraction"] >= 0.004
    hierarchy = data["allreduce"]["hierarchy"]
    assert set(hierarchy["counters"]) == {"pairs", "all"}
    node01 = hierarchy["counters"]["all"]["node01"]
    assert node01["fabric_ports"] == ["eth0"] and node01["tcp_segments_sent"] > 0
    assert set(data["reachability"]["counters"]) == set(PROVISIONED.split(":"))


def test_a_throttled_link_fails_the_line_rate_on_its_node(provisioned: Path, throttled: None,
                                                          tmp_path: Path) -> None:
    code, results, _ = _run(provisioned, tmp_path, "throttled", "allreduce",
                            "node01:node02:node03")
    assert code == 1
    message = results[("fleet", "all_nodes_together")]["message"]
    assert message.startswith("3-node AllReduce failed: busbw "), message
    assert "of the slowest line rate" in message and "allreduce_min_line_rate_fraction" in message
    assert "node node03: fails with every partner" in message, message
    assert "node node01" not in message and "node node02" not in message, message


def test_lost_segments_fail_the_counters_of_the_lossy_node(provisioned: Path, lossy: None,
                                                           tmp_path: Path) -> None:
    code, results, _ = _run(provisioned, tmp_path, "lossy", "allreduce", "node03:node04")
    assert code == 1
    check = results[("node04", "nic_counters_during_allreduce")]
    assert check["outcome"] == "fail"
    assert check["message"].startswith("node04: TCP retransmitted "), check["message"]
    assert "net_max_retransmit_ratio 0.01" in check["message"]
    for node in ("node03",):
        assert results[(node, "nic_counters_during_allreduce")]["outcome"] == "pass", (
            results[(node, "nic_counters_during_allreduce")].get("message"))
