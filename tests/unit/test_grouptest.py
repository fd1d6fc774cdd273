"""Adaptive group testing on simulated fleets: any single bad node, any bad pair, several
faults at once, racks, and the rounds growing as log n."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from gpufleet.conformance.grouptest import (
    Fault,
    Group,
    Search,
    Trial,
    common_nodes,
    find_faults,
    max_rounds,
    split,
)


class Fleet:
    """A simulated fleet: a group fails when it holds a bad node or both ends of a bad pair.
    Every round's groups must be disjoint (they run at the same time)."""

    def __init__(self, nodes: list[str], bad: set[str] = frozenset(),  # type: ignore[assignment]
                 pairs: set[frozenset[str]] = frozenset()) -> None:  # type: ignore[assignment]
        self.nodes, self.bad, self.pairs = nodes, set(bad), set(pairs)
        self.rounds: list[list[Group]] = []

    def fails(self, group: Group) -> bool:
        members = set(group)
        return bool(members & self.bad) or any(p <= members for p in self.pairs)

    def test(self, groups: list[Group]) -> list[Trial]:
        seen: set[str] = set()
        for group in groups:
            assert len(group) >= 2, group
            assert not seen & set(group), f"groups of one round overlap: {groups}"
            seen |= set(group)
        self.rounds.append(groups)
        return [Trial(g, not self.fails(g), "hung in the first collective"
                      if self.fails(g) else None) for g in groups]


def names(count: int) -> list[str]:
    return [f"node{i:02d}" for i in range(1, count + 1)]


def found(search: Search) -> tuple[set[str], set[frozenset[str]]]:
    nodes = {f.nodes[0] for f in search.faults if f.kind == "node"}
    pairs = {frozenset(f.nodes) for f in search.faults if f.kind == "pair"}
    return nodes, pairs


def test_a_clean_fleet_costs_one_round() -> None:
    fleet = Fleet(names(16))
    search = find_faults(fleet.nodes, fleet.test)
    assert (search.faults, search.rounds) == ([], 1)


@pytest.mark.parametrize("count", [3, 4, 5, 6, 7, 8, 12])
def test_any_single_bad_node_is_found_and_confirmed(count: int) -> None:
    for bad in names(count):
        fleet = Fleet(names(count), bad={bad})
        search = find_faults(fleet.nodes, fleet.test)
        assert found(search) == ({bad}, set()), bad
        [fault] = search.faults
        assert fault.confirmed and fault.problem == "hung in the first collective"
        assert search.rounds <= max_rounds(count) and not search.exhausted


@pytest.mark.parametrize("count", [3, 4, 6, 7, 9])
def test_any_bad_pair_is_found_and_confirmed_before_it_is_blamed(count: int) -> None:
    for a, b in itertools.combinations(names(count), 2):
        fleet = Fleet(names(count), pairs={frozenset((a, b))})
        search = find_faults(fleet.nodes, fleet.test)
        assert found(search) == (set(), {frozenset((a, b))}), (a, b)
        [fault] = search.faults
        assert fault.confirmed
        # blamed only after both ends passed with good references and the pair failed again
        last = fault.evidence[-1]
        assert set(last.group) == {a, b} and not last.ok
        assert all(t.ok for t in fault.evidence[1:3])
        assert search.rounds <= max_rounds(count)


def test_a_pair_between_two_non_first_nodes_of_six() -> None:
    fleet = Fleet(names(6), pairs={frozenset(("node03", "node05"))})
    search = find_faults(fleet.nodes, fleet.test)
    [fault] = search.faults
    assert (fault.kind, set(fault.nodes), fault.confirmed) == ("pair", {"node03", "node05"},
                                                              True)


def test_two_nodes_alone_cannot_tell_a_bad_node_from_a_bad_pair() -> None:
    fleet = Fleet(names(2), bad={"node02"})
    [fault] = find_faults(fleet.nodes, fleet.test).faults
    assert (fault.kind, fault.confirmed) == ("pair", False)
    assert "no third node" in fault.note


@pytest.mark.parametrize(("bad", "pairs"), [
    ({"node02", "node07"}, []),
    ({"node04"}, [("node09", "node12")]),
    (set(), [("node01", "node02"), ("node10", "node15")]),
    (set(), [("node03", "node08"), ("node03", "node11")]),
    ({"node16"}, [("node05", "node06"), ("node07", "node13")]),
])
def test_several_faults_are_all_found(bad: set[str], pairs: list[tuple[str, str]]) -> None:
    wanted = {frozenset(p) for p in pairs}
    fleet = Fleet(names(16), bad=bad, pairs=wanted)
    search = find_faults(fleet.nodes, fleet.test, limit=100)
    assert found(search) == (bad, wanted)


def test_random_faults_on_larger_fleets() -> None:
    rng = random.Random(5)
    for _ in range(60):
        count = rng.randrange(8, 65)
        nodes = names(count)
        bad = set(rng.sample(nodes, rng.randrange(0, 2)))
        rest = [n for n in nodes if n not in bad]
        pairs = {frozenset(rng.sample(rest, 2)) for _ in range(rng.randrange(0, 3))}
        fleet = Fleet(nodes, bad=bad, pairs=pairs)
        search = find_faults(nodes, fleet.test, limit=200)
        assert found(search) == (bad, pairs), (count, bad, pairs)


