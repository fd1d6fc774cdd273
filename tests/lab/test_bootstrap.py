"""Bootstrap on the lab: a fresh node (not in known_hosts) to certified-ready with a lab
peer; a wrong fingerprint refused before anything runs on the node (and the node drained
from the controller); a failing step drains the node.

The tests share one fresh node and run in order: refused, then ready, then re-certified
while the peer's own firewall closes the rendezvous port (the peer's firewall role refuses
to admit it past a foreign rule that drops the cluster). The node's files (node.json,
baseline.json) validate against their schemas, as the reports do (the conftest).

The lab is the module's own: node01 and node02 provisioned (with reboot), as the session
lab's nodes are, and node03 never provisioned (no gpufleet firewall to admit the new
node)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.bootstrap import BootstrapOptions
from gpufleet.lab.bmc import running
from gpufleet.lab.cluster import Lab
from gpufleet.report.schemas import validate
from tests.lab.conftest import TEST_NET, lab_up, node_sh
from tests.lab.test_provision import override

BASELINE = "/etc/gpufleet/baseline.json"
PROVISIONED = "node01:node02"
UNMANAGED = "node03"


@pytest.fixture(scope="module")
def boot_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """PROVISIONED provisioned and UNMANAGED not; torn down at the module's end."""
    with lab_up(tmp_path_factory, "bt", 16, 3, provision=PROVISIONED) as lab:
        yield lab


@pytest.fixture(scope="module")
def boot_inventory(boot_lab: Lab) -> Path:
    return boot_lab.config.inventory_dir


@pytest.fixture(scope="module")
def fresh(boot_lab: Lab) -> str:
    """A new node in the inventory whose host key nobody has recorded yet (it goes down with
    the module's lab)."""
    return boot_lab.add().name


