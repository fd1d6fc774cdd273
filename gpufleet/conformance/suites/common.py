"""Settings and validators several suites declare alike (a variable several suites read
has one declaration, so it has one default); the container's settings are
:class:`gpufleet.conformance.container.ContainerSettings`, beside the code that reads them."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.conformance import container, verdict
from gpufleet.conformance.container import ContainerSettings
from gpufleet.conformance.registry import Settings, declared, setting
from gpufleet.ports import PORT_RANGE, RENDEZVOUS_PORT, parse_range
from gpufleet.provision.role import RoleVars


@dataclass(frozen=True, kw_only=True)
class Probe(ContainerSettings):
    """What every suite that launches a torchrun probe reads."""

    allreduce_cpu_procs: int = setting(1, "integer", "processes per node without GPUs")
    allreduce_port: int | None = setting(None, "integer",
                                         "rendezvous port on the first node (default: "
                                         "firewall_rendezvous_port)")
    firewall_rendezvous_port: int = setting(RENDEZVOUS_PORT, "integer",
                                            "the rendezvous port the firewall opens")
    conformance_python: str = setting("python3", "string",
                                      "interpreter of the probes that need no torch")


@dataclass(frozen=True, kw_only=True)
class Performance(Settings):
    """How performance figures are measured and gated."""

    perf_trials: int = declared(verdict.VARIABLES["perf_trials"])
    perf_remeasure_trials: int | None = declared(verdict.VARIABLES["perf_remeasure_trials"])
    perf_remeasure_margin: float = declared(verdict.VARIABLES["perf_remeasure_margin"])
    baseline_fraction: float = declared(verdict.VARIABLES["baseline_fraction"])


@dataclass(frozen=True, kw_only=True)
class Range(Settings):
    """The TCP range open to the cluster."""

    firewall_port_range: str = setting(PORT_RANGE, "string", "TCP range open to the cluster")


@dataclass(frozen=True, kw_only=True)
class Counters(Settings):
    """What the fabric's counters may count during one measurement."""

    nic_max_drops: int = setting(100, "integer", "drops one counter of a fabric port may "
                                                 "count during one measurement")
    nic_max_errors: int = setting(0, "integer", "errors one counter of a fabric port may "
                                                "count during one measurement")
    net_max_retransmit_ratio: float = setting(0.01, "number",
                                              "TCP segments retransmitted per segment sent "
                                              "during one measurement")


def check_range(v: RoleVars) -> None:
    parse_range(v.string("firewall_port_range"), v.host.name, "firewall_port_range")


def positive(v: RoleVars, key: str) -> None:
    if v.number(key) <= 0:
        raise v.fail(key, "a number above 0", v.get(key))


def check_performance(v: RoleVars) -> None:
    verdict.settings(v.host)


def check_in_image(v: RoleVars) -> None:
    """The performance settings of a suite whose probe may run in the training image."""
    check_performance(v)
    container.check(v)


def check_counters(v: RoleVars) -> None:
    for key in ("nic_max_drops", "nic_max_errors"):
        if v.integer(key) < 0:
            raise v.fail(key, "an integer of 0 or more", v.get(key))
    if not 0 <= v.number("net_max_retransmit_ratio") <= 1:
        raise v.fail("net_max_retransmit_ratio", "a number from 0 to 1",
                     v.get("net_max_retransmit_ratio"))
