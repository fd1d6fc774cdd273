"""The NIC counters and the line rate: real captured ``ethtool -S`` of five NIC families and
real RDMA port counters (tests/fixtures/nic, sources in its README) parsed and classified,
deltas judged against their bounds, the line rate of socket and RDMA nodes, the AllReduce's
line-rate gate, and the sample script run on this machine."""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpufleet.conformance.launch import NodeOutput, ProbeRun
from gpufleet.conformance.measure.allreduce import line_rate_share, problem
from gpufleet.conformance.nic_counters import (
    Bounds,
    LineRate,
    NodeCounters,
    Port,
    Sample,
    attribute,
    delta,
    deltas,
    ethtool_sections,
    kind,
    line_rate,
    owners,
    parse_sample,
    probe_paths,
    reached_at,
    resolve,
    sample_command,
    slow_run_note,
)
from gpufleet.conformance.nic_counters import Path as CountedPath
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.facts import script
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers import network
from gpufleet.inventory.load import load_inventory
from gpufleet.suites.probes import probe_common
from tests.conftest import ROOT, stand_in

FIXTURES = ROOT / "tests" / "fixtures" / "nic"
ETHTOOL = sorted(FIXTURES.glob("*-ethtool-S*.txt"))
RDMA = sorted(FIXTURES.glob("ib-port-counters-*.txt"))
BOUNDS = Bounds(max_drops=100, max_errors=0, max_retransmit_ratio=0.01)


def _node(tmp_path: Path, extra: str = "", gpus: bool = False,
          rdma: list[dict[str, object]] | None = None) -> Node:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    n1:\n      ansible_host: 10.9.0.11\n"
                    "      allreduce_min_line_rate_fraction: 0.7\n" + extra)
    host = load_inventory(path).select("all")[0]
    values: dict[str, object] = {"interfaces": [
        {"name": "eth0", "mtu": 1500, "addresses": ["10.9.0.11/16"]}]}
    if gpus:
        values["gpus"] = [{"name": "NVIDIA H200"}]
    if rdma is not None:
        values["rdma"] = rdma
    return Node(host, ConnectOptions(), Facts("n1", values))


def _sample(ports: dict[str, Port], retrans: int = 0, out: int = 1000,
            taken: float = 0.0) -> Sample:
    return Sample(ports, {"RetransSegs": retrans, "OutSegs": out}, taken)


@pytest.mark.parametrize("path", ETHTOOL, ids=[p.name for p in ETHTOOL])
def test_every_captured_ethtool_output_parses_and_has_trouble_counters(path: Path) -> None:
    stats = network.ethtool_stats(path.read_text())
    kinds = {k[0] for name in stats if (k := kind(name))}
    assert len(stats) > 90
    assert {"drops", "pause"} <= kinds


@pytest.mark.parametrize(("counter", "expected"), [
    ("rx_discards_phy", ("drops", None)),          # mlx5: the port ran out of buffer
    ("rx_out_of_buffer", ("drops", None)),         # mlx5: no receive descriptor
    ("rx_crc_errors_phy", ("errors", None)),
    ("rx_symbol_err_phy", ("errors", None)),
    ("rx_pci_signal_integrity", ("errors", None)),
    ("tx_pause_ctrl_phy", ("pause", None)),
    ("rx_prio3_pause", ("pause", 3)),
    ("rx_priority_3_xoff.nic", ("pause", 3)),       # ice
    ("port.tx_priority_5_xoff_tx", ("pause", 5)),   # i40e
    ("rx_pfc_ena_frames_pri3", ("pause", 3)),       # bnxt_en
    ("rx_dropped.nic", ("drops", None)),
    ("statistics/rx_missed_errors", ("drops", None)),
    ("statistics/rx_fifo_errors", ("drops", None)),
    ("statistics/rx_crc_errors", ("errors", None)),
    ("counters/port_xmit_discards", ("drops", None)),
    ("counters/symbol_error", ("errors", None)),
    ("counters/link_downed", ("errors", None)),
    ("hw_counters/out_of_buffer", ("drops", None)),
    ("hw_counters/np_cnp_sent", ("ecn", None)),
    ("hw_counters/np_ecn_marked_roce_packets", ("ecn", None)),
    ("hw_counters/out_of_sequence", ("retransmits", None)),
    ("hw_counters/local_ack_timeout_err", ("retransmits", None)),
])
def test_counters_are_classified_by_what_they_count(counter: str,
                                                    expected: tuple[str, int | None]) -> None:
    assert kind(counter) == expected


