"""Slurm in the lab: a real slurmctld and munged on the controller and slurmd in three lab
nodes; drain and resume through scontrol, the health check program run by slurmd itself,
and the slurm:PARTITION inventory."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.conformance import plugin
from gpufleet.errors import InventoryError
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from gpufleet.lab.slurm import LabSlurm, SlurmSettings
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.roles import nccl_env, pytorch, slurm_healthcheck
from gpufleet.slurm import findings
from gpufleet.slurm.client import RunFindings, Slurm, SlurmNode
from tests.conftest import ROOT
from tests.lab.conftest import foreign_table, lab_config_for, node_sh
from tests.lab.test_provision import override

NODES = 3
HEALTH_CHECK_INTERVAL = 3


@pytest.fixture(scope="module")
def slurm_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Three nodes with Slurm; slurmd runs the health check every few seconds."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    inventory_dir = tmp_path_factory.mktemp("slurm-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    config = lab_config_for("sl", 3, inventory_dir)
    (inventory_dir / "group_vars" / "lab.yml").write_text(
        f"slurm_healthcheck: true\ngpufleet_scheduler: slurm\n"
        f"gpufleet_slurm_conf: {LabSlurm(config).conf}\n")
    lab = Lab(config)
    lab.down()
    lab.up(NODES, slurm=SlurmSettings(health_check_interval=HEALTH_CHECK_INTERVAL))
    _seed_torch(lab)
    yield lab
    lab.down()


def _seed_torch(lab: Lab) -> None:
    """torch on node01 by the pytorch role, then its venv hard-linked into the other nodes'
    overlays before anything there looks at /opt (an overlay misses later changes to its
    upper directory)."""
    inventory = load_inventory(lab.config.inventory_dir)
    outcomes = provision(inventory, inventory.select("node01"), [pytorch.ROLE], RunOptions())
    assert outcomes["node01"].status == "changed", outcomes
    venv = lab.node("node01").dir / "upper" / "opt" / "gpufleet"
    for node in lab.nodes()[1:]:
        (node.dir / "upper" / "opt").mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-al", str(venv), str(node.dir / "upper" / "opt")], check=True)


@pytest.fixture
def slurm(slurm_lab: Lab) -> Slurm:
    return LabSlurm(slurm_lab.config).client


def _wait_for(what: str, ready: Callable[[], SlurmNode | None], timeout: float = 30
              ) -> SlurmNode:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (found := ready()) is not None:
            return found
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def _idle(slurm: Slurm, name: str, what: str) -> SlurmNode:
    """Wait for IDLE: a resumed node is NOT_RESPONDING until slurmctld's next ping."""
    return _wait_for(what, lambda: next((n for n in slurm.nodes()
                                         if n.name == name and n.state == "IDLE"), None))


def _slurm_env(lab: Lab) -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(LabSlurm(lab.config).conf)}


def test_nodes_are_idle_in_sinfo_with_their_cpus_and_gres(slurm_lab: Lab, slurm: Slurm) -> None:
    rows = slurm.sinfo()
    assert [(r.name, r.partition, r.state, r.cpus, r.gres) for r in rows] == [
        (f"node0{i}", "lab", "idle", 4, "gpu:2") for i in range(1, NODES + 1)]
    nodes = {n.name: n for n in slurm.nodes()}
    assert nodes["node02"].address == slurm_lab.node("node02").address
    assert nodes["node02"].gpus == 2


def test_slurm_daemons_listen_on_lab_addresses_only(slurm_lab: Lab) -> None:
    listening = subprocess.run(["ss", "-Hltn", "sport = :6817"], capture_output=True,
                               text=True, check=True).stdout.split()
    assert f"{slurm_lab.config.controller_address}:6817" in listening
    assert "0.0.0.0:6817" not in listening and "*:6817" not in listening
    for node in slurm_lab.nodes():
        inside = subprocess.run(["ip", "netns", "exec", node.netns, "ss", "-Hltn",
                                 "sport = :6818"], capture_output=True, text=True,
                                check=True).stdout
        assert ":6818" in inside
    outside = subprocess.run(["ss", "-Hltn", "sport = :6818"], capture_output=True,
                             text=True, check=True).stdout
    assert outside.strip() == ""


