"""What a conformance run found: one result per check and host, per-host verdicts, the
baselines' trends and the data suites attach; typed for the commands and bootstrap, and
as the ``gpufleet.conformance/1`` JSON document."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpufleet.report.jsonfile import envelope

SCHEMA = "gpufleet.conformance/1"
FLEET = "fleet"


@dataclass
class Result:
    """One check's outcome on one host (or on the fleet)."""

    suite: str
    check: str
    host: str
    outcome: str  # pass | fail | skip
    message: str
    duration: float
    properties: dict[str, Any]

    @property
    def name(self) -> str:
        """``suite/check`` without pytest's ``test_`` prefix."""
        return f"{self.suite}/{self.check.removeprefix('test_')}"

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "check": self.check, "host": self.host,
                "outcome": self.outcome, "message": self.message,
                "duration_s": round(self.duration, 3), "properties": self.properties}


def host_summary(results: list[Result]) -> dict[str, dict[str, Any]]:
    """Per host: PASS / FAIL / SKIP and counts (a host fails when any of its checks fails);
    checks that run once for the whole selection are counted under ``fleet``."""
    summary: dict[str, dict[str, Any]] = {}
    for r in results:
        entry = summary.setdefault(r.host, {"pass": 0, "fail": 0, "skip": 0})
        entry[r.outcome] += 1
    for entry in summary.values():
        entry["status"] = "FAIL" if entry["fail"] else ("PASS" if entry["pass"] else "SKIP")
    return summary


def counts(results: list[Result]) -> dict[str, int]:
    """Checks passed, failed and skipped."""
    return {k: sum(r.outcome == k for r in results) for k in ("pass", "fail", "skip")}


@dataclass
class ConformanceReport:
    """Everything one conformance run found. ``complete`` is False when the run stopped
    before every selected check had an outcome; ``unreachable`` names the nodes whose
    facts could not be gathered (each of their checks failed), with why."""

    inventory: str
    inventory_digest: str
    started: float
    duration: float = 0.0
    results: list[Result] = field(default_factory=list)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    complete: bool = True
    left_out: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.outcome == "fail"]

    def hosts(self) -> dict[str, dict[str, Any]]:
        return host_summary(self.results)

    def summary(self) -> dict[str, int]:
        hosts = {h: e for h, e in self.hosts().items() if h != FLEET}
        return {"hosts": len(hosts), "passed_hosts": sum(e["status"] == "PASS"
                                                         for e in hosts.values()),
                "failed_hosts": sum(e["status"] == "FAIL" for e in hosts.values()),
                "checks": len(self.results), **counts(self.results)}

    def to_json(self) -> dict[str, Any]:
        """The report document (schema gpufleet.conformance/1, see docs/conformance.md)."""
        return envelope(
            SCHEMA, inventory=self.inventory, inventory_digest=self.inventory_digest,
            duration_s=self.duration, summary=self.summary(),
            started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                      time.gmtime(self.started + self.duration)),
            complete=self.complete, hosts=self.hosts(),
            results=[r.to_dict() for r in self.results], baselines=self.baselines,
            data=self.data)
