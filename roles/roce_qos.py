"""RoCE QoS applied and kept: the declared trust mode, PFC priority and ECN on every fabric
port, set now and at every boot.

The NIC forgets what ``mlnx_qos`` (or iproute2's ``dcb``) set when the host reboots: a
rebooted node is lossy until someone sets it again. This role sets it now (one change per port
that differs, so drift names the port) and writes a boot unit that sets it again, with
whichever tool the node has (``mlnx_qos`` first: only it sets the trust mode). The values are
the rdma suite's own declaration (``rdma: {pfc_priority, trust, ecn}``), which the suite
checks; ``/etc/gpufleet/roce-qos.json`` hands them to ``gpufleet-healthcheck``, whose periodic
``roce_qos`` check reports a port that lost them between runs.

Opt-in (``roce_qos: true``): PFC and trust must match the switches' configuration, and a NIC
set for a lossless class the fabric does not carry pauses or drops traffic; the declaration
has so far only been checked, so applying it is a site's decision.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.errors import VarError
from gpufleet.facts.catalog import SYSTEMD, Fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.parsers import qos
from gpufleet.provision.managed import HEADER, file_change, link_change, render
from gpufleet.provision.plan import Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

SCRIPT = "/etc/gpufleet/roce-qos.sh"
CONFIG = "/etc/gpufleet/roce-qos.json"
UNIT = "/etc/systemd/system/gpufleet-roce-qos.service"
UNIT_LINK = "/etc/systemd/system/multi-user.target.wants/gpufleet-roce-qos.service"
TRUSTS = ("pcp", "dscp")
_PORT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}\Z")
ECN_KINDS = ("roce_np", "roce_rp")


@functools.cache
def state_fact(root: str, ports: tuple[str, ...]) -> Fact:
    """Each fabric port's trust and PFC, as ``mlnx_qos`` (or else ``dcb``) reports them, and
    its ECN enables from sysfs under ``root``; the ports: ``ports``, else every netdev of an
    RDMA port whose link layer is Ethernet."""
    declared = " ".join(shlex.quote(p) for p in ports)
    ecn = shlex.quote(root + "/sys/class/net/")
    shell = "\n".join([
        f"ports='{declared}'",
        '[ -n "$ports" ] || ports=$(for p in /sys/class/infiniband/*/ports/*; do '
        '[ "$(cat "$p/link_layer" 2>/dev/null)" = Ethernet ] || continue; '
        'for n in "${p%/ports/*}"/device/net/*; do [ -e "$n" ] && echo "${n##*/}"; done; '
        "done | sort -u)",
        "if command -v mlnx_qos >/dev/null 2>&1; then tool=mlnx_qos; "
        "elif command -v dcb >/dev/null 2>&1; then tool=dcb; else tool=none; fi",
        'echo "tool $tool"',
        "for p in $ports; do",
        '  case $tool in mlnx_qos) out=$(mlnx_qos -i "$p" 2>&1); rc=$?;; '
        'dcb) out=$(dcb -j pfc show dev "$p" 2>&1); rc=$?;; *) out=; rc=127;; esac',
        '  echo "port $p $rc $(printf \'%s\' "$out" | base64 | tr -d \'\\n\')"',
        f"  for k in {' '.join(ECN_KINDS)}; do for i in 0 1 2 3 4 5 6 7; do "
        f'f={ecn}"$p/ecn/$k/enable/$i"; [ -r "$f" ] && echo "ecn $p $k $i $(cat "$f")"; '
        "done; done",
        "done; exit 0",
    ])
    return Fact("roce_qos", shell, qos.roce_qos_fact, "mlnx_qos")


class RoceQosRole(RoleBase):
    name = "roce_qos"
    order = 56
    variables: ClassVar[Mapping[str, Var]] = {
        "roce_qos": Var(False, "boolean", "apply RoCE QoS now and at every boot"),
        "rdma": Var(None, "mapping", "{pfc_priority, trust, ecn}: the rdma suite's "
                                     "declaration"),
        "roce_qos_ports": Var(None, "list", "the ports (default: every RDMA device's "
                                            "Ethernet netdev)"),
        "kernel_state_root": Var("/", "string", "where sysfs is read and written (the lab's "
                                                "stand-in tree)"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.boolean("roce_qos")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        if self.active(v):
            self.declared(v)
            self.ports(v)
            self.root(v)

    @staticmethod
    def root(v: RoleVars) -> str:
        if v.string("kernel_state_root") == "/":
            return ""
        return v.path("kernel_state_root", "it prefixes the sysfs paths").rstrip("/")

    @staticmethod
    def ports(v: RoleVars) -> tuple[str, ...]:
        names = v.items("roce_qos_ports")
        if not all(isinstance(n, str) and _PORT.match(n) for n in names):
            raise v.fail("roce_qos_ports", "interface names (letters, digits, _ . -; at most "
                         "15 characters)", v.get("roce_qos_ports"))
        return tuple(names)

    @staticmethod
    def declared(v: RoleVars) -> dict[str, Any]:
        """``rdma`` validated: ``pfc_priority`` 0-7, ``trust`` pcp or dscp, ``ecn`` (needs a
        PFC priority: ECN is set on that priority)."""
        rdma = v.mapping("rdma")
        expected = "a mapping of pfc_priority (0-7), trust (pcp or dscp) and ecn (true/false)"
        if not rdma or set(rdma) - {"pfc_priority", "trust", "ecn"}:
            raise v.fail("rdma", expected + " for roce_qos", rdma)
        prio = rdma.get("pfc_priority")
        trust = rdma.get("trust")
        ecn = rdma.get("ecn")
        if prio is not None and (isinstance(prio, bool) or not isinstance(prio, int)
                                 or not 0 <= prio <= 7):
            raise v.fail("rdma", expected, rdma)
        if trust is not None and trust not in TRUSTS:
            raise v.fail("rdma", expected, rdma)
        if ecn is not None and not isinstance(ecn, bool):
            raise v.fail("rdma", expected, rdma)
        if ecn and prio is None:
            raise VarError(f"host {v.host.name}: rdma.ecn needs rdma.pfc_priority (ECN is "
                           "enabled on the PFC priority)")
        return {"pfc_priority": prio, "trust": trust, "ecn": bool(ecn)}

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"boot script": SCRIPT, "health check expectations": CONFIG, "boot unit": UNIT}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({SCRIPT, CONFIG, UNIT}), links=frozenset({UNIT_LINK}),
                           custom=frozenset({state_fact(self.root(v), self.ports(v)), SYSTEMD}))

    @staticmethod
    def commands(tool: str, port: str, want: dict[str, Any], root: str) -> list[str]:
        """The commands that set ``port``'s QoS with ``tool`` (mlnx_qos or dcb)."""
        prio = want["pfc_priority"]
        q = shlex.quote(port)
        commands = []
        if tool == "mlnx_qos":
            options = []
            if want["trust"] is not None:
                options.append(f"--trust {want['trust']}")
            if prio is not None:
                options.append("--pfc " + ",".join("1" if p == prio else "0" for p in range(8)))
            if options:
                commands.append(f"mlnx_qos -i {q} {' '.join(options)} >/dev/null")
        elif prio is not None:
            flags = " ".join(f"{p}:{'on' if p == prio else 'off'}" for p in range(8))
            commands.append(f"dcb pfc set dev {q} prio-pfc {flags}")
        if want["ecn"]:
            base = f"{root}/sys/class/net/{port}/ecn"
            commands += [f"echo 1 > {shlex.quote(f'{base}/{kind}/enable/{prio}')}"
                         for kind in ECN_KINDS]
        return commands

    @staticmethod
    def shown(trust: str | None, pfc: list[int] | None, ecn: str | None) -> str:
        """``trust dscp, PFC 3, ECN on``: what a port has or gets."""
        parts = [f"trust {trust}"] if trust else []
        parts.append("PFC " + (",".join(map(str, pfc)) or "off") if pfc is not None
                     else "PFC unknown")
        return ", ".join([*parts, *([ecn] if ecn else [])])

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        state: dict[str, Any] = facts.require("roce_qos")
        want = self.declared(v)
        root = self.root(v)
        tool = state["tool"]
        ports: dict[str, dict[str, Any]] = state["ports"]
        changes = self._files(facts, tool, sorted(ports), want, root=root)
        prio = want["pfc_priority"]
        for name in sorted(ports):
            port = ports[name]
            if not _PORT.match(name):
                changes.append(Change(self.name, f"qos {name!r}", "set", "unusable name",
                                      "a port name", [Fail(f"the port name {name!r} cannot "
                                                           "be used in a command")]))
                continue
            ecn = port["ecn"].get(prio) if prio is not None else None
            ecn_shown = None if not want["ecn"] else "ECN unknown" if ecn is None else \
                "ECN on" if all(ecn) else "ECN off"
            before = self.shown(port["trust"], port["pfc"], ecn_shown)
            after = self.shown(want["trust"], [prio] if prio is not None else port["pfc"],
                               "ECN on" if want["ecn"] else None)
            problem = self._cannot(tool, port, want, ecn)
            if problem:
                changes.append(Change(self.name, f"qos {name}", "set", port["error"] or before,
                                      after, [Fail(f"{name}: {problem}")]))
                continue
            differs = (want["trust"] is not None and port["trust"] != want["trust"]) or \
                (prio is not None and port["pfc"] != [prio]) or \
                (want["ecn"] and not (ecn and all(ecn)))
            if differs:
                command = " && ".join(self.commands(tool, name, want, root))
                changes.append(Change(self.name, f"qos {name}", "set", before, after,
                                      [Run(command, f"RoCE QoS of {name}")], kind="qos"))
        return changes

    @staticmethod
    def _cannot(tool: str, port: dict[str, Any], want: dict[str, Any],
                ecn: tuple[bool, bool] | None) -> str | None:
        """Why the port cannot be set, or None."""
        if tool not in ("mlnx_qos", "dcb"):
            return ("neither mlnx_qos (mlnx-tools, with MLNX_OFED or DOCA) nor iproute2's dcb "
                    "is installed")
        if port["error"]:
            return str(port["error"])
        if tool == "dcb" and want["trust"] is not None:
            return ("the trust mode can only be set with mlnx_qos; this node has dcb, which "
                    "sets PFC only")
        if want["ecn"] and ecn is None:
            return "no ECN settings in sysfs (/sys/class/net/<port>/ecn): not a ConnectX port?"
        return None

    def _files(self, facts: Facts, tool: str, ports: list[str], want: dict[str, Any], *,
               root: str) -> list[Change]:
        header = HEADER.format(role=self.name)
        usable = [p for p in ports if _PORT.match(p)]
        config = json.dumps({"_comment": header, "ports": usable, "root": root or "/",
                             **want}, indent=2, sort_keys=True) + "\n"
        changes = [file_change(self.name, facts, CONFIG, config)]
        if tool in ("mlnx_qos", "dcb") and facts.require("systemd"):
            blocks = {port: self.commands(tool, port, want, root) for port in usable}
            devices = " ".join(f"sys-subsystem-net-devices-{p.replace('-', chr(92) + 'x2d')}"
                               ".device" for p in usable)
            changes += [
                file_change(self.name, facts, SCRIPT, render("roce-qos.sh.j2", header=header,
                                                             blocks=blocks), mode=0o755),
                file_change(self.name, facts, UNIT, render("gpufleet-roce-qos.service.j2",
                                                           header=header, script=SCRIPT,
                                                           devices=devices)),
                link_change(self.name, facts, UNIT_LINK, "../gpufleet-roce-qos.service"),
            ]
        result = [c for c in changes if c is not None]
        for change in result:
            change.kind = "qos"
        return result


ROLE = RoceQosRole()
