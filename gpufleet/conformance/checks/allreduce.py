"""The allreduce suite's own variables (declared with their kinds and defaults for the
suite registry) and the choices among NCCL's transports they accept."""

from __future__ import annotations

from gpufleet.conformance.checks.nccl_log import INTER, INTRA
from gpufleet.inventory.model import Host
from gpufleet.provision.role import RoleVars, Var

VARIABLES = {
    "allreduce_sizes": Var(None, "list", "message sizes (probe's defaults)"),
    "allreduce_iters": Var(None, "integer", "timed iterations per size"),
    "allreduce_timeout_s": Var(600, "number", "limit of each node's torchrun"),
    "allreduce_bisect_timeout_s": Var(None, "number", "limit of each pair and search run"),
    "allreduce_busbw_thresholds": Var(None, "mapping", "{MODEL: {NODES: GB/s}}"),
    "allreduce_transport_intra": Var("p2p", "string", "NCCL's least transport inside a node"),
    "allreduce_transport_inter": Var("ib", "string", "NCCL's least transport across nodes"),
    "allreduce_min_line_rate_fraction": Var(0.7, "number",
                                            "busbw across nodes per the slowest node's line "
                                            "rate"),
    "nic_line_rate_gbps": Var(None, "number", "the node's line rate (default: its RDMA "
                                              "ports' or its interface's link speed)"),
}
CHOICES = {"allreduce_transport_intra": tuple(INTRA), "allreduce_transport_inter": tuple(INTER)}


def check_choices(v: RoleVars) -> None:
    """The transport variables name transports NCCL has (VarError names host, key, place)."""
    for key, choices in CHOICES.items():
        value = v.string(key)
        if value.lower() not in choices:
            raise v.fail(key, "one of " + ", ".join(choices), value)


def expected_transports(host: Host) -> tuple[str, str]:
    """``(intra, inter)``: the transports the host's AllReduce runs must use at least."""
    v = RoleVars(host, {k: var.default for k, var in VARIABLES.items()})
    return (v.string("allreduce_transport_intra").lower(),
            v.string("allreduce_transport_inter").lower())