@pytest.mark.parametrize("counter", [
    "[0]: rx_discards",            # bnxt_en: one ring's share of rx_total_ring_discards
    "rx_queue_0_drops",            # one queue (ice, veth)
    "tx-0.tx_packets",             # i40e
    "rx0_xdp_drop",                # mlx5 channel 0, and XDP's own drops
    "rx_corrected_bits_phy",       # FEC at work, not trouble
    "rx_discard_bytes_cos3",       # the bytes beside rx_discard_packets_cos3
    "rx_global_pause_duration",
    "hw_counters/req_cqe_flush_error",   # queue pairs torn down at the end of a job
    "counters/VL15_dropped",       # subnet management
    "rx_packets",
    "counters/port_rcv_data",
])
def test_queues_totals_and_harmless_counters_are_not_trouble(counter: str) -> None:
    assert kind(counter) is None


def _rdma_section(path: Path) -> script.Section:
    return script.Section("rdma", 0, path.read_text())


@pytest.mark.parametrize("path", RDMA, ids=[p.name for p in RDMA])
def test_captured_rdma_port_counters_parse(path: Path) -> None:
    sample = parse_sample({"rdma": _rdma_section(path)}, "", 0.0)
    ports = [p for p in sample.ports.values() if p.rdma]
    assert ports and all(p.counters["counters/port_rcv_errors"] >= 0 for p in ports)
    assert all("counters/symbol_error" in p.counters for p in ports)


def test_the_h100_node_s_ndr_port_reads_its_rate_state_and_hw_counters() -> None:
    sample = parse_sample({"rdma": _rdma_section(
        FIXTURES / "ib-port-counters-mlx5_0-gpud-h100.txt")}, "", 0.0)
    port = sample.ports["mlx5_0/1"]
    assert (port.rate_gbps, port.state) == (400.0, "ACTIVE")
    assert port.counters["counters/excessive_buffer_overrun_errors"] == 15
    assert "hw_counters/out_of_sequence" in port.counters


def test_a_saturated_legacy_counter_reads_as_its_value() -> None:
    sample = parse_sample({"rdma": _rdma_section(FIXTURES / "ib-port-counters-mlx5_1.txt")},
                          "", 0.0)
    assert sample.ports["mlx5_1/1"].counters["counters/port_xmit_wait"] == 4294967295


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_ethtool_output_is_split_per_interface_and_joined_to_sysfs() -> None:
    nonce = "abc"
    mlx5 = (FIXTURES / "mlx5-ethtool-S.txt").read_text()
    sections = {
        "net": script.Section("net", 0, "eth1/speed:100000\neth1/operstate:up\n"
                                        "eth1/statistics/rx_dropped:12\nlo/speed:-1\n"
                                        "eth2/speed:-1\neth2/statistics/rx_dropped:0\n"),
        "ethtool": script.Section("ethtool", 0, f"@@if-{nonce} eth1 {_b64(mlx5)}\n"
                                                f"@@if-{nonce} eth2 "
                                                f"{_b64('no stats available')}\n"),
        "snmp": script.Section("snmp", 0, "Tcp: RetransSegs OutSegs\nTcp: 3 900\n"),
    }
    sample = parse_sample(sections, nonce, 1.0)
    eth1 = sample.ports["eth1"]
    assert (eth1.rate_gbps, eth1.state) == (100.0, "up")
    assert eth1.counters["statistics/rx_dropped"] == 12
    assert eth1.counters["ethtool/rx_discards_phy"] == network.ethtool_stats(mlx5)[
        "rx_discards_phy"]
    assert sample.ports["eth2"].rate_gbps is None and "lo" not in sample.ports
    assert sample.tcp == {"RetransSegs": 3, "OutSegs": 900}
    assert sample.unknown == ("ethtool -S eth2: no stats available",)