def test_srun_runs_across_the_nodes_from_the_controller_and_from_a_node(slurm_lab: Lab) -> None:
    proc = subprocess.run(["srun", f"-N{NODES}", "hostname"], capture_output=True, text=True,
                          timeout=60, check=False, env=_slurm_env(slurm_lab))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split()) == [f"node0{i}" for i in range(1, NODES + 1)]
    from_node = node_sh(slurm_lab, "node01", f"srun -N{NODES} hostname")
    assert sorted(from_node.split()) == [f"node0{i}" for i in range(1, NODES + 1)]


def test_findings_drain_the_node_and_only_the_last_one_cleared_resumes_it(
        slurm: Slurm) -> None:
    """Real slurmctld keeps a long reason exactly as written; sinfo -R's 20 characters name
    the first finding; each run clears only its own."""
    drained = slurm.update("node02", [RunFindings(
        "conformance", {"reachability/reachable_from_the_cluster":
                        "port 29500 closed\nto node01"})])
    assert drained.action == "drained"
    reason = drained.detail
    assert reason.startswith("gf reachability/reachable_from_the_cluster: port 29500 closed "
                             "to node01 {gf1 c:reachability/reachable_from_the_cluster@")
    node = slurm.node("node02")
    assert node.drained and node.reason == reason and node.reason_user == "root"
    short = subprocess.run(["sinfo", "-R", "--noheader"], capture_output=True, text=True,
                           check=True, env=slurm.environment()).stdout
    assert "gf reachability/reac" in short
    more = {f"stack/role_converged[role{i:02d}]": f"changes {i}" for i in range(30)}
    slurm.update("node02", [RunFindings("conformance", more), RunFindings(
        "drift", {"nccl_env": "file /etc/nccl.conf: desired 127 bytes, actual absent"})])
    long_reason = slurm.node("node02").reason or ""
    assert len(long_reason) > 1000 and long_reason.endswith("}")
    assert len(findings.parse(long_reason) or []) == 32
    assert slurm.update("node02", [RunFindings("drift", {}, ["nccl_env"])]).action == "drained"
    assert slurm.update("node02", [RunFindings("conformance", {}, [
        "reachability/reachable_from_the_cluster", *more])]).action == "resumed"
    _idle(slurm, "node02", "node02 resumed")
    assert slurm.update("node02", [RunFindings("drift", {}, ["nccl_env"])]).action == \
        "unchanged"


def test_two_controllers_updating_at_once_keep_both_findings(slurm: Slurm) -> None:
    runs = [RunFindings("conformance", {f"gpu/check{i}": "failed"}) for i in range(4)] + \
        [RunFindings("drift", {f"role{i}": "drifted"}) for i in range(4)]
    errors: list[BaseException] = []

    def update(run: RunFindings) -> None:
        try:
            slurm.update("node03", [run])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=update, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    try:
        kept = {(f.source, f.id) for f in findings.parse(slurm.node("node03").reason) or []}
        assert kept == {(r.source, next(iter(r.failed))) for r in runs}
    finally:
        slurm.update("node03", [RunFindings(r.source, {}, list(r.failed)) for r in runs])
    _idle(slurm, "node03", "node03 resumed once every finding is cleared")


def test_a_node_drained_by_an_operator_is_left_alone(slurm_lab: Lab, slurm: Slurm) -> None:
    operator = ["scontrol", "update", "nodename=node03", "state=drain",
                "reason=replacing a fan (ticket OPS-7)"]
    subprocess.run(operator, check=True, timeout=30, env=_slurm_env(slurm_lab))
    try:
        for run in (RunFindings("conformance", {}, ["gpu/health"]),
                    RunFindings("healthcheck", {"xid": "Xid 79"})):
            assert slurm.update("node03", [run]).action == "left alone"
        node = slurm.node("node03")
        assert node.drained and node.reason == "replacing a fan (ticket OPS-7)"
    finally:
        subprocess.run(["scontrol", "update", "nodename=node03", "state=resume"], check=True,
                       timeout=30, env=_slurm_env(slurm_lab))


def _provision_nccl_env_and_healthcheck(lab: Lab) -> None:
    inventory = load_inventory(lab.config.inventory_dir)
    outcomes = provision(inventory, inventory.select("lab"),
                         [nccl_env.ROLE, slurm_healthcheck.ROLE], RunOptions())
    assert {o.status for o in outcomes.values()} <= {"ok", "changed"}, outcomes


