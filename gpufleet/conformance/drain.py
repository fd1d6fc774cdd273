"""Conformance's findings handed to the fleet's scheduler (gpufleet/slurm/drain.py): one
per failed check, cleared by the checks that passed."""

from __future__ import annotations

from gpufleet.conformance.results import FLEET, ConformanceReport
from gpufleet.inventory.target import Target
from gpufleet.slurm import drain
from gpufleet.slurm.client import RunFindings


def drain_failed(target: Target, report: ConformanceReport) -> dict[str, str]:
    """Keep conformance's findings in each node's drain reason: one per failed check; the
    checks that passed on the node now (or, run once for the fleet, passed for the fleet)
    clear theirs."""
    # Nodes the Slurm launcher could not allocate were not measured: their state stays.
    hosts = [h for h in target.hosts if h.name not in report.left_out]
    fleet_passed = {r.name for r in report.results if r.host == FLEET and r.outcome == "pass"}
    results = []
    for host in hosts:
        mine = [r for r in report.results if r.host == host.name]
        failed: dict[str, str] = {}
        for r in mine:
            if r.outcome == "fail":
                failed.setdefault(r.name, r.message)
        passed = fleet_passed | {r.name for r in mine if r.outcome == "pass"}
        results.append((host, [RunFindings("conformance", failed, passed)]))
    return drain.update(results)