def test_deltas_name_the_port_the_counter_and_the_bound(tmp_path: Path) -> None:
    node = _node(tmp_path)
    before = _sample({"eth0": Port("eth0", {"statistics/rx_dropped": 10,
                                            "ethtool/rx_crc_errors_phy": 0,
                                            "ethtool/rx_prio3_pause": 5}),
                      "docker0": Port("docker0", {"statistics/tx_dropped": 0})})
    after = _sample({"eth0": Port("eth0", {"statistics/rx_dropped": 18352,
                                           "ethtool/rx_crc_errors_phy": 2,
                                           "ethtool/rx_prio3_pause": 905}),
                     "docker0": Port("docker0", {"statistics/tx_dropped": 5000})},
                    taken=12.0)
    counters = delta(node, before, after)
    assert counters.fabric == frozenset({"eth0"}) and counters.seconds == 12.0
    assert counters.problems(BOUNDS) == [
        "18,342 drops on eth0 (statistics/rx_dropped) (nic_max_drops 100)",
        "2 errors on eth0 (ethtool/rx_crc_errors_phy) (nic_max_errors 0)"]
    assert slow_run_note({"n1": counters}) == (
        "; counters during the run: n1: 18,342 drops on eth0 (statistics/rx_dropped), "
        "5,000 drops on docker0 (statistics/tx_dropped), 900 pause on priority 3 on eth0 "
        "(ethtool/rx_prio3_pause)")
    assert delta(node, before, before).problems(BOUNDS) == []


def _nodes(tmp_path: Path, hostname: str = "") -> dict[str, Node]:
    """node01-node04 at 10.9.0.1-4 (node04 at ``hostname`` when given)."""
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n" + "".join(
        f"    node0{i}:\n      ansible_host: {hostname if hostname and i == 4 else f'10.9.0.{i}'}\n"
        for i in range(1, 5)))
    return {h.name: Node(h, ConnectOptions(), Facts(h.name, {"interfaces": [
        {"name": "eth0", "mtu": 1500, "addresses": [f"10.9.0.{h.name[-1]}/16"]},
        {"name": "docker0", "mtu": 1500, "addresses": ["172.17.0.1/16"]}]}))
        for h in load_inventory(path).select("all")}


def _phase(nodes: dict[str, Node], sent: dict[str, tuple[int, int]],
           paths: list[tuple[str, str, int, int]]) -> dict[str, NodeCounters]:
    """Every node's counters over one phase: its TCP totals (retransmitted, sent) and the
    paths its connections counted."""
    before = {n: _sample({"eth0": Port("eth0")}, 0, 0) for n in nodes}
    after = {n: _sample({"eth0": Port("eth0")}, *sent.get(n, (0, 20_000))) for n in nodes}
    by_source: dict[str, list[CountedPath]] = {n: [] for n in nodes}
    for source, target, retransmits, segments in paths:
        by_source[source].append(CountedPath(source, target, retransmits, segments))
    return deltas(nodes, before, after, by_source)


RATIOS = {f"node0{i}": 0.01 for i in range(1, 5)}


