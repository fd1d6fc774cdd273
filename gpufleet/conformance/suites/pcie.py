"""The pcie suite (in no set: ``--suite pcie`` or ``all`` runs it): PCIe peer-to-peer
between each GPU and its nearest NICs (ACS), the IOMMU's mode, every GPU's and NIC's link as
trained against what it is capable of, and the NICs' Device Control where the inventory
declares it."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import roles
from gpufleet.conformance.registry import Settings, Suite, declared, setting
from gpufleet.facts.gather import FactRequest
from gpufleet.facts.pcie import pcie_fact
from gpufleet.inventory.model import Host
from gpufleet.provision.role import SAFE_PATH, RoleVars

READ_REQUESTS = (128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True, kw_only=True)
class PcieSettings(Settings):
    """What the pcie suite reads (the pcie role reads the first two)."""

    pcie_sys_root: str = declared(roles.pcie_settings()["pcie_sys_root"])
    pcie_iommu_passthrough: bool = declared(roles.pcie_settings()["pcie_iommu_passthrough"])
    pcie_acs_check: bool = setting(True, "boolean", "no ACS redirection between a GPU and "
                                                    "its nearest NICs")
    pcie_link_check: bool = setting(True, "boolean", "every GPU and NIC link at the width "
                                                     "(NICs: and speed) it is capable of")
    pcie_nic_max_read_request: int | None = setting(None, "integer", "every NIC's MaxReadReq "
                                                                     "in bytes (128-4096)")
    pcie_nic_relaxed_ordering: bool | None = setting(None, "boolean", "relaxed ordering on "
                                                                      "(or off) on every NIC")


def root(settings: PcieSettings) -> str:
    """``pcie_sys_root`` as a path prefix: ``""`` for ``/``."""
    return "" if settings.pcie_sys_root == "/" else settings.pcie_sys_root.rstrip("/")


def _check(v: RoleVars) -> None:
    if v.string("pcie_sys_root") != "/":
        v.path("pcie_sys_root", "it prefixes the sysfs and procfs paths")
    size = v.get("pcie_nic_max_read_request")
    if size is not None and v.integer("pcie_nic_max_read_request") not in READ_REQUESTS:
        raise v.fail("pcie_nic_max_read_request",
                     "one of " + ", ".join(map(str, READ_REQUESTS)) + " (bytes)", size)


def _facts(host: Host) -> FactRequest:
    settings = PcieSettings.read(host)
    devctl = settings.pcie_nic_max_read_request is not None \
        or settings.pcie_nic_relaxed_ordering is not None
    if settings.pcie_sys_root != "/" and not SAFE_PATH.match(settings.pcie_sys_root):
        return FactRequest()
    return FactRequest(custom=frozenset({pcie_fact(root(settings), devctl)}))


SUITE = Suite(
    "pcie", (),
    "ACS off between each GPU and its nearest NICs, the IOMMU in passthrough, GPU and NIC "
    "links as capable, NIC MaxReadReq and relaxed ordering where declared",
    order=102,
    settings=PcieSettings,
    facts=_facts,
    check=_check)