def test_slurmd_runs_the_health_check_which_drains_its_node_and_resumes_it(
        slurm_lab: Lab, slurm: Slurm) -> None:
    _provision_nccl_env_and_healthcheck(slurm_lab)
    report = node_sh(slurm_lab, "node01", "/usr/local/sbin/gpufleet-healthcheck --no-drain")
    assert "PASS port_range: 49152-65535" in report
    seconds = float(report.rsplit(" in ", 1)[1].rstrip("s\n"))
    assert seconds < 10

    node_sh(slurm_lab, "node02", "sysctl -qw net.ipv4.ip_local_port_range='32768 60999'")
    try:
        drained = _wait_for("slurmd's health check drains node02", lambda: next(
            (n for n in slurm.nodes() if n.name == "node02" and n.drained), None))
        assert (drained.reason or "").startswith(
            "gf hc/port_range: 32768-60999, expected 49152-65535 {gf1 h:port_range@")
        assert not any(n.drained for n in slurm.nodes() if n.name != "node02")
        # slurmd logs the exit status once the program, which drained first, has ended.
        log = LabSlurm(slurm_lab.config).dir / "log" / "slurmd-node02.log"
        _wait_for("slurmd logs the failed health check", lambda: drained if (
            "health_check failed: rc:1" in log.read_text()) else None, timeout=10)
    finally:
        _provision_nccl_env_and_healthcheck(slurm_lab)
    _idle(slurm, "node02", "the health check resumes node02 once its port range is fixed")


def test_the_health_check_leaves_an_operator_drain_alone(slurm_lab: Lab, slurm: Slurm) -> None:
    subprocess.run(["scontrol", "update", "nodename=node01", "state=drain",
                    "reason=firmware update"], check=True, timeout=30, env=_slurm_env(slurm_lab))
    try:
        report = node_sh(slurm_lab, "node01", "/usr/local/sbin/gpufleet-healthcheck --drain")
        assert "slurm: node01 left alone: drained by someone else: firmware update" in report
        assert slurm.node("node01").reason == "firmware update"
    finally:
        subprocess.run(["scontrol", "update", "nodename=node01", "state=resume"], check=True,
                       timeout=30, env=_slurm_env(slurm_lab))


def _operator_drain(lab: Lab, node: str, reason: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain",
                    f"reason={reason}"], check=True, timeout=30, env=_slurm_env(lab))


def _operator_resume(lab: Lab, node: str) -> None:
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True,
                   timeout=30, env=_slurm_env(lab))


