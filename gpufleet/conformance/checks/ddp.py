"""Staged scaling: "go 1 -> 2 -> 4 -> 8 GPUs, checking the speed-up at each step; stop at the
step where it falls short". The widths of the stages, each step's efficiency against one
unit (a process within a node, a node across nodes), and the first step that falls short."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COMM_SHARE_RULE = 0.3
"""Above this share of a step spent in communication, adding GPUs stops paying."""


def stages(count: int) -> list[int]:
    """The widths measured up to ``count``: 1, 2, 4 ... and ``count`` itself."""
    widths, width = [1], 2
    while width < count:
        widths.append(width)
        width *= 2
    return [*widths, count] if count > 1 else widths


@dataclass(frozen=True)
class Step:
    """One width of the curve: its throughput, its efficiency against ``width`` x one unit,
    its speed-up over the width before, and its share of a step spent communicating."""

    width: int
    samples_per_s: float
    efficiency: float
    speedup: float
    comm_share: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "samples_per_s": round(self.samples_per_s, 2),
                "efficiency": round(self.efficiency, 3), "speedup": round(self.speedup, 3),
                "comm_share": None if self.comm_share is None else round(self.comm_share, 3)}


def step(width: int, result: Mapping[str, Any], one: float, before: Step | None) -> Step:
    """The step of a job at ``width`` from its result line, against ``one`` unit's
    throughput and the step ``before`` it."""
    throughput = float(result["samples_per_s"])
    previous = before.samples_per_s if before else throughput
    share = result.get("comm_share")
    return Step(width, throughput, throughput / (width * one) if one > 0 else 0.0,
                throughput / previous if previous > 0 else 0.0,
                None if share is None else float(share))


def first(one: Mapping[str, Any]) -> Step:
    """The curve's first step: one unit."""
    return step(1, one, float(one["samples_per_s"]), None)


def short(curve: list[Step], minimum: float, unit: str) -> str | None:
    """Why the first step whose efficiency is under ``minimum`` falls short, or None."""
    for before, current in itertools.pairwise(curve):
        if current.efficiency < minimum:
            return (f"the step {before.width} -> {current.width} {unit} falls short: "
                    f"scaling efficiency {current.efficiency:.2f} at {current.width} "
                    f"({current.samples_per_s:.0f} vs {current.width} x "
                    f"{curve[0].samples_per_s:.0f} samples/s, {current.speedup:.2f}x over "
                    f"{before.width}) is under {minimum:g}" + comm_note(current.comm_share))
    return None


def comm_note(share: float | None) -> str:
    """``; communication takes 34% of a step (past 30%: adding GPUs stops paying)``."""
    if share is None:
        return ""
    past = (f" (past {COMM_SHARE_RULE:.0%}: adding GPUs stops paying)"
            if share > COMM_SHARE_RULE else "")
    return f"; communication takes {share:.0%} of a step{past}"
