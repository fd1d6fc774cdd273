"""RoCE QoS verdicts: PFC, trust, DSCP map and ECN of a RoCE netdev against the inventory
(``measure/rdma.py`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoceState:
    """What a RoCE netdev reports; ``unknown`` says what could not be read."""

    netdev: str
    tool: str | None = None
    trust: str | None = None
    pfc_enabled: list[int] | None = None
    dscp2prio: dict[int, int] = field(default_factory=dict)
    ecn: dict[int, tuple[bool, bool]] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    unknown: list[str] = field(default_factory=list)


def problems(state: RoceState, expected: dict[str, Any], nccl_ib_tc: int | None) -> list[str]:
    """What differs from ``expected`` (pfc_priority, trust, ecn); unreadable values are
    'unknown', never 'off'."""
    found = []
    prio = expected.get("pfc_priority")
    if prio is not None:
        if state.pfc_enabled is None:
            found.append(f"{state.netdev}: PFC unknown")
        elif state.pfc_enabled != [int(prio)]:
            found.append(f"{state.netdev}: PFC enabled on {state.pfc_enabled or 'no priority'}, "
                         f"expected only priority {prio}")
    trust = expected.get("trust")
    if trust is not None:
        if state.trust is None:
            found.append(f"{state.netdev}: trust mode unknown")
        elif state.trust != trust:
            found.append(f"{state.netdev}: trust {state.trust}, expected {trust}")
    if expected.get("ecn") and prio is not None:
        np_rp = state.ecn.get(int(prio))
        if np_rp is None:
            found.append(f"{state.netdev}: ECN on priority {prio} unknown "
                         "(no /sys/class/net/<if>/ecn)")
        elif not all(np_rp):
            found.append(f"{state.netdev}: ECN on priority {prio} is roce_np="
                         f"{int(np_rp[0])} roce_rp={int(np_rp[1])}, expected both enabled")
    if nccl_ib_tc is not None and prio is not None:
        dscp = nccl_ib_tc >> 2
        mapped = state.dscp2prio.get(dscp)
        if mapped is None:
            found.append(f"{state.netdev}: NCCL_IB_TC {nccl_ib_tc} (DSCP {dscp}) has no "
                         "known priority mapping")
        elif mapped != int(prio):
            found.append(f"{state.netdev}: NCCL_IB_TC {nccl_ib_tc} is DSCP {dscp} -> priority "
                         f"{mapped}, but PFC protects priority {prio}")
    return found
