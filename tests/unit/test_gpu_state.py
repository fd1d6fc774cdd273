"""The gpu_state suite's verdict on the ``gpus`` fact, and its declaration: in no set, so
``conformance`` and ``acceptance`` select what they did; ``all`` and its name run it."""

from __future__ import annotations

import json

from gpufleet.conformance import registry
from gpufleet.conformance.checks.gpu_state import ecc_modes, ecc_problems
from tests.conftest import ROOT

H200 = json.loads((ROOT / "tests/fixtures/h200x2/gpufleet/facts.json").read_text())[
    "hosts"]["gpu-local"]["facts"]


def test_ecc_on_every_gpu_of_a_captured_node_passes() -> None:
    modes = ecc_modes(H200["gpus"])
    assert modes == {"GPU0": True, "GPU1": True}
    assert ecc_problems(modes) == ([], [])


def test_ecc_off_fails_and_a_missing_mode_among_others_is_unknown() -> None:
    gpus = [{"index": 0, "ecc.mode.current": True}, {"index": 1, "ecc.mode.current": False},
            {"index": 2, "ecc.mode.current": None}]
    assert ecc_problems(ecc_modes(gpus)) == (["GPU1: ECC off"],
                                             ["GPU2: no ECC mode reported"])


def test_gpus_without_ecc_report_nothing_to_judge() -> None:
    modes = ecc_modes([{"index": 0, "ecc.mode.current": None}, {"index": 1}])
    assert modes == {"GPU0": None, "GPU1": None}
    assert ecc_problems(modes) == ([], [])


def test_gpu_state_is_in_no_set_and_in_all() -> None:
    assert "gpu_state" not in [s.name for s in registry.select("conformance,acceptance")]
    assert "gpu_state" in [s.name for s in registry.select("all")]
    assert [s.name for s in registry.select("gpu_state")] == ["gpu_state"]
    assert "gpu_state" not in registry.sets_help()
    assert registry.defaults()["gpu_state_ecc"] is True
