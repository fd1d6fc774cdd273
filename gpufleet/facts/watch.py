"""The standing watch as drift, conformance and ``facts`` read it from a node's facts: its
last report (the ``watch`` fact, gathered where the watch is in use), the findings that are
open, pending or silenced, and the words all three use for them.

The watch on the node is the one judge (gpufleet/node/watch.py): a finding is open, pending
or silenced as its report says; nothing here judges a counter again. A node whose report
could not be read has an unknown watch, never a clean one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.facts.catalog import WATCH
from gpufleet.facts.gather import Facts
from gpufleet.report.jsonfile import utc


@dataclass(frozen=True)
class Finding:
    """One finding of the watch's report; ``kind`` is its class (fabric, nvlink, pcie,
    ecc)."""

    id: str
    kind: str
    status: str
    since: int
    message: str
    silenced_until: float | None = None
    silence_reason: str | None = None

    @property
    def silence(self) -> str:
        """``until 2025-12-07T06:46:40Z (the reason)``, as every report shows a silence."""
        until = "until " + utc(self.silenced_until) if self.silenced_until is not None \
            else "without an end"
        return until + (f" ({self.silence_reason})" if self.silence_reason else "")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "class": self.kind, "status": self.status, "since": self.since,
                "message": self.message, "silenced_until": self.silenced_until,
                "silence_reason": self.silence_reason}


def _unit(window: float) -> tuple[str, float]:
    """A rule's window's unit, as the watch words its rates: per hour, minute or second."""
    if window >= 3600:
        return "h", 3600.0
    if window >= 60:
        return "min", 60.0
    return "s", 1.0


def _span(seconds: float) -> str:
    """``1h``, ``12h``, ``1m``, ``1s``, ``1h30m``: a window as the watch words it."""
    s = round(seconds)
    for size, unit, part, next_unit in ((86400, "d", 3600, "h"), (3600, "h", 60, "m"),
                                        (60, "m", 1, "s")):
        if s >= size:
            rest = s % size // part
            return f"{s // size}{unit}" + (f"{rest}{next_unit}" if rest else "")
    return f"{s}s"


@dataclass(frozen=True)
class Rising:
    """A counter that rose within its rule's window: how much, its rate as the rule sees
    it (per hour) and the rule's limit per window (None: any increase opens)."""

    subject: str
    counter: str
    increase: int
    window: float
    rate_per_hour: float
    limit: float | None = None

    def describe(self) -> str:
        """``mlx5_0/1 symbol_error +140 within 1h: 140/h (limit 120/h)``, in the unit of
        the rule's window as the watch's messages give it."""
        unit, seconds = _unit(self.window)
        rate = self.rate_per_hour * seconds / 3600
        limit = "any increase opens" if self.limit is None \
            else f"limit {self.limit * seconds / self.window:g}/{unit}"
        return (f"{self.subject} {self.counter} +{self.increase} within {_span(self.window)}: "
                f"{rate:.3g}/{unit} ({limit})")

    def to_dict(self) -> dict[str, Any]:
        return {"subject": self.subject, "counter": self.counter, "increase": self.increase,
                "window": self.window, "rate_per_hour": self.rate_per_hour,
                "limit": self.limit}


@dataclass(frozen=True)
class Report:
    """A node's last watch report; ``age_s``: how old it was when the facts were gathered,
    by the node's own clock (None when the node's clock is unknown); ``rising``: the
    counters that rose within their window, fastest first."""

    time: float
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    series: int
    age_s: float | None = None
    rising: tuple[Rising, ...] = ()

    def having(self, status: str) -> list[Finding]:
        return [f for f in self.findings if f.status == status]

    @property
    def open(self) -> list[Finding]:
        return self.having("open")

    @property
    def pending(self) -> list[Finding]:
        return self.having("pending")

    @property
    def silenced(self) -> list[Finding]:
        return self.having("silenced")

    def problem(self) -> str | None:
        """The first open finding and how many more, as the health check words its drain
        reason (``ID: MESSAGE (+N more)``); None when none is open."""
        found = self.open
        if not found:
            return None
        more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
        return f"{found[0].id}: {found[0].message}{more}"

    def counts(self) -> str:
        """``2 open, 1 pending, 1 silenced, 212 series``."""
        return (f"{len(self.open)} open, {len(self.pending)} pending, "
                f"{len(self.silenced)} silenced, {self.series} series")

    def stale(self, max_age_s: float) -> str | None:
        """Why the report says the watch stopped running: older than ``max_age_s`` (the
        ``watch_max_age_s`` variable) when the facts were gathered; None when it is not, or
        when its age is unknown."""
        if self.age_s is None or self.age_s <= max_age_s:
            return None
        return (f"the watch's last report is {_span(self.age_s)} old ({utc(self.time)}), "
                f"more than watch_max_age_s {max_age_s:g}: the watch stopped running")

    def silences(self) -> list[str]:
        """Each silenced finding as ``ID silenced until TIME (REASON)``."""
        return [f"{f.id} silenced {f.silence}" for f in self.silenced]

    def to_dict(self) -> dict[str, Any]:
        """The report as drift's and conformance's JSON carry it."""
        return {"report_time": utc(self.time), "age_s": None if self.age_s is None
                else round(self.age_s, 1), "series": self.series,
                "open": [f.to_dict() for f in self.open],
                "pending": [f.to_dict() for f in self.pending],
                "silenced": [f.to_dict() for f in self.silenced], "notes": list(self.notes),
                "rising": [r.to_dict() for r in self.rising]}


@dataclass(frozen=True)
class Reading:
    """What a node's facts say of its watch: the report, or why it could not be read;
    ``max_age_s``: the age past which the report says the watch stopped (None: not
    judged)."""

    report: Report | None
    unknown: str | None = None
    max_age_s: float | None = None

    @property
    def stale(self) -> str | None:
        """Why the report says the watch stopped running (:meth:`Report.stale`), or None."""
        if self.report is None or self.max_age_s is None:
            return None
        return self.report.stale(self.max_age_s)

    def to_dict(self) -> dict[str, Any]:
        if self.report is None:
            return {"unknown": self.unknown}
        return {**self.report.to_dict(), "stale": self.stale, "unknown": self.unknown}


def from_fact(value: dict[str, Any], clock: float | None = None) -> Report:
    """The ``watch`` fact's value as a report; ``clock``: the node's time at gathering."""
    findings = tuple(Finding(f["id"], f["class"], f["status"], f["since"], f["message"],
                             f["silenced_until"], f["silence_reason"])
                     for f in value["findings"])
    age = None if clock is None else max(0.0, clock - value["time"])
    rising = tuple(Rising(r["subject"], r["counter"], r["increase"], r["window"],
                          r["rate_per_hour"], r["limit"]) for r in value.get("rising", ()))
    return Report(value["time"], findings, tuple(value["notes"]), value["series"], age, rising)


def reading(facts: Facts, max_age_s: float | None = None) -> Reading | None:
    """The node's watch: None when the watch is not in use there (its fact was not asked
    for), else its report or why it is unknown; ``max_age_s``: the report's age past which
    the watch stopped running (None: its age is not judged)."""
    if WATCH in facts.values:
        clock = facts.get("clock")
        return Reading(from_fact(facts.values[WATCH],
                                 clock if isinstance(clock, float) else None),
                       max_age_s=max_age_s)
    if WATCH in facts.absent:
        return Reading(None, facts.why_absent(WATCH), max_age_s)
    return None
