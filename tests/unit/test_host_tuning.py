"""The host_tuning role: its fact's parser on real captures (tests/fixtures/host), and its plan
from hand-built facts: the governor, NUMA balancing, swap, THP, the C-state limit, multi-rail
ARP and the neighbour thresholds sized for the fleet."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpufleet.errors import ParseError, VarError
from gpufleet.facts.formats import FileState
from gpufleet.facts.gather import Facts
from gpufleet.facts.parsers import host
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.provision.engine import validate
from gpufleet.provision.plan import MANUAL, Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleVars
from gpufleet.roles import host_tuning
from gpufleet.roles.host_tuning import ROLE, SCRIPT, SYSCTL_FILE, UNIT, UNIT_LINK
from tests.conftest import FIXTURES

CAPTURES = FIXTURES / "host"


def capture(name: str) -> str:
    return (CAPTURES / name).read_text()


# ---- the parser on real captures -------------------------------------------------------------

def test_the_build_machine_s_own_state() -> None:
    state = host.host_state(capture("host-state-debian12.txt"))
    assert state["governors"] == {} and state["cpufreq_driver"] is None  # a KVM guest
    assert state["numa_balancing"] == 0
    assert (state["thp_enabled"], state["thp_defrag"]) == ("madvise", "madvise")
    assert (state["cpuidle_driver"], state["intel_idle_max_cstate"],
            state["processor_max_cstate"]) == ("none", 9, 8)
    assert state["gc_thresh"] == {1: 256, 2: 1024, 3: 2048}
    assert state["swaps"] == [] and state["fstab_swaps"] == []
    assert state["net"]["eth0"] == {"arp_ignore": 0, "arp_announce": 0, "rp_filter": 0}
    assert set(state["net"]) == {"all", "default", "eth0"}
    assert state["cmdline"].startswith("mitigations=auto")


def test_a_network_namespace_has_no_default_neighbour_table() -> None:
    state = host.host_state(capture("host-state-netns-debian12.txt"))
    assert state["gc_thresh"] == {}
    assert set(state["net"]) == {"all", "default", "lo"}


def test_intel_pstate_on_powersave() -> None:
    read = ("scaling_governor:", "scaling_driver:", "scaling_available_governors:")
    lines = [line for line in capture("cpufreq-grep-intel-pstate-ubuntu-forums.txt")
             .splitlines() if line.startswith("/") and any(r in line for r in read)]
    state = host.host_state("\n".join([*lines, *capture("proc-swaps-debian12.txt")
                                       .replace("Filename", "/proc/swaps:Filename")
                                       .splitlines()]))
    assert state["governors"] == {0: "powersave"}
    assert state["cpufreq_driver"] == "intel_pstate"
    assert state["available_governors"] == ["performance", "powersave"]


def test_thp_settings_are_the_bracketed_choice() -> None:
    pairs = dict(host.grep_lines(capture("thp-grep-lkml-rientjes-2023.txt")))
    assert host.selected(pairs["/sys/kernel/mm/transparent_hugepage/enabled"], "e") == "always"
    assert host.selected(pairs["/sys/kernel/mm/transparent_hugepage/defrag"], "d") == "madvise"
    with pytest.raises(ParseError, match="one \\[choice\\]"):
        host.selected("always madvise never", "enabled")


@pytest.mark.parametrize(("name", "swaps"), [
    ("proc-swaps-debian12.txt", []),
    ("proc-swaps-swap-img-kubelet-4204d4.txt",
     [{"name": "/swap.img", "type": "file", "size_kib": 4009980, "used_kib": 0,
       "priority": -2}]),
    ("proc-swaps-ubuntu-forums-system-info.txt",
     [{"name": "/swap.img", "type": "file", "size_kib": 8388604, "used_kib": 0,
       "priority": -2}]),
])
def test_proc_swaps(name: str, swaps: list[dict[str, Any]]) -> None:
    assert host.proc_swaps(capture(name)) == swaps


def test_proc_swaps_decodes_the_kernel_s_escapes_and_refuses_no_header() -> None:
    text = "Filename\tType\tSize\tUsed\tPriority\n/mnt/my\\040swap file 1024 0 -2\n"
    assert host.proc_swaps(text)[0]["name"] == "/mnt/my swap"
    with pytest.raises(ParseError, match="header"):
        host.proc_swaps("")


def test_fstab_swap_entries() -> None:
    lines = list(enumerate(capture("fstab-ubuntu-forums-system-info.txt").splitlines(), 1))
    assert host.fstab_swaps(lines) == [{"line": 3, "spec": "/swap.img"}]
    assert host.fstab_swaps([(1, "#/swap.img none swap sw 0 0")]) == []


def test_the_fact_is_refused_without_proc_swaps_or_with_a_file_it_does_not_read() -> None:
    with pytest.raises(ParseError, match="/proc/swaps"):
        host.host_state("/proc/sys/kernel/numa_balancing:1\n")
    with pytest.raises(ParseError, match="a file the fact reads"):
        host.host_state(capture("thp-grep-lkml-rientjes-2023.txt"))


def test_a_stand_in_root_is_stripped_and_the_net_sysctls_stay_real() -> None:
    root = "/run/gpufleet-lab/kernel"
    text = (f"{root}/sys/devices/system/cpu/cpu1/cpufreq/scaling_governor:schedutil\n"
            f"{root}/proc/swaps:Filename\tType\tSize\tUsed\tPriority\n"
            "/proc/sys/net/ipv4/conf/fab0/arp_ignore:1\n")
    state = host.host_state(text, root)
    assert state["governors"] == {1: "schedutil"}
    assert state["net"] == {"fab0": {"arp_ignore": 1}}
    with pytest.raises(ParseError, match="paths under"):
        host.host_state("/proc/swaps:Filename Type\n", root)


# ---- the plan --------------------------------------------------------------------------------

def inventory(tmp_path: Path, host_vars: str = "", hosts: int = 1,
              driver: bool = True) -> Inventory:
    """GPU nodes (a pinned driver: host_tuning's auto turns it on) with the given variables."""
    pinned = 'nvidia_driver_version: "580.95.05"\n' if driver else ""
    entries = "".join(f"    gpu{i:02d}:\n      ansible_host: 10.0.0.{10 + i}\n"
                      + textwrap.indent(pinned + textwrap.dedent(host_vars), " " * 6)
                      for i in range(1, hosts + 1))
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n" + entries)
    return load_inventory(tmp_path / "hosts.yml")


def base_state(**changes: Any) -> dict[str, Any]:
    """A tuned node: performance on two CPUs, no NUMA balancing, no swap, THP madvise."""
    state: dict[str, Any] = {
        "governors": {0: "performance", 1: "performance"}, "cpufreq_driver": "acpi-cpufreq",
        "available_governors": ["conservative", "ondemand", "userspace", "powersave",
                                "performance", "schedutil"],
        "numa_balancing": 0, "thp_enabled": "madvise", "thp_defrag": "madvise",
        "cpuidle_driver": "intel_idle", "intel_idle_max_cstate": 9, "processor_max_cstate": 9,
        "cmdline": "ro quiet", "gc_thresh": {1: 128, 2: 512, 3: 1024}, "swaps": [],
        "fstab_swaps": [], "net": {}}
    state.update(changes)
    return state


def facts(state: dict[str, Any], files: dict[str, str] | None = None,
          interfaces: list[dict[str, Any]] | None = None, systemd: bool = True) -> Facts:
    values: dict[str, Any] = {"host_state": state, "systemd": systemd,
                              "interfaces": interfaces or [], "rdma": [],
                              f"link:{UNIT_LINK}": "../gpufleet-host-tuning.service"}
    for path in (SYSCTL_FILE, SCRIPT, UNIT):
        content = (files or {}).get(path)
        values[f"file:{path}"] = FileState(path, content is not None, (content or "").encode(),
                                           "755" if path == SCRIPT else "644", "root:root")
    return Facts("gpu01", values=values)


def plan(inv: Inventory, f: Facts, name: str = "gpu01") -> list[Change]:
    h = inv.hosts[name]
    return ROLE.plan(f, RoleVars(h, ROLE.defaults), PlanContext(inv, h))


def converged_files(inv: Inventory, state: dict[str, Any],
                    interfaces: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """The files the role writes, as it would write them."""
    changes = plan(inv, facts(state, interfaces=interfaces))
    return {c.resource.removeprefix("file "): c.steps[0].content.decode()  # type: ignore[attr-defined]
            for c in changes if c.kind == "file"}


def rows(changes: list[Change]) -> list[tuple[str, str, str | None, str | None]]:
    return [(c.resource, c.action, c.before, c.after) for c in changes if c.kind not in
            ("file", "link")]


def test_on_by_default_on_gpu_nodes_only(tmp_path: Path) -> None:
    def active(inv: Inventory) -> bool:
        return ROLE.active(RoleVars(inv.hosts["gpu01"], ROLE.defaults))

    assert active(inventory(tmp_path))
    assert not active(inventory(tmp_path, driver=False))  # a login node, a controller
    assert active(inventory(tmp_path, "host_tuning: true\n", driver=False))
    assert not active(inventory(tmp_path, "host_tuning: false\n"))


def test_converged_on_a_tuned_node(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    state = base_state()
    files = converged_files(inv, state)
    assert set(files) == {SYSCTL_FILE, SCRIPT, UNIT}
    assert "kernel.numa_balancing = 0" in files[SYSCTL_FILE]
    assert "echo performance > \"$f\"" in files[SCRIPT]
    assert f"ExecStart=/bin/sh {SCRIPT}" in files[UNIT]
    assert plan(inv, facts(state, files)) == []


def test_a_node_on_powersave_is_set_to_performance(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    state = base_state(governors={0: "powersave", 1: "performance"})
    changes = [c for c in plan(inv, facts(state, converged_files(inv, base_state())))]
    assert rows(changes) == [("cpufreq governor", "set", "powersave on 1 of 2 CPU(s)",
                              "performance on every CPU")]
    step = changes[0].steps[0]
    assert isinstance(step, Run)
    assert step.command == ("for f in /sys/devices/system/cpu/cpu[0-9]*/cpufreq/"
                            "scaling_governor; do echo performance > \"$f\" || exit 1; done")


def test_a_governor_the_driver_does_not_offer_fails(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "host_cpu_governor: ondemand\n")
    state = base_state(cpufreq_driver="intel_pstate",
                       available_governors=["performance", "powersave"])
    changes = plan(inv, facts(state))
    change = next(c for c in changes if c.resource == "cpufreq governor")
    assert isinstance(change.steps[0], Fail)
    assert "intel_pstate offers no ondemand governor" in change.steps[0].message
    assert f"file {SCRIPT}" not in [c.resource for c in changes]  # no boot step it refuses


def test_no_cpufreq_driver_nothing_to_govern(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    state = base_state(governors={}, cpufreq_driver=None)
    assert rows(plan(inv, facts(state))) == []


def test_numa_balancing_on_is_turned_off_under_the_root(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "kernel_state_root: /run/lab/kernel\n")
    changes = plan(inv, facts(base_state(numa_balancing=1)))
    assert rows(changes) == [("sysctl kernel.numa_balancing", "set", "1", "0")]
    step = changes[-1].steps[0]
    assert isinstance(step, Run)
    assert step.command == "echo 0 > /run/lab/kernel/proc/sys/kernel/numa_balancing"


def test_swap_on_is_turned_off_and_fstab_reported(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    state = base_state(swaps=host.proc_swaps(capture("proc-swaps-swap-img-kubelet-4204d4.txt")),
                       fstab_swaps=[{"line": 3, "spec": "/swap.img"}])
    changes = [c for c in plan(inv, facts(state)) if c.kind in ("swap",)]
    assert rows(changes) == [
        ("swap active", "swapoff", "/swap.img (file, 4009980 KiB, 0 KiB used)", "none"),
        ("swap in /etc/fstab", MANUAL, "/swap.img (/etc/fstab:3)",
         "no swap entry (comment it out, or swap comes back at boot)")]
    assert changes[0].steps[0].command == "swapoff /swap.img"  # type: ignore[attr-defined]
    assert changes[1].manual and not changes[1].steps
    allowed = inventory(tmp_path, "host_swap: true\n")
    assert [c for c in plan(allowed, facts(state)) if c.kind == "swap"] == []


def test_thp_as_declared(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "host_thp_enabled: never\nhost_thp_defrag: madvise\n")
    changes = plan(inv, facts(base_state()))
    assert rows(changes) == [("thp enabled", "set", "madvise", "never")]
    assert "echo never > /sys/kernel/mm/transparent_hugepage/enabled" in \
        next(c for c in changes if c.resource == f"file {SCRIPT}").steps[0].content.decode()  # type: ignore[attr-defined]
    gone = plan(inv, facts(base_state(thp_enabled=None)))
    assert isinstance(next(c for c in gone if c.resource == "thp enabled").steps[0], Fail)


def test_a_c_state_limit_is_reported_for_the_kernel_command_line(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "host_max_cstate: 1\n")
    changes = plan(inv, facts(base_state()))
    assert rows(changes) == [(
        "cmdline C-state limit", MANUAL, "intel_idle.max_cstate 9 (cpuidle driver intel_idle)",
        "intel_idle.max_cstate=1 processor.max_cstate=1 on the kernel command line "
        "(GRUB_CMDLINE_LINUX), then a reboot")]
    assert changes[-1].manual
    acpi = base_state(cpuidle_driver="acpi_idle", processor_max_cstate=1)
    assert rows(plan(inv, facts(acpi))) == []
    assert rows(plan(inv, facts(base_state(cpuidle_driver="none")))) == []


RAILS = [{"name": "eth0", "addresses": ["10.0.0.11/24"]},
         {"name": "fab0", "addresses": ["192.0.2.11/24"]},
         {"name": "fab1", "addresses": ["192.0.2.111/24"]}]


def test_two_rails_in_one_subnet_get_the_arp_sysctls(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "fabric_interfaces: [fab0, fab1]\n")
    tuned = {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 2}
    state = base_state(net={"fab0": tuned, "fab1": {**tuned, "arp_ignore": 0}})
    files = converged_files(inv, base_state(net={"fab0": tuned, "fab1": tuned}), RAILS)
    assert "net.ipv4.conf.fab1.arp_ignore = 1" in files[SYSCTL_FILE]
    assert "net.ipv4.conf.fab0.rp_filter = 2" in files[SYSCTL_FILE]
    assert "eth0" not in files[SYSCTL_FILE]
    changes = plan(inv, facts(state, files, RAILS))
    assert rows(changes) == [("sysctl net.ipv4.conf.fab1.arp_ignore", "set", "0", "1")]
    step = changes[0].steps[0]
    assert isinstance(step, Run)
    assert step.command == "echo 1 > /proc/sys/net/ipv4/conf/fab1/arp_ignore"


def test_rails_in_their_own_subnets_need_nothing(tmp_path: Path) -> None:
    inv = inventory(tmp_path, "fabric_interfaces: [fab0, fab1]\n")
    own = [RAILS[0], RAILS[1], {"name": "fab1", "addresses": ["198.51.100.11/24"]}]
    assert ROLE.multirail(facts(base_state(), interfaces=own),
                          RoleVars(inv.hosts["gpu01"], ROLE.defaults)) == {}


@pytest.mark.parametrize(("hosts", "rails", "wanted"), [
    (4, 0, (128, 512, 1024)),       # the kernel's own: E = 4
    (600, 0, (256, 1024, 2048)),    # E = 600 -> 2E 1200 -> 2048
    (512, 8, (16384, 65536, 131072)),  # one subnet of 8 rails: E = 512 x 65 = 33280
])
def test_neighbour_thresholds_sized_for_the_fleet(tmp_path: Path, hosts: int, rails: int,
                                                  wanted: tuple[int, int, int]) -> None:
    inv = inventory(tmp_path, hosts=hosts)
    interfaces = [{"name": f"fab{i}", "addresses": [f"192.0.2.{i + 1}/24"]} for i in range(rails)]
    f = facts(base_state(), interfaces=interfaces)
    f.values["rdma"] = [{"netdevs": [f"fab{i}"]} for i in range(rails)]
    h = inv.hosts["gpu01"]
    assert ROLE.gc_thresh(f, RoleVars(h, ROLE.defaults), PlanContext(inv, h)) == wanted


def test_thresholds_below_the_fleet_s_need_are_raised_and_kept(tmp_path: Path) -> None:
    inv = inventory(tmp_path, hosts=600)
    changes = plan(inv, facts(base_state()))
    assert rows(changes) == [
        ("sysctl net.ipv4.neigh.default.gc_thresh1", "set", "128", "256 or more"),
        ("sysctl net.ipv4.neigh.default.gc_thresh2", "set", "512", "1024 or more"),
        ("sysctl net.ipv4.neigh.default.gc_thresh3", "set", "1024", "2048 or more")]
    sysctl = next(c for c in changes if c.resource == f"file {SYSCTL_FILE}")
    assert "net.ipv4.neigh.default.gc_thresh3 = 2048" in sysctl.diff  # type: ignore[operator]
    higher = base_state(gc_thresh={1: 4096, 2: 8192, 3: 16384})  # Azure's HPC image's
    assert rows(plan(inv, facts(higher))) == []


def test_thresholds_a_container_cannot_see_fail_only_when_raised(tmp_path: Path) -> None:
    assert rows(plan(inventory(tmp_path), facts(base_state(gc_thresh={})))) == []
    changes = plan(inventory(tmp_path, hosts=600), facts(base_state(gc_thresh={})))
    assert isinstance(changes[-1].steps[0], Fail)
    assert "its thresholds are the host's" in changes[-1].steps[0].message


def test_without_systemd_no_boot_unit(tmp_path: Path) -> None:
    inv = inventory(tmp_path)
    changes = plan(inv, facts(base_state(), systemd=False))
    assert [c.resource for c in changes] == [f"file {SYSCTL_FILE}"]


def test_nothing_when_turned_off_or_every_setting_null(tmp_path: Path) -> None:
    off = inventory(tmp_path, "host_tuning: false\n")
    assert not ROLE.active(RoleVars(off.hosts["gpu01"], ROLE.defaults))
    inv = inventory(tmp_path, "host_cpu_governor: null\nhost_numa_balancing: null\n"
                              "host_swap: null\nhost_multirail_arp: false\n"
                              "host_neigh_gc_thresh: null\n")
    state = base_state(governors={0: "powersave"}, numa_balancing=1,
                       swaps=[{"name": "/s", "type": "file", "size_kib": 1, "used_kib": 0,
                               "priority": -2}])
    assert plan(inv, facts(state)) == []


@pytest.mark.parametrize(("line", "message"), [
    ("host_cpu_governor: 'performance; reboot'", "a cpufreq governor name"),
    ("host_thp_enabled: sometimes", "one of always, madvise, never"),
    ("host_max_cstate: 12", "a C-state limit 0-9"),
    ("host_neigh_gc_thresh: [3, 2, 1]", "auto, or three numbers"),
    ("fabric_interfaces: ['fab0; reboot']", "interface names"),
    ("kernel_state_root: relative/path", "an absolute path"),
    ("host_tuning: sometimes", "a boolean"),
    ("nvidia_driver_version: 'x; reboot'", "must look like 580.95.05"),
])
def test_bad_values_are_refused(tmp_path: Path, line: str, message: str) -> None:
    inv = inventory(tmp_path, line + "\n")
    with pytest.raises(VarError, match=message):
        ROLE.check(RoleVars(inv.hosts["gpu01"], ROLE.defaults))
    with pytest.raises(Exception, match=message):
        validate(list(inv.hosts.values()), [ROLE])


def test_the_fact_reads_under_the_root_and_the_declared_interfaces() -> None:
    fact = host_tuning.state_fact("/run/lab", ("fab0",))
    assert "/run/lab/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor" in fact.shell
    assert "/run/lab/proc/swaps" in fact.shell and " fab0;" in fact.shell
    assert "/proc/sys/net/ipv4/conf/$i/$k" in fact.shell
