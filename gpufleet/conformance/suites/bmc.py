"""The bmc suite: power and cooling read from each node's BMC."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.bmc.target import target_of
from gpufleet.conformance.checks import bmc as bmc_checks
from gpufleet.conformance.registry import Settings, Suite, setting
from gpufleet.conformance.suites.common import positive
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class BmcSettings(Settings):
    """What the bmc suite reads."""

    bmc_address: str | None = setting(None, "string", "the BMC: host, address, host:port or "
                                                      "https://host[:port] (none: not checked)")
    bmc_user: str | None = setting(None, "string", "the BMC account (read-only is enough)")
    bmc_password: str | None = setting(None, "string", "its password (a secret: keep it in a "
                                                       "vault file)")
    bmc_ca_file: str | None = setting(None, "string", "CA bundle on the controller that the "
                                                      "BMC's certificate chains to (default: "
                                                      "the system's)")
    bmc_protocol: str = setting("redfish", "string", "redfish or ipmi (RMCP+)")
    bmc_ipmi_cipher_suite: int = setting(17, "integer", "the RMCP+ cipher suite")
    psu_rating_w: float | None = setting(None, "number", "each PSU's rating where the BMC "
                                                         "reports none (IPMI)")
    psu_min_headroom: float = setting(1.3, "number", "healthy PSU rating over the measured "
                                                     "peak")
    psu_redundancy: str | None = setting(None, "string", "N, N+M or 2N: the PSUs the node "
                                                         "must run without")
    bmc_max_inlet_c: float = setting(35, "number", "highest inlet temperature (C)")
    bmc_sel_window_h: float = setting(24, "number", "critical log entries of the last N "
                                                    "hours fail (the runs' interval)")
    bmc_read_budget_s: float = setting(120, "number", "seconds for the whole reading of one "
                                                      "BMC (every request together)")
    rack: str | None = setting(None, "string", "the node's rack (default: its first group "
                                               "named rack*)")
    rack_power_w: float | None = setting(None, "number", "the rack's supply (none: no budget)")
    rack_cooling: str = setting("air", "string", "air or liquid")
    rack_power_margin: float = setting(0.8, "number", "share of the supply the measured "
                                                      "peaks may use")
    rack_power_allow_unknown: bool = setting(False, "boolean", "bootstrap admits a node "
                                             "while rack members' peaks are unknown")


def _check(v: RoleVars) -> None:
    target_of(v.host)
    for key in ("bmc_max_inlet_c", "bmc_sel_window_h", "bmc_read_budget_s"):
        positive(v, key)
    if v.number("psu_min_headroom") < 1:
        raise v.fail("psu_min_headroom", "a number of 1 or more", v.get("psu_min_headroom"))
    try:
        bmc_checks.parse_redundancy(v.get("psu_redundancy"))
    except ValueError:
        raise v.fail("psu_redundancy", "N, N+M or 2N", v.get("psu_redundancy")) from None
    for key in ("rack_power_w", "psu_rating_w"):
        if v.get(key) is not None:
            positive(v, key)
    if not 0 < v.number("rack_power_margin") <= 1:
        raise v.fail("rack_power_margin", "a number above 0, at most 1",
                     v.get("rack_power_margin"))
    if v.string("rack_cooling") not in ("air", "liquid"):
        raise v.fail("rack_cooling", "air or liquid", v.get("rack_cooling"))
    v.boolean("rack_power_allow_unknown")


SUITE = Suite(
    "bmc", ("acceptance",),
    "power and cooling from each node's BMC (Redfish): PSUs against the measured "
    "peak, inlet and fans, critical events; each rack's power budget",
    order=110,
    settings=BmcSettings,
    cross_node=frozenset({"rack_power_budget"}), records_baseline=True,
    check=_check)
