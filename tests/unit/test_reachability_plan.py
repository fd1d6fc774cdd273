"""Reachability strategies, the random range sample and its sharing, the source port band."""

from __future__ import annotations

import pytest

from gpufleet.conformance.measure.reachability import (
    AUTO_ALL_MAX,
    pairs,
    random_ports,
    resolve_mode,
    share,
    source_band,
)
from gpufleet.errors import GpufleetError


def names(count: int) -> list[str]:
    return [f"n{i:03d}" for i in range(1, count + 1)]


def test_auto_is_all_up_to_256_nodes_and_a_sample_above() -> None:
    assert resolve_mode("auto", AUTO_ALL_MAX) == "all"
    assert resolve_mode("auto", AUTO_ALL_MAX + 1) == "sample:8"
    assert resolve_mode("ring", 1000) == "ring"
    assert len(pairs(names(10), "auto")) == 90
    big = pairs(names(300), "auto")
    assert len(big) <= 300 * (8 + 2)
    assert {s for s, _ in big} == {t for _, t in big} == set(names(300))


@pytest.mark.parametrize("mode", ["all", "ring", "sample:3", "auto"])
def test_every_strategy_has_every_node_as_source_and_target(mode: str) -> None:
    found = pairs(names(7), mode)
    assert {s for s, _ in found} == {t for _, t in found} == set(names(7))
    assert all(s != t for s, t in found)
    assert len(found) == len(set(found))


def test_ring_is_each_node_to_its_neighbours() -> None:
    assert sorted(pairs(names(4), "ring")) == sorted([
        ("n001", "n002"), ("n002", "n003"), ("n003", "n004"), ("n004", "n001"),
        ("n002", "n001"), ("n003", "n002"), ("n004", "n003"), ("n001", "n004")])


def test_sample_is_reproducible_for_a_seed_and_holds_the_ring() -> None:
    assert pairs(names(40), "sample:4", seed=1) == pairs(names(40), "sample:4", seed=1)
    assert set(pairs(names(40), "ring")) <= set(pairs(names(40), "sample:4", seed=1))
    per_source = {}
    for s, t in pairs(names(40), "sample:4", seed=1):
        per_source.setdefault(s, set()).add(t)
    assert all(4 <= len(ts) <= 6 for ts in per_source.values())


@pytest.mark.parametrize("mode", ["every", "sample:", "sample:x", "ring:2"])
def test_a_bad_strategy_is_a_clear_error(mode: str) -> None:
    with pytest.raises(GpufleetError, match="--pairs must be auto, all, ring or sample:K"):
        pairs(names(3), mode)


def test_random_ports_take_one_port_in_each_stratum() -> None:
    ports = random_ports(49152, 65535, 64, "n001", seed=7)
    assert len(ports) == 64
    width = (65535 - 49152 + 1) / 64
    for i, port in enumerate(ports):
        assert 49152 + int(i * width) <= port < 49152 + int((i + 1) * width) + 1
    assert ports == random_ports(49152, 65535, 64, "n001", seed=7)
    assert ports != random_ports(49152, 65535, 64, "n002", seed=7)
    assert ports != random_ports(49152, 65535, 64, "n001", seed=8)


def test_any_hole_twice_a_stratum_wide_holds_a_probed_port() -> None:
    width = (65535 - 49152 + 1) // 64
    for seed in range(20):
        ports = random_ports(49152, 65535, 64, "n001", seed)
        for start in range(49152, 65535 - 2 * width, 97):
            assert any(start <= p < start + 2 * width for p in ports), (seed, start)


def test_a_target_s_sources_share_out_its_sample_and_probe_all_of_it() -> None:
    sample = random_ports(49152, 65535, 10, "t", 0)
    sources = ["a", "b", "c"]
    parts = [share(sample, sources, s) for s in sources]
    assert sorted(p for part in parts for p in part) == sorted(sample)
    assert [len(p) for p in parts] == [4, 3, 3]
    assert share(sample, ["a"], "a") == sample


def test_the_source_band_lies_outside_the_range_and_off_the_rendezvous_port() -> None:
    assert source_band(49152, 65535, 29500) == (45056, 49151)
    assert source_band(30000, 65535, 29500) == (25904, 29499)
    assert source_band(29600, 65535, 29500) == (25504, 29499)
    assert source_band(1024, 60000, 29500) == (60001, 64096)
    assert source_band(1024, 65535, 29500) is None
