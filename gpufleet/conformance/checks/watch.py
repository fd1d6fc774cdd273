"""The watch suite's verdict, pure: a node's standing-watch report (the ``watch`` fact, as
gpufleet/facts/watch.py reads it) judged as the health check judges it. An open finding
fails, named with its message and how many more; a silenced or pending one passes and is
recorded with the report; a report that could not be read is unknown, never a pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.facts.watch import Reading


@dataclass(frozen=True)
class Verdict:
    """A node's watch judged: the failure (None: it passes) and what the check records."""

    failure: str | None
    properties: dict[str, Any]


def verdict(found: Reading) -> Verdict:
    """Fail on the first open finding (``ID: MESSAGE (+N more)``, then the silences); pass
    with the silenced ones named; ``unknown:`` when the report could not be read."""
    if found.report is None:
        return Verdict(f"unknown: the watch's report: {found.unknown}", {})
    report = found.report
    silences = report.silences()
    properties = {"watch": report.to_dict(), "silenced": silences}
    problem = report.problem()
    if problem is None:
        return Verdict(None, properties)
    return Verdict(problem + (f"; {'; '.join(silences)}" if silences else ""), properties)
