"""The allreduce check's inventory variables, declared with their kinds and defaults, and
checked before any host is contacted: a bad value is an error naming the host, the
variable and the file:line that sets it (exit 2)."""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.conformance.checks.nccl_log import INTER, INTRA
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.provision.engine import BadVariables
from gpufleet.provision.role import RoleVars, Var

VARIABLES = {
    "allreduce_sizes": Var(None, "list", "message sizes (probe's defaults)"),
    "allreduce_iters": Var(None, "integer", "timed iterations per size"),
    "allreduce_timeout_s": Var(600, "number", "limit of each node's torchrun"),
    "allreduce_bisect_timeout_s": Var(None, "number", "limit of each pair and search run"),
    "allreduce_cpu_procs": Var(1, "integer", "processes per node without GPUs"),
    "allreduce_port": Var(None, "integer", "rendezvous port on the first node"),
    "allreduce_busbw_thresholds": Var(None, "mapping", "{MODEL: {NODES: GB/s}}"),
    "allreduce_transport_intra": Var("p2p", "string", "NCCL's least transport inside a node"),
    "allreduce_transport_inter": Var("ib", "string", "NCCL's least transport across nodes"),
}
CHOICES = {"allreduce_transport_intra": tuple(INTRA), "allreduce_transport_inter": tuple(INTER)}


def allreduce_vars(host: Host) -> RoleVars:
    """The host's allreduce variables over their defaults, each checked (VarError names the
    host, the variable and where it is set)."""
    v = RoleVars(host, {key: var.default for key, var in VARIABLES.items()})
    for key, var in VARIABLES.items():
        if v.get(key) is None:
            continue
        value = v.checked(key, var.kind)
        if key in CHOICES and str(value).lower() not in CHOICES[key]:
            raise v.fail(key, "one of " + ", ".join(CHOICES[key]), value)
    return v


def expected_transports(host: Host) -> tuple[str, str]:
    """``(intra, inter)``: the transports the host's AllReduce runs must use at least."""
    v = allreduce_vars(host)
    return (v.string("allreduce_transport_intra").lower(),
            v.string("allreduce_transport_inter").lower())


def check_variables(hosts: Sequence[Host], most: int = 20) -> None:
    """Check every host's allreduce variables; BadVariables lists the problems."""
    problems = []
    for host in hosts:
        try:
            allreduce_vars(host)
        except GpufleetError as exc:
            problems.append(str(exc))
    if problems:
        more = f" (and {len(problems) - most} more)" if len(problems) > most else ""
        raise BadVariables("; ".join(problems[:most]) + more)
