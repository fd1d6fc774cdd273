"""The AllReduce hierarchy's pure parts: figures with significant digits, the pairs level,
topology domains, the search's run timeout and the verdict lines."""

from __future__ import annotations

from pathlib import Path

from gpufleet.conformance.grouptest import Fault, Trial
from gpufleet.conformance.launch import NodeOutput, ProbeRun
from gpufleet.conformance.measure.allreduce import (
    Verdict,
    describe_direction,
    disjoint_pairs,
    domain,
    figure,
    problem,
    trial_timeout,
)
from gpufleet.conformance.measure.reachability import Matrix
from gpufleet.conformance.session import Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.facts.gather import Facts
from gpufleet.inventory.load import load_inventory


def nodes(tmp_path: Path, count: int, extra: str = "") -> list[Node]:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  vars:\n    allreduce_timeout_s: 90\n"
                    "    allreduce_busbw_thresholds: {cpu: {1: 0.01, 2: 0.005}}\n"
                    f"{extra}  hosts:\n" + "".join(f"    n{i}:\n" for i in range(1, count + 1)))
    inv = load_inventory(path)
    return [Node(h, ConnectOptions(), Facts({}, {})) for h in inv.select("all")]


def run_with_busbw(busbw: float, world: int = 4) -> ProbeRun:
    result = {"event": "result", "size": 8388608, "busbw": busbw, "world_size": world,
              "wrong": 0}
    run = ProbeRun(["n1", "n2"], {"n1": NodeOutput(0, [result], ""),
                                  "n2": NodeOutput(0, [], "")}, duration=7.5)
    return run


def test_figures_keep_three_significant_digits() -> None:
    assert figure(0.0012345) == "0.00123"
    assert figure(0.0049) == "0.00490"
    assert figure(1.23456) == "1.23"
    assert figure(312.44) == "312"
    assert figure(0.0) == "0"


def test_a_throttled_pair_s_busbw_is_printed_so_it_can_be_read(tmp_path: Path) -> None:
    first = nodes(tmp_path, 2)[0]
    message = problem(run_with_busbw(0.0012345), first, 2)
    assert message == ("busbw 0.00123 GB/s at 8388608 bytes is under the 0.005 GB/s "
                       "threshold for cpu x2 node(s)")
    assert problem(run_with_busbw(0.25), first, 2) is None


def test_pairs_are_disjoint_and_an_odd_node_goes_with_the_first(tmp_path: Path) -> None:
    five = nodes(tmp_path, 5)
    assert [[n.name for n in p] for p in disjoint_pairs(five)] == [
        ["n1", "n2"], ["n3", "n4"], ["n5", "n1"]]
    assert [[n.name for n in p] for p in disjoint_pairs(five[:4])] == [["n1", "n2"],
                                                                       ["n3", "n4"]]


def test_domains_come_from_a_variable_or_from_rack_and_leaf_groups(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("""all:
  children:
    gpus:
      hosts: {a: {}, b: {}, c: {topology_domain: row7}, d: {}}
    rack01:
      hosts: {a: {}}
    leaf02:
      hosts: {b: {}}
""")
    inv = load_inventory(path)
    found = {h.name: domain(Node(h, ConnectOptions())) for h in inv.select("all")}
    assert found == {"a": "rack01", "b": "leaf02", "c": "row7", "d": ""}


def test_a_search_run_may_take_three_times_the_slowest_single_node_run(tmp_path: Path) -> None:
    first = nodes(tmp_path, 2)[0]
    assert trial_timeout(first, [run_with_busbw(1.0)]) == 22.5
    fast = run_with_busbw(1.0)
    fast.duration = 1.0
    assert trial_timeout(first, [fast]) == 20.0  # the floor
    slow = run_with_busbw(1.0)
    slow.duration = 60.0
    assert trial_timeout(first, [slow]) == 90.0  # never past allreduce_timeout_s
    configured = nodes(tmp_path, 2, "    allreduce_bisect_timeout_s: 12\n")[0]
    assert trial_timeout(configured, [slow]) == 12.0


def test_verdict_lines_name_the_node_or_the_pair_its_direction_and_the_phase() -> None:
    hung = "timed out after 22s: n3 hung in rendezvous (process group init)"
    pair = Verdict(Fault("pair", ("n3", "n5"), hung, True, [Trial(("n3", "n5"), False, hung)]),
                   "n5 drops n3's connections, n3 -> n5: 70 of 70 probed ports")
    assert pair.message() == (
        "pair n3 and n5 (n5 drops n3's connections, n3 -> n5: 70 of 70 probed ports): fails "
        "together, passes with others (timed out after 22s: n3 hung in rendezvous "
        "(process group init))")
    node = Verdict(Fault("node", ("n2",), "n2: torchrun exited with 1: boom", True))
    assert node.message() == "node n2: fails with every partner (n2: torchrun exited with 1: boom)"
    flaky = Verdict(Fault("pair", ("n1", "n2"), "x", False, note="intermittent"))
    assert flaky.message().endswith("[not confirmed: intermittent]")
    assert pair.to_dict()["evidence"][0] == {"group": ["n3", "n5"], "ok": False,
                                             "problem": hung, "round": 0}


def _matrix(states: dict[tuple[str, str, int], str]) -> Matrix:
    return Matrix([29500, 49152, 65535], dict(states))


def test_an_asymmetric_cut_is_named_by_the_way_it_drops() -> None:
    ports = [29500, 49152, 50000, 65535]
    one_way = {("n3", "n5", p): ("open" if p == 29500 else "filtered") for p in ports}
    one_way |= {("n5", "n3", p): "open" for p in ports}
    text, blocked = describe_direction("n3", "n5", _matrix(one_way))
    assert text == ("n5 drops n3's connections, n3 -> n5: 3 of 4 probed ports dropped, e.g. "
                    "49152, 50000, 65535; open: 29500")
    assert blocked == {"n3->n5": [49152, 50000, 65535], "n5->n3": []}
    # the same cut seen from the other order of the pair
    text, _ = describe_direction("n5", "n3", _matrix(one_way))
    assert text.startswith("n5 drops n3's connections, n3 -> n5: 3 of 4")


def test_both_ways_and_no_way() -> None:
    both = {(s, t, p): "filtered" for s, t in (("a", "b"), ("b", "a")) for p in (1, 2)}
    text, _ = describe_direction("a", "b", _matrix(both))
    assert text == ("dropped both ways: a -> b: 2 of 2 probed ports dropped, e.g. 1, 2; "
                    "b -> a: 2 of 2 probed ports dropped, e.g. 1, 2")
    clean = {(s, t, p): "open" for s, t in (("a", "b"), ("b", "a")) for p in (1, 2)}
    assert describe_direction("a", "b", _matrix(clean))[0] == (
        "every probed port open both ways: the pair fails inside the collective")