def test_loss_on_one_node_s_receive_path_names_that_node_not_its_senders(tmp_path: Path
                                                                         ) -> None:
    # 3% of the segments arriving at node04 are lost: node01 and node03, the nodes that
    # send to it, retransmit (3.1% and 2.5% of their segments), node04 hardly at all.
    nodes = _nodes(tmp_path)
    pairs = _phase(nodes, {"node03": (250, 10_000)},
                   [("node01", "node02", 0, 10_000), ("node02", "node01", 0, 10_000),
                    ("node03", "node04", 250, 10_000), ("node04", "node03", 0, 10_000)])
    together = _phase(nodes, {"node01": (310, 10_000), "node03": (250, 10_000)},
                      [("node01", "node02", 0, 5_000), ("node01", "node04", 310, 5_000),
                       ("node02", "node01", 0, 5_000), ("node02", "node03", 0, 5_000),
                       ("node03", "node02", 0, 5_000), ("node03", "node04", 250, 5_000),
                       ("node04", "node03", 1, 5_000), ("node04", "node01", 0, 5_000)])
    attribute([pairs, together], RATIOS)
    for name in ("node01", "node02", "node03"):
        assert together[name].problems(BOUNDS) == [], name
        assert pairs[name].problems(BOUNDS) == [], name
    assert together["node04"].problems(BOUNDS) == [
        "TCP retransmitted 560 of 10,000 segments sent on node01 -> node04, node03 -> node04 "
        "(5.6%; net_max_retransmit_ratio 0.01): node04 is common to the lossy paths"]
    assert pairs["node04"].problems(BOUNDS)[0].startswith(
        "TCP retransmitted 250 of 10,000 segments sent on node03 -> node04 (2.5%")
    assert together["node01"].to_dict()["paths"][1] == {
        "target": "node04", "retransmits": 310, "segments": 5_000}


def test_loss_on_one_node_s_send_path_names_that_node(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path)
    together = _phase(nodes, {"node04": (600, 10_000)},
                      [("node04", "node03", 300, 5_000), ("node04", "node01", 300, 5_000),
                       ("node01", "node04", 0, 5_000), ("node03", "node04", 0, 5_000)])
    attribute([together], RATIOS)
    assert [n for n, c in together.items() if c.problems(BOUNDS)] == ["node04"]


def test_one_lossy_path_names_both_its_ends_and_a_quiet_one_names_none(tmp_path: Path
                                                                       ) -> None:
    nodes = _nodes(tmp_path)
    lossy = _phase(nodes, {}, [("node01", "node02", 300, 10_000),
                               ("node02", "node01", 0, 10_000),
                               ("node03", "node04", 9, 100)])  # 9: under the floor of 10
    attribute([lossy], RATIOS)
    assert lossy["node01"].problems(BOUNDS) == lossy["node02"].problems(BOUNDS) == [
        "TCP retransmitted 300 of 10,000 segments sent on node01 -> node02 (3.0%; "
        "net_max_retransmit_ratio 0.01): the only lossy path of both ends: either may lose"]
    assert lossy["node03"].problems(BOUNDS) == lossy["node04"].problems(BOUNDS) == []


# A lab run of four nodes, 5% of the large segments arriving at node04 dropped: gloo's ring
# of the four sends node01 -> node04 only, and of the pairs (node01+node02, node03+node04)
# only node03 sends to node04. Light paths (a few hundred segments) carry the other ranks'
# small messages; a clean path retransmits a segment or two (a tail-loss probe).
RING = [("node01", "node02", 0, 516), ("node01", "node03", 0, 23),
        ("node02", "node01", 2, 5_885), ("node02", "node03", 0, 503),
        ("node03", "node01", 0, 96), ("node03", "node02", 2, 5_851),
        ("node04", "node01", 2, 648), ("node04", "node02", 0, 34),
        ("node04", "node03", 2, 5_835)]


def _lossy(counters: dict[str, NodeCounters]) -> dict[str, list[str]]:
    return {n: c.problems(BOUNDS) for n, c in counters.items() if c.problems(BOUNDS)}


