"""Manual changes: what gpufleet reports but never applies (a setting of the site's
slurm.conf). Provisioning shows them and goes on, drift reports them, a remediation that
leaves them is not clean, and they drain no node."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpufleet import exitcodes
from gpufleet import roles as role_registry
from gpufleet.bootstrap import provision_node
from gpufleet.connect.fleet import FleetOptions
from gpufleet.drift import drain as drift_drain
from gpufleet.drift.run import DriftOptions, check_fleet, exit_code
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.target import Target
from gpufleet.provision import nodelock
from gpufleet.provision import report as provision_report
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.provision.plan import MANUAL, Change, Plan, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars
from gpufleet.slurm.client import RunFindings


class SiteRole(RoleBase):
    """A role with one change it applies (a marker file) and one for an operator."""

    name = "site"
    order = 1

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def active(self, v: RoleVars) -> bool:
        return True

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({self.marker}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        changes = [Change(self.name, "slurm.conf Prolog", MANUAL, "absent",
                          "Prolog=/usr/local/sbin/gpufleet-prolog", kind="slurm.conf")]
        if not facts.file(self.marker).exists:
            changes.insert(0, Change(self.name, f"file {self.marker}", "create", "absent",
                                     "0 bytes", [Run(f"touch {self.marker}", "touch")]))
        return changes


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Target:
    monkeypatch.setattr(nodelock, "LOCK", str(tmp_path / "run" / "gpufleet" / "lock"))
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    here:\n"
                                        "      ansible_connection: local\n")
    return Target.select(load_inventory(tmp_path / "hosts.yml"), None)


def test_a_manual_change_has_no_steps_and_is_not_applicable() -> None:
    manual = Change("site", "slurm.conf Prolog", MANUAL, "absent", "Prolog=/x")
    plain = Change("site", "file /x", "create", "absent", "1 bytes", [Run("true", "t")])
    assert manual.manual and not plain.manual
    assert Plan("h", [plain, manual]).applicable == [plain]
    with pytest.raises(ValueError, match="a manual change has no steps"):
        Change("site", "slurm.conf Prolog", MANUAL, "absent", "Prolog=/x", [Run("true", "t")])


def test_provision_applies_the_rest_shows_the_manual_change_and_does_not_fail(
        target: Target, tmp_path: Path) -> None:
    role = SiteRole(tmp_path / "marker")
    outcomes = provision(target.inventory, target.hosts, [role],
                         RunOptions(fleet=FleetOptions()))
    run = outcomes["here"].value
    assert outcomes["here"].status == "changed" and run is not None and run.plan is not None
    assert [c.item for c in run.applied] == [f"site/file {tmp_path / 'marker'}"]
    out = io.StringIO()
    provision_report.print_plans(Console(file=out, width=200), outcomes, False, "CHANGES")
    lines = out.getvalue().splitlines()
    assert lines[1].lstrip().startswith("done + site")
    assert lines[2].lstrip().startswith("MANUAL ~ site      slurm.conf Prolog")
    assert lines[2].endswith("absent -> Prolog=/usr/local/sbin/gpufleet-prolog  (manual)")
    assert provision_report.manual_notes(outcomes) == {
        "here": "1 change(s) for an operator (manual)"}
    assert [c["applied"] for c in provision_report.host_json(outcomes["here"])["changes"]] \
        == [True, False]


def test_a_plan_of_manual_changes_alone_takes_no_lock_and_leaves_the_host_ok(
        target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "marker").touch()

    def refuse(*args: Any) -> None:
        raise AssertionError("the node lock was taken for nothing to apply")

    monkeypatch.setattr(nodelock, "acquire", refuse)
    for check in (True, False):
        outcome = provision(target.inventory, target.hosts, [SiteRole(tmp_path / "marker")],
                            RunOptions(check=check, fleet=FleetOptions()))["here"]
        assert outcome.status == "ok"
        assert outcome.value is not None and outcome.value.plan is not None
        assert [c.action for c in outcome.value.plan.changes] == [MANUAL]


def test_drift_reports_it_a_remediation_leaves_it_and_it_drains_nothing(
        target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "marker").touch()
    run = check_fleet(target, DriftOptions(roles=[SiteRole(tmp_path / "marker")]))
    [item] = run.hosts["here"].items
    assert (run.hosts["here"].status, item.item, item.kind, item.manual) == (
        "drifted", "site/slurm.conf Prolog", "slurm.conf", True)
    assert "manual" not in item.to_dict()  # the document's schema is unchanged
    assert exit_code(run) == exitcodes.FAILED
    run.remediation = {"here": {"status": "ok", "error": None, "applied": []}}
    assert exit_code(run) == exitcodes.FAILED
    updates: list[list[tuple[Any, list[RunFindings]]]] = []

    def update(results: list[tuple[Any, list[RunFindings]]]) -> dict[str, str]:
        updates.append(results)
        return {}

    monkeypatch.setattr("gpufleet.slurm.drain.update", update)
    drift_drain.drain_drifted(target, run)
    [[(_, [findings])]] = updates
    assert findings.failed == {} and "site" in findings.passed


def test_bootstrap_provisioning_leaves_manual_changes_to_certification(
        target: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(role_registry, "ALL", [SiteRole(tmp_path / "marker")])
    detail, data = provision_node(target.inventory, target.hosts[0], FleetOptions(), False)
    assert detail == "1 change(s) applied; left to an operator: site/slurm.conf Prolog"
    assert data == {"applied": [f"site/file {tmp_path / 'marker'}"]}
