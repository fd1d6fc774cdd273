"""Drift's findings handed to the fleet's scheduler (gpufleet/slurm/drain.py): one per
drifted role, cleared by the roles checked clean."""

from __future__ import annotations

from gpufleet.drift.run import DriftRun
from gpufleet.inventory.model import Host
from gpufleet.inventory.target import Target
from gpufleet.slurm import drain
from gpufleet.slurm.client import RunFindings


def drain_drifted(target: Target, run: DriftRun) -> dict[str, str]:
    """Keep drift's findings in each host's drain reason: one per drifted role (and one for
    a host that could not be checked); the roles checked clean clear theirs. A manual item
    (a setting of the cluster's slurm.conf) drains nothing: the node is not at fault, and
    the same file would drain every node."""
    results: list[tuple[Host, list[RunFindings]]] = []
    for host in target.hosts:
        entry = run.hosts[host.name]
        if entry.status in ("unreachable", "error"):
            results.append((host, [RunFindings("drift", {entry.status: str(entry.error)})]))
            continue
        failed: dict[str, str] = {}
        for item in (i for i in entry.items if not i.manual):
            failed.setdefault(item.role, f"{item.resource}: desired {item.desired}, actual "
                                         f"{item.actual}")
        passed = [*run.roles_checked, "unreachable", "error"]
        results.append((host, [RunFindings("drift", failed, passed)]))
    return drain.update(results)
