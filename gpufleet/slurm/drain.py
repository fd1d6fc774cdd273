"""Telling the fleet's scheduler about nodes: each run hands over what it found on every
node (the checks or roles that failed, and those it checked again and passed); the node is
drained while any finding of any run is open and resumed once none is left
(gpufleet/slurm/findings.py). Slurm today (``gpufleet_scheduler: slurm``); the commands
run on the controller, so an unreachable node is drained too. A node an operator drained
is left alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.slurm.client import Action, RunFindings, Slurm

SCHEDULER_VAR = "gpufleet_scheduler"


def slurm_of(host: Host) -> Slurm | None:
    """The host's Slurm (``gpufleet_scheduler: slurm``, ``gpufleet_slurm_conf``), or None
    when the inventory names no scheduler."""
    kind = host.vars.get(SCHEDULER_VAR)
    if kind in (None, "", "none"):
        return None
    if kind != "slurm":
        raise GpufleetError(f"host {host.name}: variable {SCHEDULER_VAR} must be slurm or "
                            f"none, got {kind!r}")
    return slurm_client(host)


def slurm_client(host: Host) -> Slurm:
    """Slurm's commands for the host's cluster (``gpufleet_slurm_conf`` as SLURM_CONF)."""
    conf = host.vars.get("gpufleet_slurm_conf")
    return Slurm(conf=Path(str(conf)) if conf else None)


def check(hosts: Sequence[Host], flag: str | None = None) -> None:
    """Refuse, before anything runs, a scheduler variable that is not understood; with
    ``flag`` (``--drain-failed`` ...), also a selected host that names no scheduler, for the
    flag could not act on it."""
    missing = [host.name for host in hosts if slurm_of(host) is None]
    if flag and missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more"
                                          if len(missing) > 5 else "")
        raise GpufleetError(f"{flag}: {shown} name{'s' if len(missing) == 1 else ''} no "
                            f"scheduler, so nothing could be drained there; set "
                            f"{SCHEDULER_VAR}: slurm, or leave them out with --limit")


def slurm_name(host: Host) -> str:
    """The host's node name in Slurm (``gpufleet_slurm_node``, else its inventory name)."""
    return str(host.vars.get("gpufleet_slurm_node") or host.name)


def update(results: Sequence[tuple[Host, Sequence[RunFindings]]]) -> dict[str, str]:
    """Hand each host's findings to its scheduler (where one is named); host name -> what
    was done. A scheduler error is that host's entry, never the run's."""
    done: dict[str, str] = {}
    for host, found in results:
        slurm = slurm_of(host)
        if slurm is not None:
            done[host.name] = _act(functools.partial(slurm.update, slurm_name(host),
                                                     list(found)))
    return done


def _act(call: Callable[[], Action]) -> str:
    try:
        action = call()
    except GpufleetError as exc:
        return f"failed: {exc}"
    return f"{action.action}: {action.detail}"
