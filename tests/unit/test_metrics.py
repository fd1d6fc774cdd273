"""node_exporter textfiles of drift and conformance, held to promtool and Prometheus' own
parser: the inventory label on every series, a limited run that keeps the other hosts
(two overlapping ones each other's), files of another inventory refused, two roles
managing one path refused."""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet import __version__, roles
from gpufleet.conformance import metrics as conformance_metrics
from gpufleet.conformance.results import ConformanceReport, Result
from gpufleet.drift import report as drift_report
from gpufleet.drift.compare import DriftItem, HostDrift
from gpufleet.drift.run import DriftRun
from gpufleet.inventory.load import load_inventory
from gpufleet.provision.engine import BadVariables, validate
from gpufleet.report import prometheus
from gpufleet.report.prometheus import MetricsError, Textfile
from tests.conftest import ROOT


def samples(text: str | bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample by name and sorted labels; a repeated one fails (the defect
    node_exporter logs as "collected before")."""
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    source = text.decode() if isinstance(text, bytes) else text
    for family in text_string_to_metric_families(source):
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in found, f"duplicate series {key}"
            found[key] = s.value
    return found


def promtool(path: Path) -> None:
    tool = shutil.which("promtool")
    assert tool, "promtool missing: ./scripts/setup installs Debian's prometheus package"
    proc = subprocess.run([tool, "check", "metrics"], input=path.read_bytes(),
                          capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


def _drift(*hosts: HostDrift) -> DriftRun:
    return DriftRun("inventory/prod", "d" * 64, {h.host: h for h in hosts}, [], [], [],
                    1764590000.0, 12.5, ["nccl_env"])


DRIFTED = HostDrift("gpu02", "drifted", [DriftItem(
    "gpu02", "nccl_env", 'file /etc/nccl.conf "quoted"', "file", "127 bytes", "absent")])


def test_every_series_carries_the_inventory_and_promtool_accepts_it(tmp_path: Path) -> None:
    run = _drift(HostDrift("gpu01", "clean"), DRIFTED,
                 HostDrift("gpu03", "unreachable", error="timed out"))
    path = tmp_path / "prod.prom"
    prometheus.write(path, drift_report.to_metrics(run, Textfile("prod", "drift")))
    promtool(path)
    found = samples(path.read_text())
    assert all(dict(labels)["inventory"] == "prod" for _, labels in found)
    assert found[("gpufleet_build_info", (("command", "drift"), ("inventory", "prod"),
                                          ("version", __version__)))] == 1
    assert found[("gpufleet_drift_items", (("host", "gpu02"), ("inventory", "prod"),
                                           ("item", 'file /etc/nccl.conf "quoted"'),
                                           ("role", "nccl_env")))] == 1
    assert found[("gpufleet_drift_hosts", (("inventory", "prod"), ("status", "clean")))] == 1
    assert found[("gpufleet_host_reachable", (("host", "gpu03"), ("inventory", "prod")))] == 0
    assert found[("gpufleet_drift_last_run_duration_seconds", (("inventory", "prod"),))] == 12.5


def test_a_limited_run_updates_only_its_hosts(tmp_path: Path) -> None:
    """The nightly file holds gpu01-gpu03; an operator's --limit gpu02 after fixing it
    changes gpu02's series and keeps the others'; the fleet's counts follow."""
    path = tmp_path / "prod.prom"
    full = _drift(HostDrift("gpu01", "clean"), DRIFTED, HostDrift("gpu03", "clean"))
    prometheus.write(path, drift_report.to_metrics(full, Textfile("prod", "drift")))
    previous = prometheus.replaced(str(path), "prod", "drift")
    fixed = _drift(HostDrift("gpu02", "clean"))
    prometheus.write(path, drift_report.to_metrics(fixed, Textfile("prod", "drift"), previous))
    promtool(path)
    found = samples(path.read_text())
    status = {dict(labels)["host"]: dict(labels)["status"] for name, labels in found
              if name == "gpufleet_drift_host_status" and found[(name, labels)] == 1}
    assert status == {"gpu01": "clean", "gpu02": "clean", "gpu03": "clean"}
    assert not [k for k in found if k[0] == "gpufleet_drift_items"]
    assert found[("gpufleet_drift_hosts", (("inventory", "prod"), ("status", "clean")))] == 3
    assert found[("gpufleet_drift_last_run_hosts", (("inventory", "prod"),))] == 1


OVERLAPPING_RUN = """
import sys
import time
from pathlib import Path

from gpufleet import app
from gpufleet.conformance.results import ConformanceReport, Result

inventory, host, role, prom, meet = sys.argv[1:]
meet_at = Path(meet)
write = app.conformance_metrics.to_metrics


def wait_for(*names):
    deadline = time.monotonic() + 60
    while not all((meet_at / n).exists() for n in names):
        assert time.monotonic() < deadline, names
        time.sleep(0.02)


def run_suites(target, options):
    (meet_at / host).touch()
    wait_for("gpu01", "gpu02")  # both runs read the textfile when they started
    if role == "second":
        wait_for("first-writing")  # and this one writes while the first one does
    return ConformanceReport(inventory, "d" * 64, time.time(), 1.0,
                             [Result("stack", "test_role_converged[nccl]", host, "pass", "",
                                     0.1, {})])


def slow_write(report, textfile, previous=None):
    if role == "first":
        (meet_at / "first-writing").touch()
        time.sleep(1.5)
    return write(report, textfile, previous)


app.run_suites = run_suites
app.conformance_metrics.to_metrics = slow_write
sys.exit(app.conformance_cmd(inventory, limit=host, suites="stack", prometheus_path=prom))
"""


def test_overlapping_limited_runs_keep_each_other_s_series(tmp_path: Path) -> None:
    """Two processes: --limit gpu01 and --limit gpu02 of one inventory start together, and
    the second writes while the first is writing: the file ends with both hosts (each
    re-reads the file under the lock when it writes), and the lock file is not a .prom."""
    inventory = tmp_path / "prod.yml"
    inventory.write_text("all:\n  vars:\n    ansible_connection: local\n"
                         "  hosts:\n    gpu01:\n    gpu02:\n")
    script = tmp_path / "run.py"
    script.write_text(OVERLAPPING_RUN)
    path = tmp_path / "textfiles" / "conformance-prod.prom"
    path.parent.mkdir()
    runs = [subprocess.Popen([sys.executable, str(script), str(inventory), host, role,
                              str(path), str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE,
                             text=True)
            for host, role in (("gpu01", "first"), ("gpu02", "second"))]
    for proc in runs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    promtool(path)
    found = samples(path.read_text())
    results = {dict(labels)["host"] for name, labels in found
               if name == "gpufleet_conformance_check_result"}
    assert results == {"gpu01", "gpu02"}
    assert found[("gpufleet_conformance_hosts", (("inventory", "prod"), ("status", "PASS")))] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["conformance-prod.prom",
                                                             "conformance-prod.prom.lock"]


def test_a_lock_held_too_long_is_an_error_naming_the_lock_file(tmp_path: Path) -> None:
    path = tmp_path / "prod.prom"
    with open(f"{path}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(MetricsError, match=re.escape(f"{path}.lock stayed locked")), \
                prometheus._locked(Path(f"{path}.lock"), timeout_s=0.2):
            pass


@pytest.mark.parametrize(("content", "message"), [
    ("# TYPE node_load1 gauge\nnode_load1 3\n", "it holds metrics gpufleet did not write "
                                                  "(node_load1)"),
    ('gpufleet_build_info{command="drift",inventory="staging",version="0.1.0"} 1\n',
     "it holds the metrics of drift of inventory staging, not drift of inventory prod"),
    ('gpufleet_build_info{command="conformance",inventory="prod",version="0.1.0"} 1\n',
     "it holds the metrics of conformance of inventory prod, not drift of inventory prod"),
    ("this is not { a textfile\n", "not a Prometheus textfile"),
])
def test_a_file_that_is_not_this_inventorys_is_not_overwritten(
        tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "other.prom"
    path.write_text(content)
    with pytest.raises(MetricsError, match=re.escape(message)):
        prometheus.replaced(str(path), "prod", "drift")


def test_the_label_is_the_inventorys_name_or_its_variable(tmp_path: Path) -> None:
    (tmp_path / "prod").mkdir()
    (tmp_path / "prod" / "hosts.ini").write_text("gpu01\ngpu02\n")
    inventory = load_inventory(tmp_path / "prod")
    assert prometheus.inventory_label(inventory, inventory.select()) == "prod"
    named = tmp_path / "east.yml"
    named.write_text("all:\n  vars: {gpufleet_metrics_name: us-east}\n  hosts: {gpu01: {}}\n")
    inventory = load_inventory(named)
    assert prometheus.inventory_label(inventory, inventory.select()) == "us-east"
    mixed = tmp_path / "mixed.yml"
    mixed.write_text("all:\n  hosts:\n    a: {gpufleet_metrics_name: x}\n"
                     "    b: {gpufleet_metrics_name: y}\n")
    inventory = load_inventory(mixed)
    with pytest.raises(MetricsError, match="gpufleet_metrics_name differs between the hosts"):
        prometheus.inventory_label(inventory, inventory.select())


def test_two_roles_managing_one_path_are_refused_before_the_run(tmp_path: Path) -> None:
    """The defect: nccl_conf_path equal to nccl_env_file made drift write one series
    twice (and the two files overwrite each other on the node)."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    gpu01:\n      nccl_env: {NCCL_DEBUG: WARN}\n"
                   "      nccl_conf_path: /etc/default/gpufleet-nccl\n")
    with pytest.raises(BadVariables) as caught:
        validate(load_inventory(inv).select(), roles.ALL)
    assert str(caught.value) == (
        f"host gpu01: nccl_env's nccl_conf_path ({inv}:5) and nccl_env's nccl_env_file are "
        "both /etc/default/gpufleet-nccl: one file can be managed by one of them only; give "
        "each its own path")


def _result(host: str, suite: str, check: str, outcome: str, message: str = "",
            **properties: object) -> Result:
    return Result(suite, check, host, outcome, message, 1.0, dict(properties))


def _verdict(unit: str, median: float, gate: float | None, baseline: float | None = None
             ) -> dict[str, object]:
    found: dict[str, object] = {"unit": unit, "median": median, "gate": gate, "passed": True}
    if baseline is not None:
        found["baseline"] = baseline
    return found


def _exported(tmp_path: Path, report: ConformanceReport) -> Callable[..., float]:
    """The report's textfile, held to promtool; a sample's value by name and labels."""
    path = tmp_path / "conformance.prom"
    prometheus.write(path, conformance_metrics.to_metrics(report, Textfile("prod", "conformance")))
    promtool(path)
    found = samples(path.read_text())

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted({"inventory": "prod", **labels}.items())))]

    return value


def test_conformance_exports_results_verdicts_and_figures_in_base_units(tmp_path: Path) -> None:
    report = ConformanceReport("inventory/prod", "d" * 64, 1764590000.0, 300.0, [
        _result("gpu01", "allreduce", "test_each_node_alone", "pass", verdicts={
            "allreduce.busbw.1048576": _verdict("GB/s", 310.5, 300.0, 320.0),
            "allreduce.busbw.4096": _verdict("GB/s", 2.5, None)}),
        _result("gpu01", "thermal", "test_thermal_soak", "pass", max_temp_c=71.0, verdicts={
            "thermal.tflops.GPU0": _verdict("TFLOPS", 612.0, 500.0)}),
        _result("gpu02", "firewall", "test_live_rules_admit_the_cluster", "fail",
                "unknown: ruleset too large to read in 1 s"),
        _result("gpu02", "gpu", "test_health", "skip", "no GPUs"),
        _result("fleet", "ddp", "test_efficiency_across_nodes", "pass", verdicts={
            "ddp.efficiency_across_nodes": _verdict("", 0.93, 0.8)}),
    ])
    value = _exported(tmp_path, report)
    assert value("gpufleet_conformance_allreduce_busbw_bytes_per_second", host="gpu01",
                 check="each_node_alone", size_bytes="1048576") == 310.5e9
    assert value("gpufleet_conformance_allreduce_busbw_gate_bytes_per_second", host="gpu01",
                 check="each_node_alone", size_bytes="1048576") == 300e9
    assert value("gpufleet_conformance_allreduce_busbw_baseline_bytes_per_second",
                 host="gpu01", check="each_node_alone", size_bytes="1048576") == 320e9
    assert value("gpufleet_conformance_thermal_matmul_flops", host="gpu01",
                 check="thermal_soak", gpu="0") == 612e12
    assert value("gpufleet_conformance_thermal_max_temperature_celsius", host="gpu01",
                 check="thermal_soak") == 71.0
    assert value("gpufleet_conformance_ddp_efficiency_across_nodes_ratio", host="fleet",
                 check="efficiency_across_nodes") == 0.93
    assert value("gpufleet_conformance_check_result", host="gpu02", suite="firewall",
                 check="live_rules_admit_the_cluster", outcome="unknown") == 0
    assert value("gpufleet_conformance_check_result", host="gpu02", suite="gpu",
                 check="health", outcome="skip") == 0
    assert value("gpufleet_conformance_host_status", host="gpu02", status="FAIL") == 1
    assert value("gpufleet_conformance_hosts", status="PASS") == 1
    assert value("gpufleet_conformance_last_run_duration_seconds") == 300.0


def test_conformance_exports_the_line_rate_and_the_counters_that_moved(tmp_path: Path
                                                                       ) -> None:
    moved = {"deltas": [{"port": "eth1", "counter": "statistics/rx_dropped", "kind": "drops",
                         "priority": None, "value": 18342}], "tcp_retransmits": 7}
    report = ConformanceReport("inventory/prod", "d" * 64, 1764590000.0, 300.0, [
        _result("fleet", "allreduce", "test_all_nodes_together", "pass",
                line_rate_fraction=0.82, line_rate_gbps=400.0, line_rate_nics="gpu01: ..."),
        _result("gpu07", "allreduce", "test_nic_counters_during_allreduce", "fail",
                "gpu07: 18,342 drops", counters={"all": moved}),
        _result("gpu07", "reachability", "test_nic_counters_during_reachability", "pass",
                counters={"connects": {"deltas": [], "tcp_retransmits": 0}}),
    ])
    value = _exported(tmp_path, report)
    assert value("gpufleet_conformance_allreduce_line_rate_ratio", host="fleet",
                 check="all_nodes_together") == 0.82
    assert value("gpufleet_conformance_allreduce_line_rate_bytes_per_second", host="fleet",
                 check="all_nodes_together") == 50e9
    assert value("gpufleet_conformance_nic_statistic_delta", host="gpu07",
                 check="nic_counters_during_allreduce", phase="all", port="eth1",
                 counter="statistics/rx_dropped", kind="drops") == 18342
    assert value("gpufleet_conformance_tcp_retransmitted_segments", host="gpu07",
                 check="nic_counters_during_allreduce", phase="all") == 7
    assert value("gpufleet_conformance_tcp_retransmitted_segments", host="gpu07",
                 check="nic_counters_during_reachability", phase="connects") == 0