def test_conformance_drains_the_failing_node_and_resumes_it_once_it_passes(
        slurm_lab: Lab, slurm: Slurm, tmp_path: Path) -> None:
    inventory = str(slurm_lab.config.inventory_dir)
    node1 = slurm_lab.node("node01").address
    foreign_table(slurm_lab, "node02", f"ip saddr {node1} tcp dport 29500 drop")
    _operator_drain(slurm_lab, "node03", "RMA ticket 4411")
    try:
        try:
            code = app.conformance_cmd(inventory, suites="firewall", drain_failed=True,
                                       json_path=str(tmp_path / "failed.json"))
        finally:
            node_sh(slurm_lab, "node02", "nft delete table inet site")
        assert code == 1
        node = slurm.node("node02")
        assert node.drained and (node.reason or "").startswith(
            f"gf firewall/live_rules_admit_the_cluster: tcp dport 29500 from {node1} is "
            "dropped by table inet site chain in (priority -10) handle 2: ip saddr ")
        assert not slurm.node("node01").drained

        _provision_nccl_env_and_healthcheck(slurm_lab)
        assert app.drift_cmd(inventory, roles="nccl_env", drain_drifted=True,
                             outputs=app.DriftOutputs(report_dir=str(tmp_path / "d"))) == 0
        assert slurm.node("node02").reason == node.reason, "drift resumed a conformance drain"

        # A transient health check failure adds its finding beside conformance's, and its
        # passing again clears only its own: the node stays drained (it used to be resumed).
        node_sh(slurm_lab, "node02", "sysctl -qw net.ipv4.ip_local_port_range='32768 60999'")
        both = _wait_for("the health check adds its finding", lambda: next(
            (n for n in [slurm.node("node02")] if " h:port_range@" in (n.reason or "")), None))
        assert (both.reason or "").startswith((node.reason or "").split(" {")[0] + " (+1 more)")
        node_sh(slurm_lab, "node02", "sysctl -qw net.ipv4.ip_local_port_range='49152 65535'")
        _wait_for("the health check clears its own finding", lambda: next(
            (n for n in [slurm.node("node02")] if n.reason == node.reason), None))
        time.sleep(2 * HEALTH_CHECK_INTERVAL)
        assert slurm.node("node02").drained, "the health check resumed a conformance drain"

        # Drift re-drains it for an edited file; once fixed, drift clears its finding only.
        node_sh(slurm_lab, "node02", "echo NCCL_DEBUG=INFO >> /etc/default/gpufleet-nccl")
        assert app.drift_cmd(inventory, roles="nccl_env", drain_drifted=True,
                             outputs=app.DriftOutputs(report_dir=str(tmp_path / "d"))) == 1
        assert " d:nccl_env@" in (slurm.node("node02").reason or "")
        _provision_nccl_env_and_healthcheck(slurm_lab)
        assert app.drift_cmd(inventory, roles="nccl_env", drain_drifted=True,
                             outputs=app.DriftOutputs(report_dir=str(tmp_path / "d"))) == 0
        assert slurm.node("node02").reason == node.reason, "drift resumed a conformance drain"

        assert app.conformance_cmd(inventory, suites="firewall", drain_failed=True,
                                   json_path=str(tmp_path / "passed.json")) == 0
        _idle(slurm, "node02", "conformance resumes node02 once the firewall check passes")
        operator = slurm.node("node03")
        assert operator.drained and operator.reason == "RMA ticket 4411"
    finally:
        _operator_resume(slurm_lab, "node03")


def test_drift_drains_the_drifted_node_and_resumes_it_once_clean(
        slurm_lab: Lab, slurm: Slurm, tmp_path: Path) -> None:
    inventory = str(slurm_lab.config.inventory_dir)
    outputs = app.DriftOutputs(report_dir=str(tmp_path / "d"))
    _provision_nccl_env_and_healthcheck(slurm_lab)
    node_sh(slurm_lab, "node03", "sed -i 's/^NCCL_SOCKET_IFNAME=.*/NCCL_SOCKET_IFNAME=eth7/' "
            "/etc/default/gpufleet-nccl")
    assert app.drift_cmd(inventory, roles="nccl_env", drain_drifted=True,
                         outputs=outputs) == 1
    node = slurm.node("node03")
    assert node.drained and (node.reason or "").startswith(
        "gf drift/nccl_env: file /etc/default/gpufleet-nccl: desired ")
    assert [n.name for n in slurm.nodes() if n.drained] == ["node03"]
    _provision_nccl_env_and_healthcheck(slurm_lab)
    assert app.drift_cmd(inventory, roles="nccl_env", drain_drifted=True,
                         outputs=outputs) == 0
    _idle(slurm, "node03", "drift resumes node03 once it is clean")


def _outcomes(report: Path) -> dict[tuple[str, str, str], str]:
    return {(r["host"], r["suite"], r["check"]): r["outcome"]
            for r in json.loads(report.read_text())["results"]}


def _differing(report: Path, other: Path) -> list[str]:
    """The messages of the checks whose outcome differs between two reports."""
    theirs = _outcomes(other)
    return [f"{r['host']} {r['check']}: {r['outcome']} {(r.get('message') or '')[:2000]}"
            for r in json.loads(report.read_text())["results"]
            if theirs.get((r["host"], r["suite"], r["check"])) != r["outcome"]]


def _steps(lab: Lab, node: str, job: str) -> set[str]:
    """The job's steps that ran a task on ``node``, from its slurmd's log."""
    log = LabSlurm(lab.config).dir / "log" / f"slurmd-{node}.log"
    return set(re.findall(rf"launch task StepId={job}\.(\d+)", log.read_text()))