def test_rounds_for_one_fault_grow_as_log_n() -> None:
    worst = {}
    for count in (8, 32, 128, 512):
        nodes = names(count) if count < 100 else [f"n{i:04d}" for i in range(count)]
        rng = random.Random(count)
        rounds = []
        for _ in range(20):
            a, b = rng.sample(nodes, 2)
            fleet = Fleet(nodes, pairs={frozenset((a, b))})
            search = find_faults(nodes, fleet.test)
            assert found(search) == (set(), {frozenset((a, b))})
            rounds.append(search.rounds)
        worst[count] = max(rounds)
        assert worst[count] <= max_rounds(count)
    assert worst[512] <= worst[8] + 3 * (math.log2(512) - math.log2(8)) + 2


def test_known_trials_are_not_run_again() -> None:
    fleet = Fleet(names(8), pairs={frozenset(("node01", "node02"))})
    known = [Trial(tuple(names(8)), False, "timed out"),
             Trial(("node01", "node02"), False, "timed out"),
             Trial(("node03", "node04"), True), Trial(("node05", "node06"), True)]
    search = find_faults(fleet.nodes, fleet.test, known=known)
    assert found(search) == (set(), {frozenset(("node01", "node02"))})
    assert tuple(names(8)) not in {g for r in fleet.rounds for g in r}


def test_the_search_stops_at_its_round_budget() -> None:
    fleet = Fleet(names(32), bad={"node20"})
    search = find_faults(fleet.nodes, fleet.test, limit=2)
    assert search.exhausted and search.rounds == 2


def test_halves_keep_racks_whole() -> None:
    racks = {n: ("r1" if i < 4 else "r2" if i < 6 else "r3") for i, n in enumerate(names(8))}
    left, right = split(names(8), racks)
    assert {racks[n] for n in left} & {racks[n] for n in right} == set()
    assert sorted(left + right) == names(8)
    assert split(names(5)) == (("node01", "node02"), ("node03", "node04", "node05"))


def test_a_bad_node_is_tested_against_a_reference_from_its_own_rack() -> None:
    nodes = names(8)
    racks = {n: ("r1" if i < 4 else "r2") for i, n in enumerate(nodes)}
    fleet = Fleet(nodes, bad={"node07"})
    search = find_faults(nodes, fleet.test, domains=racks)
    [fault] = search.faults
    assert fault.nodes == ("node07",)
    partners = {n for t in fault.evidence for n in t.group} - {"node07"}
    assert {racks[n] for n in partners} == {"r2"}


SLOW = ("busbw 0.00245 GB/s at 1048576 bytes is 0.00196 of the slowest line rate (node01: "
        "eth0 10 Gb/s), under allreduce_min_line_rate_fraction 0.004")


def test_a_good_pair_that_failed_by_chance_does_not_split_a_bad_node_into_two_pairs() -> None:
    # A CI run of three nodes, node03's link throttled: the pairs level ran node01+node02
    # and node03+node01 at once, and node01+node02 failed by chance too. No node was known
    # good, so node03 was the reference of both suspects (node01, node02); each failed
    # with it and passed with the other: two pairs, node01+node03 and node02+node03, in 4
    # rounds. node03, common to both, failed every group it was in: it is the bad node.
    fleet = Fleet(names(3), bad={"node03"})
    known = [Trial(("node01", "node02"), False, SLOW.replace("0.00245", "0.00461")
                   .replace("0.00196", "0.00369")),
             Trial(("node03", "node01"), False, SLOW), Trial(tuple(names(3)), False, SLOW)]
    search = find_faults(fleet.nodes, fleet.test, known=known)
    assert search.rounds == 4
    assert [set(g) for r in fleet.rounds for g in r] == [
        {"node01", "node03"}, {"node02", "node03"}, {"node01", "node02"},
        {"node01", "node02"}]
    [fault] = search.faults
    assert (fault.kind, fault.nodes, fault.confirmed) == ("node", ("node03",), True)
    assert fault.note == "fails with node01, node02, which pass without it"
    assert {frozenset(t.group) for t in fault.evidence} == {
        frozenset(("node01", "node03")), frozenset(("node02", "node03")),
        frozenset(("node01", "node02"))}


def _pair(a: str, b: str) -> Fault:
    return Fault("pair", (a, b), "hung in the first collective", True,
                 [Trial((a, b), False, "hung in the first collective")])


def test_pairs_that_share_a_node_stay_pairs_unless_that_node_explains_them() -> None:
    pairs = [_pair("node01", "node03"), _pair("node02", "node03")]
    failed = [Trial(("node01", "node03"), False), Trial(("node02", "node03"), False)]
    good = Trial(("node01", "node02"), True)
    [node] = common_nodes(pairs, [*failed, good])
    assert (node.kind, node.nodes) == ("node", ("node03",))
    # node03 passed with node04: its paths to node01 and node02 fail, not node03
    assert common_nodes(pairs, [*failed, good, Trial(("node03", "node04"), True)]) == pairs
    # node02 never passed without node03: nothing tells node03 from node02
    assert common_nodes(pairs, [*failed, Trial(("node01", "node04"), True)]) == pairs
    # one pair, or pairs with no node in common, are what they are
    assert common_nodes(pairs[:1], [*failed, good]) == pairs[:1]
    apart = [_pair("node01", "node02"), _pair("node03", "node04")]
    assert common_nodes(apart, [Trial(("node01", "node02"), False),
                                Trial(("node03", "node04"), False),
                                Trial(("node01", "node03"), True),
                                Trial(("node02", "node04"), True)]) == apart


def test_bad_pairs_that_share_a_node_which_passes_elsewhere_are_found_as_pairs() -> None:
    wanted = {frozenset(("node01", "node03")), frozenset(("node02", "node03"))}
    fleet = Fleet(names(4), pairs=wanted)
    search = find_faults(fleet.nodes, fleet.test, limit=100)
    assert found(search) == (set(), wanted)
