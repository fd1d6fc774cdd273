"""The fabric suite: each node's RDMA ports as its group declares them, and its rail plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.checks import fabric as checks
from gpufleet.conformance.registry import Settings, Suite, setting
from gpufleet.facts.catalog import Fact, rdma_fact
from gpufleet.facts.gather import FactRequest, Facts
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars

SYS = "/sys"
STAND_IN = "rdma_stand_in"
"""The fact of the ports under ``rdma_sys_root`` where it is not /sys."""


@dataclass(frozen=True, kw_only=True)
class FabricSettings(Settings):
    """What the fabric suite reads; unset port fields take the GPU model's defaults."""

    rdma_port_count: int | None = setting(
        None, "integer", "ACTIVE RDMA ports NCCL may use (default: per GPU model)")
    rdma_port_rate_gbps: float | None = setting(
        None, "number", "each port's rate in Gb/s (default: per GPU model)")
    rdma_port_width: str | None = setting(
        None, "string", "each port's width, e.g. 4X (default: per GPU model)")
    rdma_port_link_layer: str | None = setting(
        None, "string", "InfiniBand or Ethernet (default: per GPU model)")
    rdma_port_pkey: str | int | None = setting(
        None, "any", "a partition key every port holds at index 0 or 1, e.g. 0xffff")
    rdma_rails: dict[str, Any] | None = setting(
        None, "mapping", "{GPU0: mlx5_0, ...}: the NIC serving each GPU, nearest it")
    rdma_sys_root: str = setting(SYS, "string", "where the ports' sysfs is read")


def pkey(value: Any) -> str | None:
    """A partition key as 0x-hex text: YAML reads an unquoted 0xffff as the integer 65535."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return f"0x{value:04x}"
    return str(value).lower()


def _check(v: RoleVars) -> None:
    if v.get("rdma_port_count") is not None and v.integer("rdma_port_count") < 1:
        raise v.fail("rdma_port_count", "an integer of at least 1", v.get("rdma_port_count"))
    if v.get("rdma_port_rate_gbps") is not None and not v.number("rdma_port_rate_gbps") > 0:
        raise v.fail("rdma_port_rate_gbps", "a number of Gb/s above 0",
                     v.get("rdma_port_rate_gbps"))
    width = v.opt_string("rdma_port_width")
    if width is not None and not checks.WIDTH.match(width):
        raise v.fail("rdma_port_width", "a width such as 1X, 2X, 4X or 8X", width)
    layer = v.opt_string("rdma_port_link_layer")
    if layer is not None and layer not in checks.LINK_LAYERS:
        raise v.fail("rdma_port_link_layer", " or ".join(checks.LINK_LAYERS), layer)
    raw = v.get("rdma_port_pkey")
    key = pkey(raw)
    if key is not None and (isinstance(raw, bool) or not checks.PKEY.match(key)
                            or (isinstance(raw, int) and not 0 < raw <= 0xFFFF)):
        raise v.fail("rdma_port_pkey", "a partition key, 0x and 1 to 4 hex digits", raw)
    for gpu, nic in v.mapping("rdma_rails").items():
        if not checks.GPU_LABEL.match(str(gpu)) or not isinstance(nic, str) or not nic:
            raise v.fail("rdma_rails", "a mapping of GPU<n> to a NIC name (mlx5_0 or NIC0)",
                         {gpu: nic})
    v.path("rdma_sys_root", "the sysfs root the RDMA ports are read under")


def _facts(host: Host) -> FactRequest:
    root = RoleVars(host, {"rdma_sys_root": SYS}).get("rdma_sys_root")
    if not isinstance(root, str) or root.rstrip("/") in ("", SYS):
        return FactRequest()
    return FactRequest(custom=frozenset({stand_in_fact(root)}))


def stand_in_fact(root: str) -> Fact:
    return rdma_fact(root, STAND_IN)


def ports_fact(settings: FabricSettings) -> str:
    """The name of the fact that holds the node's ports."""
    return "rdma" if settings.rdma_sys_root.rstrip("/") in ("", SYS) else STAND_IN


def declared(settings: FabricSettings, facts: Facts | None,
             ports: list[Any]) -> checks.Declaration:
    """The node's declaration: its inventory's values over its GPU model's defaults."""
    values = {"count": settings.rdma_port_count, "rate_gbps": settings.rdma_port_rate_gbps,
              "width": settings.rdma_port_width, "link_layer": settings.rdma_port_link_layer,
              "pkey": pkey(settings.rdma_port_pkey)}
    gpus = facts.get("gpus") if facts else None
    return checks.declaration(values, gpus, ports)


SUITE = Suite(
    "fabric", ("conformance",),
    "RDMA ports as declared: count of ACTIVE ports, rate, width, link layer, partition key; "
    "the rail plan against the GPU topology",
    order=52,
    settings=FabricSettings,
    facts=_facts,
    check=_check)