def _launcher_run(lab: Lab, tmp_path: Path, launcher: str, suites: str, by_ssh: Path
                  ) -> dict[str, set[str]]:
    """The suites through ``launcher``: SSH's outcomes, its job gone; its steps by node."""
    report = tmp_path / f"{launcher}.json"
    assert app.conformance_cmd(str(lab.config.inventory_dir), suites=suites,
                               json_path=str(report), launcher=launcher, partition="lab") == 1
    assert _outcomes(report) == _outcomes(by_ssh), (launcher, _differing(report, by_ssh))
    described = json.loads(report.read_text())["data"]["launcher"]["slurm"]
    assert described["left_out"] == {}
    assert described["combined_steps"] is (launcher == "slurm")
    assert not [line for line in subprocess.run(
        ["squeue", "--noheader", "--format=%i"], capture_output=True, text=True,
        check=True, env=_slurm_env(lab)).stdout.split() if line == described["job_id"]]
    return {f"node0{i}": _steps(lab, f"node0{i}", described["job_id"])
            for i in range(1, NODES + 1)}


def test_the_slurm_launchers_give_the_ssh_launchers_outcomes(slurm_lab: Lab, slurm: Slurm,
                                                               tmp_path: Path) -> None:
    """slurm (node-local commands of the nodes in one step) and slurm-per-node (a step per
    command) against SSH: the same outcome for every (host, suite, check), far fewer steps
    when combined, and no job left behind."""
    inventory = str(slurm_lab.config.inventory_dir)
    suites = "firewall,stack,host_sizing,reachability,allreduce"
    by_ssh = tmp_path / "ssh.json"
    steps = {}
    with contextlib.ExitStack() as small:
        # the launchers are compared, not the figures: the lab's two smaller messages
        for i in range(1, NODES + 1):
            small.enter_context(override(slurm_lab.config.inventory_dir, "host_vars",
                                         f"node0{i}", {"allreduce_sizes": "64K,1M"}))
        assert app.conformance_cmd(inventory, suites=suites, json_path=str(by_ssh)) == 1
        for launcher in ("slurm", "slurm-per-node"):
            steps[launcher] = _launcher_run(slurm_lab, tmp_path, launcher, suites, by_ssh)
    outcomes = _outcomes(by_ssh)
    assert outcomes[("fleet", "allreduce", "test_all_nodes_together")] == "pass"
    assert {outcomes[(f"node0{i}", "allreduce", "test_each_node_alone")]
            for i in range(1, NODES + 1)} == {"pass"}
    assert outcomes[("node02", "firewall", "test_live_rules_admit_the_cluster")] == "pass"
    tasks = {launcher: sum(map(len, by_node.values())) for launcher, by_node in steps.items()}
    distinct = {launcher: len(set().union(*by_node.values()))
                for launcher, by_node in steps.items()}
    assert tasks["slurm"] == tasks["slurm-per-node"] > 10 * NODES, steps
    assert distinct["slurm-per-node"] == tasks["slurm-per-node"], "a step per command"
    assert distinct["slurm"] < distinct["slurm-per-node"], steps
    local = tmp_path / "local.json"
    app.conformance_cmd(inventory, suites="firewall,stack,host_sizing", json_path=str(local),
                        launcher="slurm", partition="lab")
    job = json.loads(local.read_text())["data"]["launcher"]["slurm"]["job_id"]
    by_node = [_steps(slurm_lab, f"node0{i}", job) for i in range(1, NODES + 1)]
    assert len(by_node[0]) >= 3 and by_node[0] == by_node[1] == by_node[2], \
        "node-local suites: every step carries every node's command"


def _jobs(lab: Lab) -> list[str]:
    return subprocess.run(["squeue", "--noheader", "--name=gpufleet-conformance",
                           "--format=%i"], capture_output=True, text=True, check=True,
                          env=_slurm_env(lab)).stdout.split()


