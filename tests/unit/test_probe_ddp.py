"""The DDP probe: its pure helpers, its checksums, and real gloo runs on the CPU."""

from __future__ import annotations

import sys

import pytest

from gpufleet.suites.probes.ddp import EXIT_FAILED, loss_trend, scaling_efficiency
from tests.probe_runs import PROBES, TORCHRUN, check_phases, events, needs_torch, run_probe

PROBE = PROBES / "ddp.py"
LAUNCH = [str(TORCHRUN), "--standalone", "--nnodes", "1", "--nproc-per-node", "2", str(PROBE)]
PHASES = ["start", "rendezvous_done", "first_step_done", "done"]
TINY = ["--width", "32", "--depth", "2", "--batch-size", "16", "--warmup-steps", "2"]
TINY += ["--steps", "12", "--comm-steps", "3"]
RESULT_KEYS = {
    "event",
    "world_size",
    "nodes",
    "backend",
    "steps",
    "samples_per_s",
    "trials",
    "step_time_s",
    "nosync_step_time_s",
    "comm_share",
    "loss_first",
    "loss_last",
    "params_identical",
    "param_checksum_spread",
    "device",
}


# --------------------------------------------------------------------------- pure helpers


def test_scaling_efficiency() -> None:
    assert scaling_efficiency(7200.0, 8, 1000.0) == pytest.approx(0.9)
    assert scaling_efficiency(1000.0, 1, 1000.0) == 1.0
    assert scaling_efficiency(0.0, 4, 10.0) == 0.0


@pytest.mark.parametrize(("n", "one"), [(0, 1.0), (2, 0.0), (2, -1.0)])
def test_scaling_efficiency_rejects(n: int, one: float) -> None:
    with pytest.raises(ValueError):
        scaling_efficiency(1.0, n, one)


def test_loss_trend() -> None:
    losses = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4]
    assert loss_trend(losses) == pytest.approx((1.0, 0.6))
    assert loss_trend(losses, tail=2) == pytest.approx((1.0, 0.45))
    assert loss_trend([2.0, 3.0]) == (2.0, 2.5)
    assert loss_trend([2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError):
        loss_trend([])


@needs_torch
def test_param_checksums_see_any_change() -> None:
    import torch

    from gpufleet.suites.probes.ddp import build_model, param_checksums

    torch.manual_seed(0)
    model = build_model(8, 2)
    same = build_model(8, 2)
    same.load_state_dict(model.state_dict())
    base = param_checksums(model)
    assert base.dtype == torch.float64
    assert base.numel() == 2 * len(list(model.parameters()))
    assert torch.equal(base, param_checksums(same))

    weight = same[0].weight.data
    weight.view(-1)[5] = torch.nextafter(weight.view(-1)[5], torch.tensor(1.0))
    assert (param_checksums(same) != base).sum() == 2  # one ulp, in one tensor

    same.load_state_dict(model.state_dict())
    flat = same[2].weight.data.view(-1)
    flat[[0, 1]] = flat[[1, 0]].clone()
    changed = param_checksums(same) != base
    assert changed.tolist() == [False] * 4 + [False, True] + [False] * 6  # moved, not altered


# --------------------------------------------------------------------------- real runs


@needs_torch
def test_torchrun_on_gloo_learns_and_agrees() -> None:
    code, lines = run_probe([*LAUNCH, *TINY, "--lr", "0.01", "--trials", "3"])
    assert code == 0, lines
    check_phases(lines, 2, PHASES)
    [result] = events(lines, "result")
    assert set(result) == RESULT_KEYS
    assert len(result["trials"]) == 3  # the timed steps ran three times; the median is reported
    assert result["samples_per_s"] == pytest.approx(sorted(result["trials"])[1])
    assert (result["world_size"], result["nodes"], result["backend"]) == (2, 1, "gloo")
    assert (result["steps"], result["device"]) == (12, "cpu")
    assert result["params_identical"] is True
    assert result["param_checksum_spread"] == 0.0
    assert result["loss_last"] < result["loss_first"]
    assert result["samples_per_s"] == pytest.approx(2 * 16 / result["step_time_s"])
    assert result["nosync_step_time_s"] > 0
    assert 0 <= result["comm_share"] < 1
    assert result["comm_share"] == pytest.approx(
        max(0.0, 1 - result["nosync_step_time_s"] / result["step_time_s"])
    )
    assert not events(lines, "error")


@needs_torch
def test_single_process_whose_loss_blows_up_exits_2() -> None:
    code, lines = run_probe(
        [
            sys.executable,
            str(PROBE),
            *TINY,
            "--optimizer",
            "sgd",
            "--lr",
            "1e6",
            "--comm-steps",
            "0",
        ]
    )
    assert code == EXIT_FAILED
    check_phases(lines, 1, PHASES)
    [result] = events(lines, "result")
    assert (result["world_size"], result["nodes"]) == (1, 1)
    assert result["params_identical"] is True
    assert result["loss_last"] is None or result["loss_last"] >= result["loss_first"]
    assert result["nosync_step_time_s"] is None
    assert result["comm_share"] is None