def test_a_receiver_common_to_retransmitting_paths_is_named_not_its_one_lossy_sender(
        tmp_path: Path) -> None:
    # The failed CI run: node01 -> node04 alone crossed the ratio (251 of 6,036, 4.2%);
    # node03 -> node04 of the pairs lost one burst (41 of 5,912, 0.69%) and the light paths
    # into node04 a few, all under it. node01's other paths out retransmitted one segment
    # of 6,387: the paths into node04 point at node04, node01 is not blamed.
    nodes = _nodes(tmp_path)
    pairs = _phase(nodes, {}, [("node01", "node02", 1, 5_848), ("node02", "node01", 2, 5_785),
                               ("node03", "node04", 41, 5_912), ("node04", "node03", 0, 5_790)])
    together = _phase(nodes, {}, [*RING, ("node01", "node04", 251, 6_036),
                                  ("node02", "node04", 1, 25), ("node03", "node04", 2, 506)])
    attribute([pairs, together], RATIOS)
    assert _lossy(pairs) == {}
    assert _lossy(together) == {"node04": [
        "TCP retransmitted 251 of 6,036 segments sent on node01 -> node04 (4.2%; "
        "net_max_retransmit_ratio 0.01): node04 is common to the retransmitting paths "
        "(node04's other paths in retransmitted 44 of 6,443 segments, node01's other paths "
        "out retransmitted 1 of 6,387 segments)"]}


def test_a_sender_retransmitting_on_every_path_out_is_named_not_its_receiver(
        tmp_path: Path) -> None:
    # node01 loses 4% of what it sends: node01 -> node04 crossed the ratio, node01 ->
    # node02 of the pairs stayed under it (48 of 5,848); node04's other paths in are clean.
    nodes = _nodes(tmp_path)
    pairs = _phase(nodes, {}, [("node01", "node02", 48, 5_848), ("node02", "node01", 2, 5_785),
                               ("node03", "node04", 1, 5_912), ("node04", "node03", 0, 5_790)])
    together = _phase(nodes, {}, [*RING, ("node01", "node04", 251, 6_036),
                                  ("node02", "node04", 0, 25), ("node03", "node04", 2, 506)])
    attribute([pairs, together], RATIOS)
    assert _lossy(together) == {"node01": [
        "TCP retransmitted 251 of 6,036 segments sent on node01 -> node04 (4.2%; "
        "net_max_retransmit_ratio 0.01): node01 is common to the retransmitting paths "
        "(node01's other paths out retransmitted 48 of 6,387 segments, node04's other paths "
        "in retransmitted 3 of 6,443 segments)"]}


def test_too_few_retransmits_elsewhere_tell_neither_end_of_a_lossy_path(tmp_path: Path
                                                                        ) -> None:
    # A lab run whose pairs timed out (their probes printed no per-connection counts):
    # besides node01 -> node04 (469 of 6,238), the paths into node04 retransmitted 2 of 531
    # segments and node01's other paths out 0 of 539: a clean path's tail-loss probes, not
    # evidence. Both ends are named.
    nodes = _nodes(tmp_path)
    pairs = deltas(nodes, {n: _sample({"eth0": Port("eth0")}, 0, 0) for n in nodes},
                   {n: _sample({"eth0": Port("eth0")}, 3, 5_800) for n in nodes})
    together = _phase(nodes, {}, [*RING, ("node01", "node04", 469, 6_238),
                                  ("node02", "node04", 0, 25), ("node03", "node04", 2, 506)])
    attribute([pairs, together], RATIOS)
    both = ("TCP retransmitted 469 of 6,238 segments sent on node01 -> node04 (7.5%; "
            "net_max_retransmit_ratio 0.01): the only lossy path of both ends: either may lose")
    assert _lossy(together) == {"node01": [both], "node04": [both]}
    # a few tail-loss probes on light paths against a clean heavy side: still too few
    light = _phase(nodes, {}, [("node01", "node04", 251, 6_036), ("node01", "node02", 0, 6_387),
                               ("node02", "node04", 4, 25), ("node03", "node04", 5, 506)])
    attribute([light], RATIOS)
    assert set(_lossy(light)) == {"node01", "node04"}
    # more retransmits elsewhere, but at the same rate on both sides: chance explains them
    even = _phase(nodes, {}, [("node01", "node04", 251, 6_036), ("node01", "node02", 9, 6_000),
                              ("node03", "node04", 14, 6_000)])
    attribute([even], RATIOS)
    assert set(_lossy(even)) == {"node01", "node04"}


