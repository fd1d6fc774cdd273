"""The host's performance state, multi-rail ARP and RoCE QoS on lab nodes: each fault injected
on one node is seen on that node alone, named, and provisioning puts it right.

Three nodes, each with the stand-ins of tests/lab/fakehost.py: its own kernel state under
``kernel_state_root`` (seeded at every boot as a kernel would), two dummy fabric interfaces in
one subnet, a ConnectX-7's ``mlnx_qos`` that forgets its QoS at a reboot. The host_tuning,
roce_qos and slurm_healthcheck roles converge them once; no Slurm runs (the health check is
run by hand).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from gpufleet.drift.compare import HostDrift
from gpufleet.drift.run import DriftOptions, check_fleet
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.target import Target
from gpufleet.lab.cluster import Lab
from gpufleet.provision.engine import RunOptions, provision
from gpufleet.provision.role import Role
from gpufleet.roles import host_tuning, roce_qos, slurm_healthcheck
from tests.conftest import ROOT
from tests.lab import fakehost
from tests.lab.conftest import lab_config_for, node_sh

NODES = ("node01", "node02", "node03")
ROLES: list[Role] = [roce_qos.ROLE, host_tuning.ROLE, slurm_healthcheck.ROLE]
HEALTHCHECK = "/usr/local/sbin/gpufleet-healthcheck"


@pytest.fixture(scope="module")
def tuning_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """Three nodes with the stand-ins, converged by the three roles."""
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    inventory_dir = tmp_path_factory.mktemp("tuning-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    (inventory_dir / "group_vars" / "lab.yml").write_text(yaml.safe_dump({
        "host_tuning": True, "kernel_state_root": fakehost.KERNEL_ROOT,
        "fabric_interfaces": list(fakehost.PORTS),
        "roce_qos": True, "roce_qos_ports": list(fakehost.PORTS),
        "rdma": {"pfc_priority": 3, "trust": "dscp", "ecn": True},
        "slurm_healthcheck": True}))
    lab = Lab(lab_config_for("ht", 18, inventory_dir))
    lab.down()
    lab.up(len(NODES))
    for node in NODES:
        fakehost.install(lab, node)
    converge(lab, ":".join(NODES))
    yield lab
    lab.down()


def converge(lab: Lab, limit: str) -> None:
    inventory = load_inventory(lab.config.inventory_dir)
    outcomes = provision(inventory, inventory.select(limit), ROLES, RunOptions())
    assert {o.status for o in outcomes.values()} <= {"ok", "changed"}, outcomes


def drift(lab: Lab, roles: list[Role] | None = None) -> dict[str, HostDrift]:
    target = Target.select(load_inventory(lab.config.inventory_dir), "lab")
    return check_fleet(target, DriftOptions(roles=roles or ROLES)).hosts


def drifted(hosts: dict[str, HostDrift]) -> dict[str, list[str]]:
    """The hosts that are not clean, and their items (or their error)."""
    return {name: [i.item for i in h.items] or [str(h.error)] for name, h in hosts.items()
            if h.status != "clean"}


def healthcheck(lab: Lab, node: str) -> str:
    """The roce_qos line of the periodic health check on ``node``."""
    out = node_sh(lab, node, f"{HEALTHCHECK} --context periodic --no-drain", check=False)
    return next(line for line in out.splitlines() if " roce_qos: " in line)


def test_the_converged_lab_is_clean(tuning_lab: Lab) -> None:
    assert drifted(drift(tuning_lab)) == {}
    assert healthcheck(tuning_lab, "node02") == "PASS roce_qos: 2 port(s) as declared (mlnx_qos)"


FAULTS: dict[str, tuple[Callable[[Lab], object], str]] = {
    "governor on powersave": (
        lambda lab: fakehost.write(lab, "node02",
                                   "/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor",
                                   "powersave"),
        "host_tuning/cpufreq governor"),
    "NUMA balancing on": (
        lambda lab: fakehost.write(lab, "node02", "/proc/sys/kernel/numa_balancing", "1"),
        "host_tuning/sysctl kernel.numa_balancing"),
    "swap on": (lambda lab: fakehost.add_swap(lab, "node02"), "host_tuning/swap active"),
    "arp_ignore unset on a rail": (
        lambda lab: node_sh(lab, "node02", "sysctl -q -w net.ipv4.conf.fab1.arp_ignore=0"),
        "host_tuning/sysctl net.ipv4.conf.fab1.arp_ignore"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_drifts_its_node_alone_and_provisioning_restores_it(
        tuning_lab: Lab, fault: str) -> None:
    inject, item = FAULTS[fault]
    inject(tuning_lab)
    try:
        assert drifted(drift(tuning_lab, [host_tuning.ROLE])) == {"node02": [item]}
    finally:
        converge(tuning_lab, "node02")
    assert drifted(drift(tuning_lab, [host_tuning.ROLE])) == {}


def test_a_roce_port_whose_pfc_a_reboot_cleared_is_seen_and_restored(tuning_lab: Lab) -> None:
    tuning_lab.reboot("node02")
    try:
        hosts = drift(tuning_lab, [roce_qos.ROLE])
        assert drifted(hosts) == {"node02": ["roce_qos/qos fab0", "roce_qos/qos fab1"]}
        item = hosts["node02"].items[0]
        assert (item.actual, item.desired) == ("trust pcp, PFC off, ECN off",
                                               "trust dscp, PFC 3, ECN on")
        line = healthcheck(tuning_lab, "node02")
        assert line.startswith("FAIL roce_qos: fab0: trust pcp, expected dscp, PFC on no "
                               "priority, expected 3, ECN roce_np off on priority 3"), line
        assert "; fab1: " in line
        assert healthcheck(tuning_lab, "node01").startswith("PASS roce_qos: ")
    finally:
        converge(tuning_lab, "node02")
    assert drifted(drift(tuning_lab)) == {}
    assert healthcheck(tuning_lab, "node02").startswith("PASS roce_qos: ")


def test_the_stand_in_tree_is_the_node_s_own(tuning_lab: Lab) -> None:
    """What the roles wrote stayed in the node's stand-in (the controller's kernel is not
    touched)."""
    out = node_sh(tuning_lab, "node01", f"cat {fakehost.KERNEL_ROOT}/proc/sys/kernel/"
                                        "numa_balancing /etc/sysctl.d/60-gpufleet-host-tuning.conf")
    assert out.splitlines()[0] == "0"
    assert "net.ipv4.conf.fab0.arp_ignore = 1" in out
    assert not Path(fakehost.KERNEL_ROOT).exists()
