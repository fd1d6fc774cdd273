"""The host's performance state for training: the CPU frequency governor, automatic NUMA
balancing, swap, transparent huge pages and the C-state limit; and, where several fabric
interfaces share a subnet, their ARP and reverse-path sysctls, with neighbour tables sized for
the fleet.

On by default on the GPU nodes gpufleet manages (a pinned driver, as fabricmanager's ``auto``),
with the defaults the vendors' training images set (DGX OS's TuneD profiles, AWS
ParallelCluster's cookbook, Azure's HPC images, DeepOps): a node left on ``powersave`` trains
slowly and would otherwise pass; login nodes and controllers an inventory also lists are left
alone. What can change at run time is set now and kept over
a reboot (a sysctl.d file; a boot unit for the governor and THP); what needs the kernel command
line (the C-state limit) is reported for an operator, never written. Every setting can be left
alone by setting its variable to null, the role with ``host_tuning: false`` (``true`` turns it
on where no driver is pinned).

``kernel_state_root`` names where the kernel's host-wide state is read and written: ``/`` on a
node. Lab nodes share the controller's kernel, so the lab points it at a stand-in tree of its
own; the interfaces' ARP sysctls belong to each network namespace and are always the real ones.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.catalog import SYSTEMD, Fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers import host
from gpufleet.provision.managed import HEADER, file_change, link_change, render
from gpufleet.provision.plan import MANUAL, Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var
from gpufleet.roles.driver import driver_version

SYSCTL_FILE = "/etc/sysctl.d/60-gpufleet-host-tuning.conf"
SCRIPT = "/etc/gpufleet/host-tuning.sh"
UNIT = "/etc/systemd/system/gpufleet-host-tuning.service"
UNIT_LINK = "/etc/systemd/system/multi-user.target.wants/gpufleet-host-tuning.service"
GOVERNORS = "/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
THP = "/sys/kernel/mm/transparent_hugepage/"
GC_THRESH = "/proc/sys/net/ipv4/neigh/default/gc_thresh"
CONF = "/proc/sys/net/ipv4/conf/"
THP_ENABLED = ("always", "madvise", "never")
THP_DEFRAG = ("always", "defer", "defer+madvise", "madvise", "never")
LINUX_GC_THRESH = (128, 512, 1024)  # the kernel's own defaults (gc_thresh1, 2, 3)
# Several interfaces in one subnet: answer ARP only for the interface's own address
# (arp_ignore 1), announce the address of the interface a request leaves by (arp_announce 2),
# and accept a packet that arrives on another interface of the subnet than the route back
# would use (loose reverse-path filtering, 2).
MULTIRAIL = {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 2}
_GOVERNOR = re.compile(r"^[a-z][a-z0-9_+-]*\Z")
_IFNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}\Z")
_STATE_FILES = (
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_driver",
    "/sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors",
    NUMA_BALANCING, THP + "enabled", THP + "defrag",
    "/sys/devices/system/cpu/cpuidle/current_driver",
    "/sys/module/intel_idle/parameters/max_cstate",
    "/sys/module/processor/parameters/max_cstate",
    "/proc/cmdline", *(f"{GC_THRESH}{n}" for n in (1, 2, 3)), "/proc/swaps",
)


@functools.cache
def state_fact(root: str, interfaces: tuple[str, ...]) -> Fact:
    """The host-state fact: one ``grep -H ''`` over the state files under ``root`` (``""`` on
    a node), /etc/fstab, and the ARP sysctls of ``all``, ``default``, every RDMA netdev and
    ``interfaces``. Fails (absent, never "no swap") when /proc/swaps cannot be read."""
    files = " ".join([root + GOVERNORS, *(shlex.quote(root + path) for path in _STATE_FILES),
                      "/etc/fstab"])
    names = " ".join(shlex.quote(i) for i in interfaces)
    swaps = shlex.quote(root + "/proc/swaps")
    shell = (f"[ -r {swaps} ] || {{ echo {swaps}' cannot be read'; exit 1; }}; "
             "set --; for i in all default $(for d in /sys/class/infiniband/*/device/net/*; do "
             "[ -e \"$d\" ] && echo \"${d##*/}\"; done) "
             f"{names}; do for k in arp_ignore arp_announce rp_filter; do "
             f"set -- \"$@\" {CONF}$i/$k; done; done; "
             f"grep -s -H '' {files} \"$@\"; exit 0")
    return Fact("host_state", shell, lambda text: host.host_state(text, root))


class HostTuningRole(RoleBase):
    name = "host_tuning"
    order = 72
    variables: ClassVar[Mapping[str, Var]] = {
        "host_tuning": Var("auto", "any", "true, false, or auto: on GPU nodes (where "
                                          "nvidia_driver_version is set)"),
        "nvidia_driver_version": Var(None, "string", "the pinned driver that makes a host a "
                                                     "GPU node (for auto)"),
        "host_cpu_governor": Var("performance", "string", "every CPU's cpufreq governor "
                                                           "(null: not managed)"),
        "host_numa_balancing": Var(False, "boolean", "kernel.numa_balancing on (null: not "
                                                     "managed)"),
        "host_swap": Var(False, "boolean", "false: no swap active (null or true: not "
                                           "checked)"),
        "host_thp_enabled": Var(None, "string", "transparent_hugepage/enabled: always, "
                                                "madvise or never (null: not managed)"),
        "host_thp_defrag": Var(None, "string", "transparent_hugepage/defrag (null: not "
                                               "managed)"),
        "host_max_cstate": Var(None, "integer", "the cpuidle driver's C-state limit, from "
                                                "the kernel command line (null: not checked)"),
        "host_multirail_arp": Var(True, "boolean", "ARP and rp_filter sysctls on fabric "
                                                   "interfaces that share a subnet"),
        "fabric_interfaces": Var(None, "list", "the fabric's interfaces (default: every "
                                               "RDMA device's netdev)"),
        "host_neigh_gc_thresh": Var("auto", "any", "net.ipv4.neigh.default.gc_thresh1-3: "
                                                   "auto (sized for the fleet), three "
                                                   "numbers, or null"),
        "host_neigh_group": Var("all", "string", "the inventory group whose hosts share the "
                                                 "fabric's layer 2 (for auto)"),
        "kernel_state_root": Var("/", "string", "where the kernel's host-wide state is read "
                                                "and written (the lab's stand-in tree)"),
    }

    def active(self, v: RoleVars) -> bool:
        """On when asked; with auto, on the GPU nodes gpufleet manages (a pinned driver)."""
        if str(v.get("host_tuning")).lower() == "auto":
            return "nvidia_driver_version" in v
        return v.boolean("host_tuning")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if str(v.get("host_tuning")).lower() != "auto":
            v.boolean("host_tuning")
        if v.opt_string("nvidia_driver_version") is not None:
            driver_version(v)
        if not self.active(v):
            return
        self.root(v)
        self.interfaces(v)
        governor = v.opt_string("host_cpu_governor")
        if governor is not None and not _GOVERNOR.match(governor):
            raise v.fail("host_cpu_governor", "a cpufreq governor name (performance, "
                         "schedutil ...)", governor)
        for key, choices in (("host_thp_enabled", THP_ENABLED), ("host_thp_defrag", THP_DEFRAG)):
            value = v.opt_string(key)
            if value is not None and value not in choices:
                raise v.fail(key, "one of " + ", ".join(choices), value)
        if v.get("host_max_cstate") is not None and not 0 <= v.integer("host_max_cstate") <= 9:
            raise v.fail("host_max_cstate", "a C-state limit 0-9", v.get("host_max_cstate"))
        self.gc_thresh_declared(v)
        if not re.match(r"^[A-Za-z0-9_.-]+\Z", v.string("host_neigh_group")):
            raise v.fail("host_neigh_group", "an inventory group name",
                         v.get("host_neigh_group"))

    # ---- variables ------------------------------------------------------------------------

    @staticmethod
    def root(v: RoleVars) -> str:
        """``kernel_state_root`` as a path prefix: ``""`` for ``/``."""
        if v.string("kernel_state_root") == "/":
            return ""
        return v.path("kernel_state_root", "it prefixes the sysfs and procfs paths").rstrip("/")

    @staticmethod
    def interfaces(v: RoleVars) -> tuple[str, ...]:
        """The declared fabric interfaces (empty: the RDMA devices' netdevs)."""
        names = v.items("fabric_interfaces")
        if not all(isinstance(n, str) and _IFNAME.match(n) for n in names):
            raise v.fail("fabric_interfaces", "interface names (letters, digits, _ . -; at "
                         "most 15 characters)", v.get("fabric_interfaces"))
        return tuple(names)

    @staticmethod
    def gc_thresh_declared(v: RoleVars) -> tuple[int, int, int] | str | None:
        """``host_neigh_gc_thresh``: ``auto``, three increasing numbers, or None."""
        value = v.get("host_neigh_gc_thresh")
        if value is None or value == "auto":
            return value  # type: ignore[no-any-return]
        numbers = value.split() if isinstance(value, str) else value
        try:
            if not isinstance(numbers, list) or len(numbers) != 3 or \
                    any(isinstance(n, bool) for n in numbers):
                raise ValueError
            low, mid, high = (int(n) for n in numbers)
        except (TypeError, ValueError):
            raise v.fail("host_neigh_gc_thresh", "auto, or three numbers gc_thresh1 <= "
                         "gc_thresh2 <= gc_thresh3", value) from None
        if not 0 <= low <= mid <= high <= 2**31 - 1:
            raise v.fail("host_neigh_gc_thresh", "auto, or three numbers gc_thresh1 <= "
                         "gc_thresh2 <= gc_thresh3", value)
        return low, mid, high

    # ---- facts --------------------------------------------------------------------------

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"sysctl file": SYSCTL_FILE, "boot script": SCRIPT, "boot unit": UNIT}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({SYSCTL_FILE, SCRIPT, UNIT}),
                           links=frozenset({UNIT_LINK}),
                           custom=frozenset({state_fact(self.root(v), self.interfaces(v)),
                                             SYSTEMD}))

    # ---- plan ---------------------------------------------------------------------------

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        state: dict[str, Any] = facts.require("host_state")
        root = self.root(v)
        changes: list[Change] = []
        sysctls: dict[str, str] = {}
        boot: list[str] = []
        changes += self._governor(state, v, root, boot)
        changes += self._numa(state, v, root, sysctls)
        changes += self._swap(state, v)
        changes += self._thp(state, v, root, boot)
        changes += self._cstates(state, v)
        changes += self._multirail(facts, state, v, sysctls)
        changes += self._gc_thresh(facts, state, v, ctx, root=root, sysctls=sysctls)
        files = self._files(facts, v, sysctls, boot)
        return files + changes

    def _governor(self, state: dict[str, Any], v: RoleVars, root: str,
                  boot: list[str]) -> list[Change]:
        want = v.opt_string("host_cpu_governor")
        governors: dict[int, str] = state["governors"]
        if want is None or not governors:  # no cpufreq driver (a VM): nothing to govern
            return []
        command = (f"for f in {root}{GOVERNORS}; do echo {want} > \"$f\" || exit 1; done")
        other = sorted(cpu for cpu, governor in governors.items() if governor != want)
        available = state["available_governors"] or []
        if not other or want in available:  # never a boot step the driver refuses
            boot.append(command)
        if not other:
            return []
        seen = sorted({governors[cpu] for cpu in other})
        before = f"{', '.join(seen)} on {len(other)} of {len(governors)} CPU(s)"
        if want not in available:
            driver = state["cpufreq_driver"] or "unknown"
            return [Change(self.name, "cpufreq governor", "set", before, want,
                           [Fail(f"the cpufreq driver {driver} offers no {want} governor "
                                 f"(available: {', '.join(available) or 'none read'})")])]
        return [Change(self.name, "cpufreq governor", "set", before,
                       f"{want} on every CPU", [Run(command, f"cpufreq governor {want}")])]

    def _numa(self, state: dict[str, Any], v: RoleVars, root: str,
              sysctls: dict[str, str]) -> list[Change]:
        if v.get("host_numa_balancing") is None:
            return []
        want = int(v.boolean("host_numa_balancing"))
        sysctls["kernel.numa_balancing"] = str(want)
        live = state["numa_balancing"]
        if live is None or live == want:  # a kernel without automatic NUMA balancing
            return []
        return [Change(self.name, "sysctl kernel.numa_balancing", "set", str(live), str(want),
                       [Run(f"echo {want} > {shlex.quote(root + NUMA_BALANCING)}",
                            "sysctl kernel.numa_balancing")])]

    def _swap(self, state: dict[str, Any], v: RoleVars) -> list[Change]:
        if v.get("host_swap") is None or v.boolean("host_swap"):
            return []
        changes = []
        active = state["swaps"]
        if active:
            shown = ", ".join(f"{s['name']} ({s['type']}, {s['size_kib']} KiB, "
                              f"{s['used_kib']} KiB used)" for s in active)
            command = " && ".join(f"swapoff {shlex.quote(s['name'])}" for s in active)
            changes.append(Change(self.name, "swap active", "swapoff", shown, "none",
                                  [Run(command, "swapoff", timeout=900)]))
        entries = state["fstab_swaps"]
        if entries:
            shown = ", ".join(f"{e['spec']} (/etc/fstab:{e['line']})" for e in entries)
            changes.append(Change(self.name, "swap in /etc/fstab", MANUAL, shown,
                                  "no swap entry (comment it out, or swap comes back at boot)"))
        return changes

    def _thp(self, state: dict[str, Any], v: RoleVars, root: str,
             boot: list[str]) -> list[Change]:
        changes = []
        for setting in ("enabled", "defrag"):
            want = v.opt_string(f"host_thp_{setting}")
            if want is None:
                continue
            path = shlex.quote(root + THP + setting)
            command = f"echo {want} > {path}"
            boot.append(command)
            live = state[f"thp_{setting}"]
            if live == want:
                continue
            steps: list[Any] = [Run(command, f"transparent huge pages {setting} {want}")] \
                if live is not None else \
                [Fail("this kernel has no transparent huge pages (no /sys/kernel/mm/"
                      "transparent_hugepage)")]
            changes.append(Change(self.name, f"thp {setting}", "set", live or "absent", want,
                                  steps))
        return changes

    def _cstates(self, state: dict[str, Any], v: RoleVars) -> list[Change]:
        if v.get("host_max_cstate") is None:
            return []
        want = v.integer("host_max_cstate")
        driver = state["cpuidle_driver"]
        params = {"intel_idle": "intel_idle_max_cstate", "acpi_idle": "processor_max_cstate"}
        if driver not in params:  # no cpuidle driver the limit applies to (haltpoll, none)
            return []
        live = state[params[driver]]
        if live == want:
            return []
        param = "intel_idle.max_cstate" if driver == "intel_idle" else "processor.max_cstate"
        return [Change(self.name, "cmdline C-state limit", MANUAL,
                       f"{param} {live} (cpuidle driver {driver})",
                       f"intel_idle.max_cstate={want} processor.max_cstate={want} on the "
                       "kernel command line (GRUB_CMDLINE_LINUX), then a reboot")]

    @staticmethod
    def fabric(facts: Facts, v: RoleVars) -> list[str]:
        """The fabric interfaces: the declared ones, else every RDMA device's netdev."""
        declared = list(HostTuningRole.interfaces(v))
        if declared:
            return declared
        netdevs = {n for d in facts.get("rdma") or [] for n in d["netdevs"]}
        return sorted(netdevs)

    def multirail(self, facts: Facts, v: RoleVars) -> dict[str, list[str]]:
        """The subnets (IPv4) that two or more fabric interfaces share -> those interfaces."""
        fabric = set(self.fabric(facts, v))
        subnets: dict[str, list[str]] = {}
        for interface in facts.get("interfaces") or []:
            if interface["name"] not in fabric:
                continue
            for address in interface["addresses"]:
                network = ipaddress.ip_interface(address).network
                if network.version == 4 and interface["name"] not in \
                        subnets.setdefault(str(network), []):
                    subnets[str(network)].append(interface["name"])
        return {net: sorted(names) for net, names in subnets.items() if len(names) > 1}

    def _multirail(self, facts: Facts, state: dict[str, Any], v: RoleVars,
                   sysctls: dict[str, str]) -> list[Change]:
        if not v.boolean("host_multirail_arp"):
            return []
        names = sorted({n for group in self.multirail(facts, v).values() for n in group})
        changes = []
        for name in names:
            if not _IFNAME.match(name):
                changes.append(Change(self.name, f"interface {name!r}", "set", "unusable name",
                                      "an interface name sysctl can address",
                                      [Fail(f"the interface name {name!r} cannot be written "
                                            "to a sysctl file")]))
                continue
            live = state["net"].get(name, {})
            for key, want in MULTIRAIL.items():
                dotted = f"net.ipv4.conf.{name.replace('.', '/')}.{key}"
                sysctls[dotted] = str(want)
                if live.get(key) == want:
                    continue
                command = f"echo {want} > {shlex.quote(f'{CONF}{name}/{key}')}"
                before = "unknown" if live.get(key) is None else str(live[key])
                changes.append(Change(self.name, f"sysctl {dotted}", "set", before, str(want),
                                      [Run(command, f"sysctl {dotted}")]))
        return changes

    def gc_thresh(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> tuple[int, ...] | None:
        """gc_thresh1-3 wanted: declared, or sized for the fleet: E = hosts x (1 + the sum,
        over the subnets this node's fabric interfaces are in, of the square of how many share
        it) entries (the management network, and each local interface of a subnet resolving
        every fabric address of it); gc_thresh3 the power of two at or above 2E, gc_thresh2
        half of it, gc_thresh1 an eighth, never below the kernel's 128, 512, 1024."""
        declared = self.gc_thresh_declared(v)
        if declared is None or isinstance(declared, tuple):
            return declared
        group = v.string("host_neigh_group")
        if group not in ctx.inventory.groups:
            raise VarError(f"host {v.host.name}: host_neigh_group {group!r} is not a group of "
                           "the inventory")
        hosts = len(ctx.inventory.group_hosts(group))
        per_subnet: dict[str, int] = {}
        fabric = set(self.fabric(facts, v))
        for interface in facts.get("interfaces") or []:
            if interface["name"] in fabric:
                for address in interface["addresses"]:
                    network = ipaddress.ip_interface(address).network
                    if network.version == 4:
                        per_subnet[str(network)] = per_subnet.get(str(network), 0) + 1
        entries = hosts * (1 + sum(k * k for k in per_subnet.values()))
        high = max(LINUX_GC_THRESH[2], 1 << max(0, (2 * entries - 1).bit_length()))
        return max(LINUX_GC_THRESH[0], high // 8), max(LINUX_GC_THRESH[1], high // 2), high

    def _gc_thresh(self, facts: Facts, state: dict[str, Any], v: RoleVars, ctx: PlanContext, *,
                   root: str, sysctls: dict[str, str]) -> list[Change]:
        wanted = self.gc_thresh(facts, v, ctx)
        if wanted is None:
            return []
        raised = any(w > d for w, d in zip(wanted, LINUX_GC_THRESH, strict=True))
        live: dict[int, int] = state["gc_thresh"]
        if not live:
            if not raised:
                return []
            return [Change(self.name, "sysctl net.ipv4.neigh.default.gc_thresh", "set",
                           "not visible here", " ".join(map(str, wanted)),
                           [Fail("this network namespace has no default neighbour table "
                                 "(a container): its thresholds are the host's; set "
                                 "net.ipv4.neigh.default.gc_thresh1-3 there")])]
        changes = []
        for index, want in enumerate(wanted, start=1):
            key = f"net.ipv4.neigh.default.gc_thresh{index}"
            if raised:
                sysctls[key] = str(want)
            have = live.get(index)
            if have is not None and have >= want:
                continue
            command = f"echo {want} > {shlex.quote(f'{root}{GC_THRESH}{index}')}"
            changes.append(Change(self.name, f"sysctl {key}", "set", str(have), f"{want} or more",
                                  [Run(command, f"sysctl {key}")]))
        return changes

    def _files(self, facts: Facts, v: RoleVars, sysctls: dict[str, str],
               boot: list[str]) -> list[Change]:
        header = HEADER.format(role=self.name)
        changes: list[Change | None] = []
        if sysctls:
            changes.append(file_change(self.name, facts, SYSCTL_FILE,
                                       render("sysctl-host-tuning.conf.j2", header=header,
                                              sysctls=dict(sorted(sysctls.items())))))
        if boot and facts.require("systemd"):
            changes += [
                file_change(self.name, facts, SCRIPT, render("host-tuning.sh.j2", header=header,
                                                             commands=boot), mode=0o755),
                file_change(self.name, facts, UNIT, render("gpufleet-host-tuning.service.j2",
                                                           header=header, script=SCRIPT)),
                link_change(self.name, facts, UNIT_LINK, "../gpufleet-host-tuning.service"),
            ]
        return [c for c in changes if c is not None]


ROLE = HostTuningRole()