def _jobs_end(lab: Lab, timeout: float = 30) -> list[str]:
    """The conformance jobs still listed once they had ``timeout`` seconds to end: scancel
    returns at once, and squeue lists a cancelled job while it completes."""
    deadline = time.monotonic() + timeout
    while (jobs := _jobs(lab)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return jobs


def test_sigterm_of_the_controller_cancels_the_allocation(slurm_lab: Lab,
                                                          tmp_path: Path) -> None:
    """The exclusive allocation holds every measured node: a controller stopped with
    SIGTERM cancels it on its way out (SIGKILL cannot be caught: the job's --time, the
    longest host budget, ends it then)."""
    assert _jobs(slurm_lab) == []
    run = subprocess.Popen(
        [sys.executable, "-m", "gpufleet", "conformance", "-i",
         str(slurm_lab.config.inventory_dir), "--suite", "allreduce", "--launcher", "slurm",
         "--partition", "lab", "--json", str(tmp_path / "c.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_slurm_env(slurm_lab))
    try:
        deadline = time.monotonic() + 60
        while not _jobs(slurm_lab) and time.monotonic() < deadline:
            time.sleep(0.2)
        [job] = _jobs(slurm_lab)
        time.sleep(3)  # inside the run: facts gathered through job steps
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 143, err
    assert err.strip().splitlines()[-1] == "error: terminated (SIGTERM)"
    assert job not in _jobs_end(slurm_lab)
    assert not (tmp_path / "c.json").exists()


def test_an_error_finishing_the_run_still_cancels_the_allocation(
        slurm_lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A report that cannot be made (a full disk, a bad node file) used to skip scancel: the
    exclusive allocation then held every measured node for its whole time limit."""
    def disk_full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plugin, "report_of", disk_full)
    assert _jobs(slurm_lab) == []
    with pytest.raises(OSError, match="No space left"):
        app.conformance_cmd(str(slurm_lab.config.inventory_dir), suites="host_sizing",
                            launcher="slurm", partition="lab")
    assert _jobs_end(slurm_lab) == []


def test_the_slurm_launcher_leaves_out_a_drained_node_and_names_why(
        slurm_lab: Lab, slurm: Slurm, tmp_path: Path) -> None:
    _operator_drain(slurm_lab, "node03", "cabling (OPS-9)")
    try:
        report = tmp_path / "slurm.json"
        assert app.conformance_cmd(str(slurm_lab.config.inventory_dir), suites="firewall",
                                   json_path=str(report), launcher="slurm",
                                   drain_failed=True) == 1
        assert slurm.node("node03").reason == "cabling (OPS-9)"
        assert not slurm.node("node02").drained
    finally:
        _operator_resume(slurm_lab, "node03")
    results = {r["host"]: r for r in json.loads(report.read_text())["results"]}
    assert results["node01"]["outcome"] == results["node02"]["outcome"] == "pass"
    assert results["node03"]["outcome"] == "fail"
    assert results["node03"]["message"] == (
        "unreachable or facts failed: unreachable: node03: not allocated: IDLE+DRAIN in "
        "Slurm: cabling (OPS-9)")


def test_slurm_partition_as_inventory(slurm_lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(LabSlurm(slurm_lab.config).conf))
    source = f"slurm:lab:{slurm_lab.config.inventory_dir}"
    target = app.load_target(source, None)
    assert [h.name for h in target.hosts] == [f"node0{i}" for i in range(1, NODES + 1)]
    host = target.inventory.hosts["node03"]
    assert host.address == slurm_lab.node("node03").address
    assert {"all", "lab"} <= host.groups
    assert host.vars["slurm_healthcheck"] is True and "nccl_env" in host.vars
    assert app.facts(source) == 0
    assert app.conformance_cmd(source, suites="firewall") == 0
    with pytest.raises(InventoryError, match="Slurm has no partition 'gpu' "
                                             r"\(partitions: lab\)"):
        app.load_target("slurm:gpu", None)


def test_add_and_remove_keep_slurm_in_step(slurm_lab: Lab, slurm: Slurm) -> None:
    added = slurm_lab.add()
    try:
        node = _idle(slurm, added.name, f"{added.name} idle in Slurm")
        assert node.address == added.address and node.partitions == ("lab",)
    finally:
        slurm_lab.remove(added.name)
    assert [n.name for n in slurm.nodes()] == [f"node0{i}" for i in range(1, NODES + 1)]
    assert f"NodeName={added.name} " not in LabSlurm(slurm_lab.config).conf.read_text()


def test_down_stops_every_slurm_process(slurm_lab: Lab) -> None:
    slurm_dir = str(LabSlurm(slurm_lab.config).dir)
    slurm_lab.down()
    left = subprocess.run(["pgrep", "-af", slurm_dir], capture_output=True, text=True,
                          check=False).stdout
    assert left.strip() == ""
    assert not Path(slurm_dir).exists()
    listening = subprocess.run(["ss", "-Hltn", "sport = :6817"], capture_output=True,
                               text=True, check=True).stdout
    assert slurm_lab.config.controller_address not in listening
