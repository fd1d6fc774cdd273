"""The AllReduce probe: its pure helpers, and real gloo runs on the CPU under torchrun."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from gpufleet.suites.probes.allreduce import (
    EXACT_INTEGERS,
    EXIT_MEMORY,
    bus_bandwidth,
    fill_values,
    parse_sizes,
)
from tests.probe_runs import PROBES, TORCHRUN, check_phases, events, needs_torch, run_probe

PROBE = PROBES / "allreduce.py"
SIZES = [1024, 64 * 1024, 1024 * 1024]
PHASES = ["start", "rendezvous_done", "first_collective_done", "done"]


# --------------------------------------------------------------------------- pure helpers


def test_parse_sizes_units_are_powers_of_1024() -> None:
    assert parse_sizes("1K,1M,64M,1G,8G") == [1024, 1024**2, 64 * 1024**2, 1024**3, 8 * 1024**3]
    assert parse_sizes("4096") == [4096]
    assert parse_sizes(" 2k , 3m ") == [2048, 3 * 1024**2]


@pytest.mark.parametrize("text", ["", "1T", "0", "0K", "1.5M", "1M,,2M", "-1K", "M", "1 M B"])
def test_parse_sizes_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="bad message size"):
        parse_sizes(text)


def test_bus_bandwidth_one_gib_in_ten_ms_on_eight_ranks() -> None:
    algbw, busbw = bus_bandwidth(1024**3, 0.010, 8)
    assert algbw == pytest.approx(107.3741824)
    assert busbw == pytest.approx(107.3741824 * 14 / 8)
    assert busbw == pytest.approx(187.9048192)


def test_bus_bandwidth_two_ranks_and_one() -> None:
    assert bus_bandwidth(2_000_000_000, 1.0, 2) == pytest.approx((2.0, 2.0))
    assert bus_bandwidth(1_000_000, 0.001, 1) == (1.0, 0.0)


@pytest.mark.parametrize(("seconds", "world"), [(0.0, 2), (-1.0, 2), (1.0, 0)])
def test_bus_bandwidth_rejects(seconds: float, world: int) -> None:
    with pytest.raises(ValueError):
        bus_bandwidth(1024, seconds, world)


def test_fill_values_follow_the_rank() -> None:
    assert fill_values(4, "float32") == [1, 2, 3, 4]
    assert fill_values(10, "bfloat16") == [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]
    assert fill_values(10, "float16") == [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]


@pytest.mark.parametrize("dtype", sorted(EXACT_INTEGERS))
@pytest.mark.parametrize("world", [1, 2, 8, 56, 57, 64, 256, 300, 1024, 6000])
def test_fill_values_sum_stays_exact(dtype: str, world: int) -> None:
    values = fill_values(world, dtype)
    assert len(values) == world
    assert all(value >= 0 for value in values)
    assert 0 < sum(values) <= EXACT_INTEGERS[dtype]


# --------------------------------------------------------------------------- real runs


def torchrun(ranks: int, *options: str) -> tuple[int, list[dict[str, Any]]]:
    return run_probe(
        [
            str(TORCHRUN),
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(ranks),
            str(PROBE),
            "--backend",
            "gloo",
            "--sizes",
            "1K,64K,1M",
            "--iters",
            "2",
            "--warmup",
            "1",
            *options,
        ]
    )


@needs_torch
@pytest.mark.parametrize(("ranks", "dtype", "itemsize"), [(2, "float32", 4), (3, "bfloat16", 2)])
def test_torchrun_on_gloo(ranks: int, dtype: str, itemsize: int) -> None:
    code, lines = torchrun(ranks, "--dtype", dtype)
    assert code == 0, lines
    check_phases(lines, ranks, PHASES)
    results = events(lines, "result")
    assert [result["size"] for result in results] == SIZES
    for result in results:
        assert result["wrong"] == 0
        assert result["count"] == result["size"] // itemsize
        assert (result["dtype"], result["world_size"], result["backend"]) == (dtype, ranks, "gloo")
        assert result["iters"] == 2
        assert result["time_us"] > 0
        assert result["algbw"] == pytest.approx(result["size"] / result["time_us"] / 1e3)
        assert result["busbw"] == pytest.approx(result["algbw"] * 2 * (ranks - 1) / ranks)
    [summary] = events(lines, "summary")
    assert summary["world_size"] == ranks
    assert summary["nodes"] == 1
    assert summary["local_world_size"] == ranks
    assert summary["backend"] == "gloo"
    assert summary["sizes"] == len(SIZES)
    assert summary["torch"]
    assert isinstance(summary["devices"], list)
    assert not events(lines, "error")
    tcp = events(lines, "tcp")  # each rank's connections to the others, on loopback
    assert sorted(e["rank"] for e in tcp) == list(range(ranks))
    assert all(e["peers"]["127.0.0.1"][1] > 0 for e in tcp), tcp


@needs_torch
def test_trials_time_every_size_again_and_report_the_median() -> None:
    import statistics

    code, lines = torchrun(2, "--trials", "3")
    assert code == 0, lines
    for result in events(lines, "result"):
        assert len(result["busbw_trials"]) == 3
        assert result["busbw"] == pytest.approx(statistics.median(result["busbw_trials"]))
        assert result["iters"] == 2  # per trial


@needs_torch
def test_single_process_without_torchrun() -> None:
    code, lines = run_probe(
        [
            sys.executable,
            str(PROBE),
            "--sizes",
            "1K,4K",
            "--iters",
            "3",
            "--warmup",
            "1",
            "--max-seconds-per-size",
            "1e-9",
        ]
    )
    assert code == 0, lines
    check_phases(lines, 1, PHASES)
    results = events(lines, "result")
    assert [result["size"] for result in results] == [1024, 4096]
    assert all(result["wrong"] == 0 and result["world_size"] == 1 for result in results)
    assert all(result["busbw"] == 0.0 and result["algbw"] > 0 for result in results)
    assert all(result["iters"] == 1 for result in results)
    [summary] = events(lines, "summary")
    assert (summary["world_size"], summary["nodes"], summary["local_world_size"]) == (1, 1, 1)


@needs_torch
def test_memory_error_is_reported_with_exit_3() -> None:
    # About a petabyte: more than any address space maps, whatever the overcommit policy.
    code, lines = run_probe([sys.executable, str(PROBE), "--sizes", "1K,1000000G"])
    assert code == EXIT_MEMORY
    [error] = events(lines, "error")
    assert error["size"] == 1_000_000 * 1024**3
    assert "memory" in error["message"].lower()
    assert not events(lines, "result")