def test_node_totals_alone_blame_no_sender(tmp_path: Path) -> None:
    # Retransmits no connection of the measurement accounts for (connects to a filtered
    # port, the controller's SSH) fail no one, and a node that reported no per-connection
    # counts says so.
    nodes = _nodes(tmp_path)
    counters = deltas(nodes, {n: _sample({"eth0": Port("eth0")}, 0, 0) for n in nodes},
                      {n: _sample({"eth0": Port("eth0")}, 1_500, 10_000) for n in nodes},
                      {"node01": [], "node02": [], "node03": []})
    attribute([counters], RATIOS)
    assert all(c.problems(BOUNDS) == [] for c in counters.values())
    assert counters["node04"].notes == [
        "TCP retransmits not laid on paths: the measurement reported no per-connection "
        "counts from this node"]
    assert counters["node01"].to_dict()["tcp_retransmits"] == 1_500


def test_a_probe_s_tcp_lines_become_paths_between_nodes(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path)
    held = owners(nodes.values())
    assert "172.17.0.1" not in held and held["10.9.0.4"] == "node04"
    events = {"node01": [{"event": "phase", "phase": "done"},
                         {"event": "tcp", "rank": 0, "peers": {
                             "10.9.0.4": [31, 1000], "10.9.0.2": [0, 1000],
                             "10.9.0.1": [0, 5], "192.0.2.9": [7, 7]}},
                         {"event": "tcp", "rank": 1, "peers": {"10.9.0.4": [1, 500]}}],
              "node02": [{"event": "tcp", "rank": 0, "peers": {"10.9.0.1": [-1, 5]}}],
              "node03": [{"event": "tcp", "rank": 0,
                          "peers": {f"10.8.{i // 256}.{i % 256}": [0, 1] for i in range(300)}}],
              "node04": [{"event": "tcp", "rank": 0, "peers": {"not an address": [0, 1]}}]}
    paths, bad = probe_paths(events, held)
    assert paths == {"node01": [CountedPath("node01", "node02", 0, 1000),
                                CountedPath("node01", "node04", 32, 1500)]}
    assert set(bad) == {"node02", "node03", "node04"}
    assert "at most 256 addresses" in bad["node03"]


@pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's ss is not installed")
def test_this_process_s_tcp_connections_are_counted_per_peer_as_ss_reads_them() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        client.sendall(b"x" * 300_000)  # more than the receiver's window: the probes resend
        server.recv(1 << 20)
        time.sleep(0.5)
        counts = probe_common.tcp_counts(client)
        ss = subprocess.run(["ss", "-tin", "src", f"127.0.0.1:{client.getsockname()[1]}"],
                            capture_output=True, text=True, timeout=30, check=True).stdout
        peers = probe_common.tcp_peers()
    finally:
        for sock in (client, server, listener):
            sock.close()
    sent = re.search(r"segs_out:(\d+)", ss)
    resent = re.search(r"retrans:\d+/(\d+)", ss)  # printed once a segment was resent
    assert sent is not None, ss
    assert counts == (int(resent[1]) if resent else 0, int(sent[1])), ss
    assert peers["127.0.0.1"][1] >= 2
    assert probe_common.tcp_peers(limit=0) == {}


def test_a_dns_named_node_s_fabric_port_is_found_from_the_address_it_was_reached_at(
        tmp_path: Path) -> None:
    node = _nodes(tmp_path, hostname="node04.fabric.invalid")["node04"]
    before = Sample({"eth0": Port("eth0", {"statistics/rx_dropped": 0})}, {}, 0.0,
                    reached=("10.9.0.4",))
    after = replace(before, ports={"eth0": Port("eth0", {"statistics/rx_dropped": 1_000_000})})
    counters = delta(node, before, after)
    assert counters.fabric == frozenset({"eth0"})
    assert counters.problems(BOUNDS) == [
        "1,000,000 drops on eth0 (statistics/rx_dropped) (nic_max_drops 100)"]
    assert line_rate(node, replace(after, ports={"eth0": Port("eth0", rate_gbps=25.0)})
                     ).nics == "eth0 25 Gb/s"
    lost = delta(node, replace(before, reached=()), replace(after, reached=()))
    assert lost.error == ("no interface holds the address it is reached at, "
                          "node04.fabric.invalid (not resolved): its fabric ports are unknown")


