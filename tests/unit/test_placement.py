"""Network placement's pieces: ping's summaries as iputils prints them (captured), the
source script run for real against loopback, and who is blamed for failing pairs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpufleet.conformance.checks.network import (
    PairResult,
    Placement,
    hop_failure,
    mtu_failure,
    rtt_failure,
)
from gpufleet.conformance.measure.network import (
    interface_mtu,
    parse_line,
    parse_ping,
    source_script,
)
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import Facts
from gpufleet.inventory.load import load_inventory
from tests.conftest import FIXTURES

PING = FIXTURES / "ping"


def test_ping_output_gives_counts_minimum_round_trip_and_the_spread() -> None:
    sent, received, rtt, jitter = parse_ping((PING / "loopback-10.txt").read_text())
    assert (sent, received, rtt) == (10, 10, 18.0)
    assert jitter == pytest.approx(31.0 - 18.0), "10th to 90th percentile: 0.036 left out"
    assert parse_ping((PING / "unreachable.txt").read_text()) == (0, 0, None, None)
    busybox = ("64 bytes from 10.0.0.2: seq=0 ttl=64 time=0.100 ms\n"
               "1 packets transmitted, 1 packets received, 0% packet loss")
    assert parse_ping(busybox) == (1, 1, 100.0, 0.0)


@pytest.mark.parametrize(("mtu", "fits"), [(1500, True), (70000, False)])
def test_the_source_script_measures_loopback_for_real(mtu: int, fits: bool) -> None:
    out = subprocess.run(["sh", "-c", source_script(["127.0.0.1"], mtu, 3)],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    [line] = out.splitlines()
    target, result = parse_line(line)
    assert (target, result.direct, result.mtu, result.mtu_ok) == ("127.0.0.1", True, mtu,
                                                                   fits)
    assert result.received == result.sent == 3 and result.rtt_min_us is not None


def test_targets_must_be_addresses() -> None:
    with pytest.raises(GpufleetError, match=r"not an IP address: '127\.0\.0\.1;reboot'"):
        source_script(["127.0.0.1;reboot"], 1500, 1)


def _ok(**changes: object) -> PairResult:
    values: dict[str, object] = {"direct": True, "mtu": 9000, "mtu_ok": True, "received": 5,
                                 "sent": 5, "rtt_min_us": 40.0, "jitter_us": 5.0}
    values.update(changes)
    return PairResult(**values)  # type: ignore[arg-type]


def _placement(bad: dict[tuple[str, str], PairResult]) -> Placement:
    names = ["node01", "node02", "node03", "node04"]
    return Placement({(s, t): bad.get((s, t), _ok()) for s in names for t in names if s != t})


def test_a_node_whose_every_path_fails_is_named_alone() -> None:
    routed = {p: _ok(direct=False) for p in [("node04", n) for n in ("node01", "node02",
                                                                      "node03")]
              + [(n, "node04") for n in ("node01", "node02", "node03")]}
    placement = _placement(routed)
    assert placement.failures("node04", hop_failure) == [
        "every measured path to and from node04: a routed hop (an echo with TTL 1 does not "
        "arrive)"]
    assert [placement.failures(n, hop_failure) for n in ("node01", "node02", "node03")] == [
        [], [], []]


def test_a_pair_that_fails_between_good_nodes_fails_both_ends() -> None:
    placement = _placement({("node01", "node02"): _ok(mtu_ok=False)})
    expected = ["node01 -> node02: path MTU below 9000 (a 9000-byte packet with "
                "don't-fragment does not arrive)"]
    assert placement.failures("node01", mtu_failure) == expected
    assert placement.failures("node02", mtu_failure) == expected
    assert placement.failures("node03", mtu_failure) == []


def test_round_trips_and_jitter_are_gated_and_silent_pairs_are_unknown() -> None:
    placement = _placement({("node03", "node01"): _ok(rtt_min_us=2500.0),
                            ("node03", "node02"): _ok(jitter_us=1800.0),
                            ("node02", "node04"): _ok(direct=False, mtu_ok=False,
                                                      received=0, rtt_min_us=None)})
    failing = rtt_failure(1000, 1000)
    assert placement.failures("node03", failing) == [
        "node03 -> node01: round trip 2500 µs (net_max_rtt_us 1000)",
        "node03 -> node02: jitter 1800 µs (net_max_jitter_us 1000)"]
    assert placement.failures("node04", hop_failure) == []
    assert placement.silent("node04") == ["node02 -> node04"]
    mute = _placement({p: _ok(direct=False, mtu_ok=False, received=0, rtt_min_us=None)
                       for p in [("node01", "node04"), ("node02", "node04"),
                                 ("node03", "node04"), ("node04", "node01"),
                                 ("node04", "node02"), ("node04", "node03")]})
    assert mute.silent("node04") == ["every path to and from node04"]
    assert mute.silent("node01") == []


def test_a_source_pings_its_targets_in_waves_and_answers_for_every_one() -> None:
    targets = [f"127.0.0.{i}" for i in range(1, 41)]
    script = source_script(targets, 1500, 1)
    assert "% 32)) -eq 0 ] && wait" in script
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert sorted(parse_line(line)[0] for line in out.splitlines()) == sorted(targets)


def test_a_dns_named_node_s_interface_mtu_is_found_by_the_address_its_name_resolves_to(
        tmp_path: Path) -> None:
    """``localhost`` resolves on the controller to 127.0.0.1, which the node's ``lo``
    holds; a name that resolves nowhere finds no interface (the check says unknown)."""
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    node01:\n      ansible_host: localhost\n"
                    "    node02:\n      ansible_host: node02.fabric.invalid\n")
    interfaces = [{"name": "lo", "mtu": 65536, "addresses": ["127.0.0.1/8", "::1/128"]}]
    nodes = {h.name: Node(h, ConnectOptions(), Facts(h.name, {"interfaces": interfaces}))
             for h in load_inventory(path).select("all")}
    assert interface_mtu(nodes["node01"]) == ("lo", 65536)
    assert interface_mtu(nodes["node02"]) is None