@pytest.fixture
def hooks(boot_inventory: Path, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "scheduler.log"
    with override(boot_inventory, "group_vars", "lab", {
            "bootstrap_ready_command": f'echo "ready $GPUFLEET_HOST" >> {log}',
            "bootstrap_drain_command": f'echo "drain $GPUFLEET_HOST: $GPUFLEET_REASON" >> {log}'}):
        yield log


def _bootstrap(inventory: Path, tmp_path: Path, **kwargs: object) -> tuple[int, dict[str, object]]:
    report = tmp_path / f"bootstrap-{len(list(tmp_path.iterdir()))}.json"
    code = app.bootstrap_cmd(str(inventory), BootstrapOptions(**kwargs),  # type: ignore[arg-type]
                             str(report))
    return code, json.loads(report.read_text()) if report.exists() else {}


def test_a_wrong_fingerprint_is_refused_before_anything_runs(
        boot_lab: Lab, boot_inventory: Path, fresh: str, hooks: Path, tmp_path: Path) -> None:
    known_before = boot_lab.config.known_hosts.read_text()
    upper = boot_lab.node(fresh).dir / "upper"
    before = sorted(str(p) for p in upper.rglob("*"))
    code, report = _bootstrap(boot_inventory, tmp_path, host=fresh,
                              expect_fingerprint="SHA256:" + "A" * 43)
    assert code == 1
    assert [s["step"] for s in report["steps"]] == ["trust", "mark"]  # type: ignore[union-attr]
    assert "not the expected SHA256:AAAA" in str(report["reason"])
    assert boot_lab.config.known_hosts.read_text() == known_before
    assert sorted(str(p) for p in upper.rglob("*")) == before
    # the node is never contacted, but the scheduler drains it from the controller
    assert hooks.read_text().startswith(f"drain {fresh}: trust: host key of ")
    assert "the node was not contacted" in report["steps"][1]["detail"]  # type: ignore[index]


def test_a_fresh_node_is_taken_to_ready_and_then_shows_no_drift(
        boot_lab: Lab, boot_inventory: Path, fresh: str, hooks: Path, tmp_path: Path) -> None:
    known = boot_lab.config.known_hosts.read_text()
    assert boot_lab.node(fresh).address not in known
    code, report = _bootstrap(boot_inventory, tmp_path, host=fresh, peer="node01", reboot=True)
    assert code == 0, report
    steps = {s["step"]: s for s in report["steps"]}  # type: ignore[index, union-attr]
    assert [s["step"] for s in report["steps"]] == [  # type: ignore[union-attr]
        "trust", "preflight", "provision", "admit", "certify", "mark"]
    assert all(s["status"] == "ok" for s in steps.values())
    assert "newly recorded" in steps["trust"]["detail"]
    assert steps["trust"]["data"]["fingerprint"].startswith("SHA256:")
    assert boot_lab.node(fresh).address in boot_lab.config.known_hosts.read_text()
    assert "rebooted" in steps["provision"]["detail"]
    admitted = steps["admit"]["data"]
    assert admitted["updated"] == PROVISIONED.split(":")
    assert UNMANAGED in admitted["unmanaged"]  # never provisioned: left without a firewall
    assert "gpufleet" not in node_sh(boot_lab, UNMANAGED, "nft list tables")
    state = json.loads(node_sh(boot_lab, fresh, "cat /etc/gpufleet/node.json"))
    validate(state)
    assert (state["status"], state["peer"], state["versions"]["nccl"]) == \
        ("ready", "node01", "2.21.5-1+cuda12.4")
    validate(json.loads(node_sh(boot_lab, fresh, "cat /etc/gpufleet/baseline.json")))
    assert hooks.read_text() == f"ready {fresh}\n"
    assert app.drift_cmd(str(boot_inventory), limit=f"{PROVISIONED}:{fresh}",
                         outputs=app.DriftOutputs(report_dir=str(tmp_path / "drift"))) == 0
    again_code, again = _bootstrap(boot_inventory, tmp_path, host=fresh, peer="node01")
    assert again_code == 0
    assert {s["step"]: s["status"] for s in again["steps"]} == {  # type: ignore[union-attr]
        "trust": "ok", "preflight": "ok", "provision": "ok", "admit": "ok",
        "certify": "skipped", "mark": "ok"}
    assert "unchanged" in again["steps"][-1]["detail"]  # type: ignore[index]
    assert hooks.read_text() == f"ready {fresh}\n"


def test_a_node_that_would_push_its_rack_over_its_power_budget_is_refused(
        boot_lab: Lab, boot_inventory: Path, fresh: str, hooks: Path, tmp_path: Path) -> None:
    """The new node's BMC (a lab Redfish service) measures a 6100 W peak; node01, in the
    same rack, recorded 11000 W at its certification: 17100 W of a 16000 W budget."""
    rack = {"rack": "rackB", "rack_power_w": 20000, "rack_cooling": "liquid"}
    before = node_sh(boot_lab, "node01", f"cat {BASELINE} 2>/dev/null || true")
    peak = json.dumps(_peak_doc(11000))
    node_sh(boot_lab, "node01", f"mkdir -p /etc/gpufleet && printf '%s' '{peak}' > {BASELINE}")
    port = 20000 + TEST_NET * 10 + 8
    try:
        with running(boot_lab.config.root / "bmc-bootstrap", {fresh: port}, "gfmonitor",
                     "lab-bootstrap-Bmc-5ecret") as bmcs, \
                override(boot_inventory, "host_vars", fresh,
                         {**bmcs.inventory_vars(fresh), **rack}), \
                override(boot_inventory, "host_vars", "node01", rack):
            code, report = _bootstrap(boot_inventory, tmp_path, host=fresh, peer="node01",
                                      recertify=True)
    finally:
        node_sh(boot_lab, "node01", f"printf '%s' {shlex.quote(before)} > {BASELINE}" if before
                else f"rm -f {BASELINE}")
    assert code == 1, report
    steps = {s["step"]: s for s in report["steps"]}  # type: ignore[index, union-attr]
    assert {name: s["status"] for name, s in steps.items()} == {
        "trust": "ok", "preflight": "ok", "provision": "ok", "admit": "ok", "certify": "ok",
        "power": "failed", "mark": "ok"}, report
    assert report["reason"] == (
        f"power: rack rackB with {fresh}: measured peaks add up to 17100 W, over its budget "
        f"of 16000 W (0.8 x the 20000 W supply)")
    recorded = json.loads(node_sh(boot_lab, fresh, f"cat {BASELINE}"))
    assert recorded["figures"]["power.peak_w"]["value"] == 6100
    assert hooks.read_text().startswith(f"drain {fresh}: power: rack rackB with {fresh}: ")
    assert json.loads(node_sh(boot_lab, fresh, "cat /etc/gpufleet/node.json"))["status"] == \
        "not-ready"


def _peak_doc(watts: float) -> dict[str, object]:
    return {"schema": "gpufleet.baseline/1", "host": "node01",
            "generated_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:00Z",
            "figures": {"power.peak_w": {"value": watts, "unit": "W", "kind": "reading",
                                         "recorded_at": "2026-12-01T00:00:00Z"}}}


def test_a_failing_step_marks_the_node_not_ready_and_drains_it(
        boot_lab: Lab, boot_inventory: Path, fresh: str, hooks: Path, tmp_path: Path) -> None:
    # The site's own firewall on the peer (a table gpufleet does not own) closes 29500.
    node_sh(boot_lab, "node01", "nft add table inet site && nft 'add chain inet site in "
            "{ type filter hook input priority -10; }' && "
            "nft add rule inet site in tcp dport 29500 drop")
    try:
        code, report = _bootstrap(boot_inventory, tmp_path, host=fresh, peer="node01",
                                  recertify=True)
    finally:
        node_sh(boot_lab, "node01", "nft delete table inet site")
    assert code == 1, report
    # The peer's firewall role sees the foreign rule while admitting the node: the run stops
    # there (certify never runs) and names the rule.
    steps = {s["step"]: s["status"] for s in report["steps"]}  # type: ignore[union-attr]
    assert steps == {"trust": "ok", "preflight": "ok", "provision": "ok", "admit": "failed",
                     "mark": "ok"}, report
    reason = str(report["reason"])
    assert reason.startswith(f"admit: the peer node01 could not admit {fresh}: "), reason
    assert "tcp dport 29500 from" in reason and "table inet site chain in" in reason
    state = json.loads(node_sh(boot_lab, fresh, "cat /etc/gpufleet/node.json"))
    validate(state)
    assert state["status"] == "not-ready"
    assert "tcp dport 29500" in state["reason"]
    drained = hooks.read_text()
    assert drained.startswith(f"drain {fresh}: admit: ")
    assert "tcp dport 29500" in drained


def test_an_unreachable_node_is_drained_from_the_controller_and_exits_3(
        boot_lab: Lab, boot_inventory: Path, fresh: str, hooks: Path, tmp_path: Path) -> None:
    boot_lab.set_link(fresh, up=False)
    try:
        code, report = _bootstrap(boot_inventory, tmp_path, host=fresh, peer="node01",
                                  connect_timeout=2)
    finally:
        boot_lab.set_link(fresh, up=True)
    assert code == 3
    steps = {s["step"]: s for s in report["steps"]}  # type: ignore[union-attr]
    assert steps["trust"]["status"] == "failed" and steps["trust"]["unreachable"]
    assert steps["mark"]["status"] == "ok"
    assert hooks.read_text().startswith(f"drain {fresh}: trust: connect to ")