def test_the_address_a_node_was_reached_at_is_read_from_real_ssh_connection_values() -> None:
    lines = (FIXTURES / "ssh-connection.txt").read_text().splitlines()
    assert [reached_at(line) for line in lines] == [
        "172.25.34.11", "192.168.0.1", "10.11.99.1",
        "6a58:41de:9543:ec22:2692:f500:4768:861b", None]


@pytest.mark.parametrize("text", [
    "", "10.9.0.1 51234 $(reboot) 22", "10.9.0.1 51234 10.9.0.4", "x" * 200])
def test_a_value_that_is_not_four_fields_with_an_address_is_no_address(text: str) -> None:
    assert reached_at(text) is None


def test_a_link_local_address_loses_its_zone() -> None:
    assert reached_at("fe80::1%eth0 51234 fe80::4%eth0 22") == "fe80::4"


def test_a_name_is_resolved_on_the_controller_and_an_unknown_one_is_not() -> None:
    assert "127.0.0.1" in resolve("localhost")
    assert resolve("node04.fabric.invalid") == ()


def test_a_counter_that_went_back_is_noted_not_counted(tmp_path: Path) -> None:
    node = _node(tmp_path)
    counters = delta(node, _sample({"eth0": Port("eth0", {"statistics/rx_dropped": 500})}),
                     _sample({"eth0": Port("eth0", {"statistics/rx_dropped": 3})}))
    assert counters.deltas == [] and "went back from 500 to 3" in counters.notes[0]


def test_an_unreadable_sample_is_unknown(tmp_path: Path) -> None:
    counters = delta(_node(tmp_path), "the counter sample on n1 printed nothing readable",
                     _sample({}))
    assert counters.error == "the counter sample on n1 printed nothing readable"


def test_the_line_rate_of_a_socket_node_is_its_address_interface_s_speed(tmp_path: Path
                                                                         ) -> None:
    node = _node(tmp_path)
    sample = _sample({"eth0": Port("eth0", rate_gbps=25.0),
                      "eth1": Port("eth1", rate_gbps=100.0)})
    assert line_rate(node, sample) == LineRate("n1", 25.0, "eth0 25 Gb/s")
    unknown = line_rate(node, _sample({"eth0": Port("eth0")}))
    assert unknown.gbps is None and "declare nic_line_rate_gbps" in unknown.nics


def test_the_line_rate_of_an_rdma_gpu_node_sums_the_active_ports_nccl_uses(tmp_path: Path
                                                                          ) -> None:
    ports = {f"mlx5_{i}/1": Port(f"mlx5_{i}/1", rate_gbps=400.0, state="ACTIVE", rdma=True)
             for i in range(4)}
    ports["mlx5_4/1"] = Port("mlx5_4/1", rate_gbps=400.0, state="DOWN", rdma=True)
    ports["eth0"] = Port("eth0", rate_gbps=25.0)
    assert line_rate(_node(tmp_path, gpus=True), _sample(ports)).gbps == 1600.0
    only = _node(tmp_path, "      nccl_env: {NCCL_IB_HCA: 'mlx5_0,mlx5_1'}\n", gpus=True)
    assert line_rate(only, _sample(ports)) == LineRate(
        "n1", 800.0, "mlx5_0/1 400 Gb/s + mlx5_1/1 400 Gb/s")
    without = _node(tmp_path, "      nccl_env: {NCCL_IB_HCA: '^mlx5_0'}\n", gpus=True)
    assert line_rate(without, _sample(ports)).gbps == 1200.0
    socket = _node(tmp_path, "      allreduce_transport_inter: socket\n", gpus=True)
    assert line_rate(socket, _sample(ports)).gbps == 25.0
    declared = _node(tmp_path, "      nic_line_rate_gbps: 3200\n", gpus=True)
    assert line_rate(declared, "unreachable").gbps == 3200.0


