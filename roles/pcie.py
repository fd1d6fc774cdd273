"""PCIe peer-to-peer between each GPU and its nearest NICs: ACS redirection off on the PCIe
switch ports between them, now and at every boot; the IOMMU's mode reported.

On HGX boards a GPU and its NIC sit under one PCIe switch. With ACS P2P Request Redirect,
Completion Redirect or Egress Control on a port between them, every GPUDirect RDMA
transfer is sent up to the root complex: bandwidth falls or transfers hang (NCCL's
troubleshooting guide, "PCI Access Control Services (ACS)"; DGX OS disables ACS). The
firmware or the kernel sets ACS again at every boot, so the role clears the three
redirecting bits (``setpci ECAP_ACS+6.w=0000:002c``, the other controls left as they are)
on the bridges of every GPU-NIC path (:func:`gpufleet.facts.pcie.gpu_nic_paths`)
and writes a boot unit that does it again. Opt-in (``pcie_acs_disable: true``): ACS
isolates devices from each other, which a node that passes devices to virtual machines
needs.

The IOMMU in translation mode (``DMA``/``DMA-FQ`` groups) maps every DMA of the GPUs and
NICs: DGX OS sets ``iommu=pt`` (passthrough). That is the kernel command line, which the
role reports for an operator and never writes (``pcie_iommu_passthrough: false`` leaves it
alone).

``pcie_sys_root`` names where sysfs and procfs are read: ``/`` on a node; the lab points it
at a stand-in tree (lab nodes share the controller's kernel).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

from gpufleet.facts import pcie
from gpufleet.facts.catalog import SYSTEMD
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.facts.pcie import ACS_REGISTER, NAME, pcie_fact
from gpufleet.provision.managed import HEADER, file_change, link_change, render
from gpufleet.provision.plan import MANUAL, Change, Fail, Run
from gpufleet.provision.role import PlanContext, RoleBase, RoleVars, Var

SCRIPT = "/etc/gpufleet/pcie-acs.sh"
UNIT = "/etc/systemd/system/gpufleet-pcie-acs.service"
UNIT_LINK = "/etc/systemd/system/multi-user.target.wants/gpufleet-pcie-acs.service"
CLEAR = f"{ACS_REGISTER}=0000:{pcie.ACS_REDIRECT_MASK:04x}"
"""setpci's write that clears the redirecting ACS controls and leaves the others."""


def clear_command(root: str, bridge: str) -> str:
    """The shell that clears the redirecting ACS controls of ``bridge`` if it is there."""
    where = shlex.quote(f"{root}/sys/bus/pci/devices/{bridge}")
    return f"[ ! -e {where} ] || setpci -s {bridge} {CLEAR}"


class PcieRole(RoleBase):
    name = "pcie"
    order = 73
    variables: ClassVar[Mapping[str, Var]] = {
        "pcie_acs_disable": Var(False, "boolean", "clear ACS redirection on the bridges "
                                                  "between each GPU and its nearest NICs, "
                                                  "now and at boot (the role's switch)"),
        "pcie_iommu_passthrough": Var(True, "boolean", "the IOMMU in passthrough (iommu=pt) "
                                                       "on GPU nodes: reported, never set"),
        "pcie_sys_root": Var("/", "string", "where sysfs and procfs are read (the lab's "
                                            "stand-in tree)"),
    }

    def active(self, v: RoleVars) -> bool:
        return v.boolean("pcie_acs_disable")

    def check(self, v: RoleVars) -> None:
        super().check(v)
        v.boolean("pcie_acs_disable")
        v.boolean("pcie_iommu_passthrough")
        self.root(v)

    @staticmethod
    def root(v: RoleVars) -> str:
        """``pcie_sys_root`` as a path prefix: ``""`` for ``/``."""
        if v.string("pcie_sys_root") == "/":
            return ""
        return v.path("pcie_sys_root", "it prefixes the sysfs and procfs paths").rstrip("/")

    def managed_files(self, v: RoleVars) -> dict[str, str]:
        return {"boot script": SCRIPT, "boot unit": UNIT}

    def request(self, v: RoleVars) -> FactRequest:
        return FactRequest(files=frozenset({SCRIPT, UNIT}), links=frozenset({UNIT_LINK}),
                           custom=frozenset({pcie_fact(self.root(v)), SYSTEMD}))

    def plan(self, facts: Facts, v: RoleVars, ctx: PlanContext) -> list[Change]:
        state: dict[str, Any] = facts.require(NAME)
        root = self.root(v)
        bridges = pcie.path_bridges(state)
        changes = self._acs(state, bridges, root)
        changes += self._iommu(state, v)
        if bridges and facts.require("systemd"):
            header = HEADER.format(role=self.name)
            commands = [clear_command(root, b) for b in bridges]
            files = [
                file_change(self.name, facts, SCRIPT, render("pcie-acs.sh.j2", header=header,
                                                             commands=commands), mode=0o755),
                file_change(self.name, facts, UNIT, render("gpufleet-pcie-acs.service.j2",
                                                           header=header, script=SCRIPT)),
                link_change(self.name, facts, UNIT_LINK, "../gpufleet-pcie-acs.service"),
            ]
            changes = [c for c in files if c is not None] + changes
        return changes

    def _acs(self, state: dict[str, Any], bridges: list[str], root: str) -> list[Change]:
        if not bridges:
            return []
        if state["acs"] is None:
            reason = state["acs_unknown"] or "ACS was not read"
            return [Change(self.name, "acs GPU-NIC bridges", "clear", "unknown",
                           "redirects off", [Fail(reason)])]
        changes = []
        for bridge in bridges:
            word = state["acs"].get(bridge)
            if word is None:  # no ACS capability (a switch's upstream port): nothing redirects
                continue
            if isinstance(word, str):
                changes.append(Change(self.name, f"acs {bridge}", "clear", "unknown",
                                      "redirects off",
                                      [Fail(f"the ACS of {bridge} cannot be read: {word}")]))
                continue
            on = pcie.acs_redirects(word)
            if on:
                changes.append(Change(self.name, f"acs {bridge}", "clear",
                                      " ".join(f"{n}+" for n in on) + f" (ACSCtl {word:04x})",
                                      "redirects off",
                                      [Run(clear_command(root, bridge),
                                           f"ACS redirects off on {bridge}")]))
        return changes

    def _iommu(self, state: dict[str, Any], v: RoleVars) -> list[Change]:
        if not v.boolean("pcie_iommu_passthrough"):
            return []
        if not any(d["kind"] == "gpu" for d in state["devices"]):
            return []
        found = pcie.translating(state)
        if not found:
            return []
        cmdline = state["cmdline"] or ""
        return [Change(self.name, "cmdline iommu", MANUAL,
                       f"translation: {', '.join(found)}; kernel command line {cmdline!r}",
                       "iommu=pt on the kernel command line (GRUB_CMDLINE_LINUX), then a "
                       "reboot")]


ROLE = PcieRole()
