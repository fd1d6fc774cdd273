"""Staged scaling: the widths of the stages, each step's efficiency and speed-up, and the
first step that falls short named with its communication share."""

from __future__ import annotations

import pytest

from gpufleet.conformance.checks.ddp import comm_note, first, short, stages, step


@pytest.mark.parametrize(("count", "widths"), [
    (1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]),
    (16, [1, 2, 4, 8, 16]),
])
def test_stages_double_up_to_the_count(count: int, widths: list[int]) -> None:
    assert stages(count) == widths


def test_the_first_step_that_falls_short_is_named_with_its_comm_share() -> None:
    one = first({"samples_per_s": 1000.0, "comm_share": None})
    two = step(2, {"samples_per_s": 1900.0, "comm_share": 0.05}, 1000.0, one)
    four = step(4, {"samples_per_s": 2600.0, "comm_share": 0.34}, 1000.0, two)
    eight = step(8, {"samples_per_s": 2700.0, "comm_share": 0.6}, 1000.0, four)
    assert (two.efficiency, round(two.speedup, 2)) == (0.95, 1.9)
    assert four.to_dict() == {"width": 4, "samples_per_s": 2600.0, "efficiency": 0.65,
                              "speedup": 1.368, "comm_share": 0.34}
    assert short([one, two], 0.85, "GPUs") is None
    assert short([one, two, four, eight], 0.85, "GPUs") == (
        "the step 2 -> 4 GPUs falls short: scaling efficiency 0.65 at 4 (2600 vs 4 x 1000 "
        "samples/s, 1.37x over 2) is under 0.85; communication takes 34% of a step (past 30%: "
        "adding GPUs stops paying)")


def test_a_share_under_the_rule_of_thumb_is_only_reported() -> None:
    assert comm_note(0.12) == "; communication takes 12% of a step"
    assert comm_note(None) == ""