def _run(busbw: float, world: int = 4) -> ProbeRun:
    result = {"event": "result", "size": 1048576, "busbw": busbw, "world_size": world,
              "wrong": 0, "backend": "gloo"}
    return ProbeRun(["n1", "n2"], {"n1": NodeOutput(0, [result], ""),
                                   "n2": NodeOutput(0, [], "")}, duration=3.0)


def test_a_multi_node_run_under_its_share_of_the_slowest_line_rate_fails(tmp_path: Path
                                                                         ) -> None:
    node = _node(tmp_path)
    rates = {"n1": LineRate("n1", 100.0, "eth0 100 Gb/s"),
             "n2": LineRate("n2", 25.0, "eth0 25 Gb/s")}
    assert line_rate_share(_run(2.5), rates) == (0.8, rates["n2"])
    assert problem(_run(2.5), node, 2, rates) is None
    assert problem(_run(1.5), node, 2, rates) == (
        "busbw 1.50 GB/s at 1048576 bytes is 0.480 of the slowest line rate (n2: eth0 "
        "25 Gb/s), under allreduce_min_line_rate_fraction 0.7")
    assert problem(_run(1.5), node, 1, rates) is None  # one node: no NIC in the path
    unknown = {**rates, "n2": LineRate("n2", None, "unknown: eth0 reports no link speed")}
    assert line_rate_share(_run(1.5), unknown) is None
    assert problem(_run(1.5), node, 2, unknown) is None


def test_the_sample_script_reads_this_machine(tmp_path: Path) -> None:
    nonce = script.new_nonce()
    quiet = {k: v for k, v in os.environ.items() if k != "SSH_CONNECTION"}
    out = subprocess.run(["sh", "-c", sample_command(nonce)], capture_output=True, text=True,
                         timeout=60, check=True, env=quiet).stdout
    sample = parse_sample(script.split(out, nonce), nonce, 0.0)
    assert {"RetransSegs", "OutSegs", "InSegs"} <= sample.tcp.keys()
    names = {p.name for p in Path("/sys/class/net").iterdir()} - {"lo"}
    assert set(sample.ports) >= {n for n in names if (Path("/sys/class/net") / n /
                                                      "statistics").is_dir()}
    assert all("statistics/rx_dropped" in sample.ports[n].counters for n in names
               if n in sample.ports)
    assert sample.reached == ()  # no SSH connection: the controller resolves the name
    over_ssh = subprocess.run(["sh", "-c", sample_command(nonce)], capture_output=True,
                              text=True, timeout=60, check=True,
                              env={**quiet, "SSH_CONNECTION": "10.9.0.1 51234 10.9.0.4 22"})
    assert parse_sample(script.split(over_ssh.stdout, nonce), nonce, 0.0).reached == (
        "10.9.0.4",)


def test_nothing_ethtool_prints_can_forge_another_interface_s_counters(tmp_path: Path) -> None:
    """A stand-in ethtool prints, for every interface, a frame for an interface of its own
    choosing and counters under it: the real sample script keeps each interface's output
    to itself, so no frame it prints becomes an interface."""
    nonce = script.new_nonce()
    stand_in(tmp_path, "ethtool", f"printf 'NIC statistics:\\n     rx_discards_phy: 5\\n"
             f"@@if-{nonce} victim0\\nNIC statistics:\\n     rx_discards_phy: 999999\\n'\n")
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env.pop("SSH_CONNECTION", None)
    out = subprocess.run(["sh", "-c", sample_command(nonce)], capture_output=True, text=True,
                         timeout=60, check=True, env=env).stdout
    ethtool = script.split(out, nonce)["ethtool"]
    names = {p.name for p in Path("/sys/class/net").iterdir()} - {"lo"}
    assert names, "this machine has no interface but lo"
    found = ethtool_sections(ethtool.text, nonce)
    assert set(found) == names
    assert all("999999" in text and "@@if-" in text for text in found.values())
