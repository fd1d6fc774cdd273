"""The standing watch between runs, on the lab's real Slurm: each fault injected on one node
between two runs of the health check (the watch's counters in a sysfs tree and stand-in
nvidia-smi, Xids in a stand-in kernel log) drains that node, and only it, with a reason
naming the counter, its rate and its window; a silenced finding lets its node
resume; a clean lab whose counters move just below their limits, and whose ports flap once,
drains nothing in 100 runs (25 on each node).

Four nodes run slurmd; slurmd never runs the health check itself (HealthCheckInterval=0):
each test runs it as slurmd would (its environment holds only SLURMD_NODENAME), with
``--now`` five minutes after the run before, so hours of the watch's windows pass in
seconds. The slurm_healthcheck role installs the health check and the watch, whose
``sys_root`` is tests/lab/fakesys.py's tree.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from gpufleet.lab.slurm import LabSlurm, SlurmSettings
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.roles import slurm_healthcheck
from gpufleet.slurm.client import Slurm
from tests.conftest import ROOT
from tests.lab import fakegpu, fakesys
from tests.lab.conftest import lab_config_for, node_sh
from tests.unit.test_metrics import promtool

NODES = ("node01", "node02", "node03", "node04")
HEALTHCHECK = "/usr/local/sbin/gpufleet-healthcheck"
STATE_DIR = "/var/lib/gpufleet"
PROM_DIR = "/var/lib/gpufleet-lab-prom"
STEP_S = 300  # between two runs: slurm.conf's HealthCheckInterval=300
RUNS = 25  # on each node: 100 runs in all, two hours of the watch's time
GPU0, GPU1 = fakesys.GPUS
NIC0 = next(a for a, name in fakesys.NICS.items() if name == "mlx5_0")
DMESG = "/usr/local/bin/dmesg"


class Clock:
    """The time every run's --now gives the watch: five minutes later each round."""

    def __init__(self) -> None:
        self.now = int(time.time())

    def tick(self) -> int:
        self.now += STEP_S
        return self.now


@pytest.fixture(scope="module")
def watch_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Four nodes with Slurm, stand-in GPUs, a counter tree each, the health check and the
    watch installed by the role."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    inventory_dir = tmp_path_factory.mktemp("watch-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    config = lab_config_for("wt", 14, inventory_dir)
    (inventory_dir / "group_vars" / "lab.yml").write_text(yaml.safe_dump({
        "gpufleet_scheduler": "slurm", "gpufleet_slurm_conf": str(LabSlurm(config).conf),
        "gpu_count": 2, "slurm_healthcheck": True, "nccl_env": None,
        "node_watch_sys_root": fakesys.ROOT, "node_watch_textfile_dir": PROM_DIR}))
    lab = Lab(config)
    lab.down()
    lab.up(len(NODES), slurm=SlurmSettings(health_check_interval=0))
    for node in NODES:
        fakegpu.install(lab, node)
        fakesys.install(lab, node)
    inventory = load_inventory(inventory_dir)
    outcomes = provision(inventory, inventory.select("lab"), [slurm_healthcheck.ROLE],
                         RunOptions())
    assert {o.status for o in outcomes.values()} <= {"ok", "changed"}, outcomes
    yield lab
    lab.down()


@pytest.fixture(scope="module")
def clock(watch_lab: Lab) -> Clock:
    return Clock()


@pytest.fixture
def slurm(watch_lab: Lab) -> Slurm:
    return LabSlurm(watch_lab.config).client


def _as_slurmd(node: str, now: int) -> str:
    """The health check as slurmd runs it: only SLURMD_NODENAME in its environment."""
    return f"env -i SLURMD_NODENAME={node} {HEALTHCHECK} --now {now}"


@dataclass
class Run:
    """One health check run: its exit status and output."""

    rc: int
    out: str


def _round(lab: Lab, clock: Clock, nodes: tuple[str, ...] = NODES) -> dict[str, Run]:
    """One health check run on every node (or ``nodes``), side by side, five minutes after
    the last round."""
    now = clock.tick()
    procs = {node: subprocess.Popen(lab.exec_argv(node, f"{_as_slurmd(node, now)} 2>&1"),
                                    stdout=subprocess.PIPE, text=True) for node in nodes}
    runs = {}
    for node, proc in procs.items():
        out, _ = proc.communicate(timeout=60)
        runs[node] = Run(proc.returncode, out)
    return runs


def _drained(slurm: Slurm) -> dict[str, str]:
    return {n.name: n.reason or "" for n in slurm.nodes() if n.drained}


def _forget(lab: Lab, node: str) -> None:
    """The node's watch history gone (a fresh node), its tree and GPUs healthy again."""
    node_sh(lab, node, f"rm -f {STATE_DIR}/watch*.json {DMESG} && {fakesys.install_command()} "
                       f"&& {fakegpu.clear_errors_command()}")


def _resume(lab: Lab, slurm: Slurm, node: str) -> None:
    if node in _drained(slurm):
        conf = str(LabSlurm(lab.config).conf)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], check=True,
                       timeout=30, env={**os.environ, "SLURM_CONF": conf})


