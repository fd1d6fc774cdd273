"""A conformance run as JUnit XML, in gpufleet's one convention (gpufleet/report/junit.py):
``classname="conformance.<host>"``, ``name="<suite>/<check>"``; an unreachable node is one
``<error>``, not a failure per check."""

from __future__ import annotations

from gpufleet import __version__
from gpufleet.conformance.results import FLEET, ConformanceReport
from gpufleet.report import junit


def to_junit(report: ConformanceReport) -> junit.Suite:
    """Per host its ``reachable`` case, then a case per check (the run-once checks under
    ``conformance.fleet``); a check's recorded properties go into its ``<system-out>``."""
    suite = junit.Suite("conformance", report.started, {
        "inventory": report.inventory, "inventory_digest": report.inventory_digest,
        "gpufleet_version": __version__, "complete": report.complete,
        "left_out": report.left_out, "summary": report.summary()})
    by_host: dict[str, list[int]] = {}
    for index, result in enumerate(report.results):
        by_host.setdefault(result.host, []).append(index)
    for host, indexes in by_host.items():
        if host != FLEET and not suite.host(host, error=report.unreachable.get(host)):
            continue
        for result in (report.results[i] for i in indexes):
            suite.case(host, result.name, time_s=result.duration,
                       failure=result.message if result.outcome == "fail" else None,
                       skipped=result.message if result.outcome == "skip" else None,
                       details=result.message, data=result.properties)
    return suite
