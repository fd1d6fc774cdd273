"""The watch suite's verdict, pure: a node's standing-watch report (the ``watch`` fact, as
gpufleet/facts/watch.py reads it) judged as the health check judges it. An open finding
fails, named with its message and how many more; a silenced or pending one passes and is
recorded with the report; a report older than ``watch_max_age_s`` fails naming its age (the
watch stopped running: the health check, which runs it, would see a fresh one); a report
that could not be read is unknown, never a pass."""

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
    """Fail on the first open finding (``ID: MESSAGE (+N more)``, then the silences) and on
    a report older than the reading's bound (its age, when it was written and the bound);
    pass with the silenced ones named; ``unknown:`` when the report could not be read."""
    if found.report is None:
        return Verdict(f"unknown: the watch's report: {found.unknown}", {})
    report = found.report
    silences = report.silences()
    properties = {"watch": found.to_dict(), "silenced": silences}
    problems = [p for p in (found.stale, report.problem()) if p]
    if not problems:
        return Verdict(None, properties)
    return Verdict("; ".join(problems + silences), properties)