def _kernel_log(lab: Lab, node: str, lines: list[str]) -> None:
    """A stand-in dmesg on ``node`` that prints ``lines``."""
    text = "".join(f"{line}\n" for line in lines)
    node_sh(lab, node, f"printf '%s\\n' '#!/bin/sh' {shlex.quote('printf %s ' + shlex.quote(text))}"
                       f" > {DMESG} && chmod 755 {DMESG}")


XID_154 = ("[ 8301.870495] NVRM: Xid (PCI:0000:00:06): 154, GPU recovery action changed from "
           "0x0 (None) to 0x1 (GPU Reset Required)")
XID_31 = ("[{at}] NVRM: Xid (PCI:0000:00:07): 31, pid=4242, name=python3, Ch 00000008, intr "
          "00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f8a_00000000. "
          "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ")


@dataclass(frozen=True)
class Fault:
    """What injects a fault on a node between two rounds, how many rounds it takes to be
    confirmed, and what the node's drain reason then says."""

    inject: Callable[[Lab, str], None]
    reason: str  # a regex the reason matches
    rounds: int = 1


FAULTS = {
    "symbol_error": Fault(
        lambda lab, n: fakesys.add(lab, n, fakesys.counter("mlx5_0/1", "symbol_error"), 121),
        r"^gf hc/watch: mlx5_0/1 symbol_error \+121 in 5m0s \(121\.0/h, limit 120/h over 1h\)"),
    "flaps": Fault(
        lambda lab, n: fakesys.add(lab, n, fakesys.counter("mlx5_1/1", "link_downed"), 3),
        r"^gf hc/watch: mlx5_1/1 went down 3 times in 12h0m \(limit 3 within 12h"),
    "pcie_width": Fault(
        lambda lab, n: fakesys.write(lab, n, {
            f"{fakesys.device(GPU1)}/current_link_width": "8\n"}),
        rf"^gf hc/watch: {GPU1} \(GPU\) PCIe link x8, capable of x16", rounds=2),
    "aer_fatal": Fault(
        lambda lab, n: fakesys.write(lab, n, {
            f"{fakesys.device(NIC0)}/aer_dev_fatal": fakesys.aer_text("fatal", 1)}),
        rf"^gf hc/watch: {NIC0} aer_fatal \+1 in \d+m0s \(any increase opens; held 1d\)"),
    "nvlink_replay": Fault(
        lambda lab, n: fakegpu.set_nvlink_errors(lab, n, {(1, 7, "Replay Errors"): 4}),
        r"^gf hc/watch: gpu1/link7 replay_errors \+4 in \d+m0s \(any increase opens; held "
        r"1h\)"),
    "ecc_uncorrectable": Fault(
        lambda lab, n: fakegpu.set_memory_errors(lab, n, {
            ("00000000:00:07.0", "ECC Errors/Aggregate/DRAM Uncorrectable"): "2"}),
        r"^gf hc/watch: 0000:00:07\.0 ecc_uncorrectable \+2 in \d+m0s \(any increase opens; "
        r"held 1d\)"),
    "xid_reset": Fault(
        lambda lab, n: _kernel_log(lab, n, [XID_154]),
        r"^gf hc/xid: Xid 154 on 0000:00:06 \(GPU Recovery Action Changed\): GPU Reset "
        r"Required \(reset\)"),
    "xid_repeated": Fault(
        lambda lab, n: _kernel_log(lab, n, [XID_31.format(at=at) for at in
                                            ("1000.500000", "2200.100000", "3400.700000")]),
        r"^gf hc/xid: Xid 31 on 0000:00:07 \(GPU memory page fault\): RESTART_APP \(reset: 3 "
        r"times in 1 h on this GPU\)"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_between_two_runs_drains_that_node_alone(watch_lab: Lab, clock: Clock,
                                                         slurm: Slurm, fault: str) -> None:
    target = NODES[list(FAULTS).index(fault) % len(NODES)]
    case = FAULTS[fault]
    try:
        before = _round(watch_lab, clock, (target,))  # the others ran in the last test
        assert before[target].rc == 0, before[target].out
        assert _drained(slurm) == {}
        case.inject(watch_lab, target)
        for _ in range(case.rounds - 1):  # seen, not yet confirmed: pending
            pending = _round(watch_lab, clock)
            assert "PASS watch: " in pending[target].out and " 1 pending" in \
                pending[target].out, pending[target].out
            assert _drained(slurm) == {}
        after = _round(watch_lab, clock)
        drained = _drained(slurm)
        assert list(drained) == [target], (drained, after[target].out)
        assert re.search(case.reason, drained[target]), (drained[target], after[target].out)
        assert {n: r.rc for n, r in after.items() if n != target} == \
            {n: 0 for n in NODES if n != target}, after
    finally:
        _forget(watch_lab, target)
        _resume(watch_lab, slurm, target)


def test_a_silenced_finding_resumes_its_node_and_the_check_names_it(watch_lab: Lab,
                                                                     clock: Clock,
                                                                     slurm: Slurm) -> None:
    node, ident = "node02", "rdma/mlx5_0/1/symbol_error"
    try:
        _round(watch_lab, clock, (node,))
        fakesys.add(watch_lab, node, fakesys.counter("mlx5_0/1", "symbol_error"), 500)
        _round(watch_lab, clock, (node,))
        assert _drained(slurm)[node].startswith("gf hc/watch: mlx5_0/1 symbol_error +500 ")
        until = clock.now + 3600
        node_sh(watch_lab, node, f"/usr/local/sbin/gpufleet-watch silence {ident} --until "
                                 f"{until} --reason 'cable swap booked' --now {clock.now}")
        run = _round(watch_lab, clock, (node,))[node]
        shown = time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(until))
        assert run.rc == 0 and f"; silenced: {ident} until {shown}" in run.out, run.out
        assert f"slurm: resumed {node}: was gf hc/watch: " in run.out, run.out
        assert _drained(slurm) == {}
    finally:
        _forget(watch_lab, node)
        _resume(watch_lab, slurm, node)


LOOP = """\
set -u
r={root}
p=$r/class/infiniband
bump() {{ echo $(( $(cat "$1") + $2 )) > "$1.new" && mv "$1.new" "$1"; }}
aer() {{ printf 'RxErr %s\\nBadTLP 0\\nBadDLLP 0\\nRollover 0\\nTimeout 0\\nNonFatalErr 0\\n\
CorrIntErr 0\\nHeaderOF 0\\nTOTAL_ERR_COR %s\\n' "$2" "$2" > "$1.new" && mv "$1.new" "$1"; }}
: > /tmp/watch-times
failed=0
i=1
while [ $i -le {runs} ]; do
  bump $p/mlx5_0/ports/1/counters/symbol_error 10
  bump $p/mlx5_0/ports/1/counters/port_rcv_errors 2900
  bump $p/mlx5_1/ports/1/hw_counters/out_of_sequence 29000
  aer $r/bus/pci/devices/{gpu}/aer_dev_correctable $((i * 39))
  [ $i -eq {flap} ] && bump $p/mlx5_0/ports/1/counters/link_downed 1
  env -i SLURMD_NODENAME={node} {healthcheck} --now $(({start} + i * {step})) > /tmp/watch-run \
    2>&1 || {{ failed=$((failed + 1)); echo "run $i:"; cat /tmp/watch-run; }}
  grep '^healthcheck ' /tmp/watch-run >> /tmp/watch-times
  i=$((i + 1))
done
echo "failed=$failed"
grep '^PASS watch: ' /tmp/watch-run
cat /tmp/watch-times
"""


def test_a_hundred_runs_on_a_clean_lab_drain_nothing(watch_lab: Lab, clock: Clock,
                                                     slurm: Slurm, tmp_path: Path) -> None:
    """Every counter moves just below its rule's limit (symbol errors 120 an hour: one below
    the limit; port_rcv_errors and out_of_sequence under their per-second limits; AER
    correctable under 8 a minute), and each node's mlx5_0/1 flaps once: 25 runs a node, 100
    in all, two hours of the watch's time: no failure, no drain; the one flap is recorded in
    the textfile, never a finding."""
    start = clock.now
    started = time.monotonic()
    procs = {node: subprocess.Popen(watch_lab.exec_argv(node, LOOP.format(
        root=fakesys.ROOT, runs=RUNS, gpu=GPU0, flap=RUNS // 2, node=node,
        healthcheck=HEALTHCHECK, start=start, step=STEP_S)), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in NODES}
    outs = {node: proc.communicate(timeout=600)[0] for node, proc in procs.items()}
    took = time.monotonic() - started
    clock.now = start + RUNS * STEP_S
    for out in outs.values():
        assert "failed=0\n" in out, out
        assert re.search(r"PASS watch: \d+ series, 0 pending\n", out), out
    assert _drained(slurm) == {}
    seconds = sorted(float(t) for out in outs.values()
                     for t in re.findall(r"^healthcheck node\d+: .* in (\d+\.\d+)s$", out,
                                         re.MULTILINE))
    assert len(seconds) == RUNS * len(NODES), outs
    print(f"{RUNS} health check runs on each of {len(NODES)} nodes side by side: {took:.1f} s; "
          f"each run (the health check's own time) median {statistics.median(seconds):.2f} s, "
          f"worst {seconds[-1]:.2f} s")
    assert seconds[-1] < 9  # the health check's budget (slurm_healthcheck_budget_s)
    prom = node_sh(watch_lab, "node03", f"cat {PROM_DIR}/gpufleet_watch.prom")
    assert 'gpufleet_watch_flaps{subject="mlx5_0/1",window="43200"} 1\n' in prom, prom
    assert "gpufleet_watch_finding{" not in prom, prom
    rate = re.search(r'gpufleet_watch_rate_per_hour\{subject="mlx5_0/1",counter="symbol_error",'
                     r'window="3600"\} (\S+)', prom)
    assert rate and float(rate.group(1)) == 120.0, prom
    (tmp_path / "gpufleet_watch.prom").write_text(prom)
    promtool(tmp_path / "gpufleet_watch.prom")
