"""Which transports NCCL chose, from its ``NCCL_DEBUG=INFO`` log (``NCCL_DEBUG_SUBSYS=
INIT,NET``): each channel's ``via P2P/CUMEM``, ``via SHM/direct/direct``, ``via NET/IB/0``
or ``via NET/Socket/0``, and which ranks share a host. Pure functions over log text.

A healthy NVLink node connects its GPUs by P2P; a cluster with InfiniBand or RoCE crosses
nodes by NET/IB. A silent fallback (SHM inside a node, NET/Socket across nodes) still gives
the right sums, only slower: this is what catches it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CHANNEL = re.compile(r"Channel \d+(?:/\d+)? : (\d+)\[\d+\] -> (\d+)\[\d+\](?: \[\w+\])? "
                      r"via (\S+)")
_RANK_HOST = re.compile(r"^(\S+?):\d+:\d+ \[\d+\] NCCL INFO comm 0x[0-9a-f]+ rank (\d+) ")
TRANSPORTS = ("P2P", "SHM", "NET/IB", "NET/Socket")


@dataclass(frozen=True)
class Link:
    """One channel's connection between two ranks, and the transport it uses."""

    src: int
    dst: int
    transport: str  # P2P, SHM, NET/IB, NET/Socket (or the log's own word)
    detail: str     # P2P/CUMEM, NET/IB/0 ...
    same_host: bool


def links(text: str) -> list[Link]:
    """Every channel connection in the log (each once), with whether its ranks share a host
    (as the log's ``host:pid:tid`` prefixes say; unknown ranks count as one host)."""
    hosts = {int(m.group(2)): m.group(1) for line in text.splitlines()
             if (m := _RANK_HOST.match(line.strip()))}
    seen: dict[tuple[int, int, str], Link] = {}
    for match in _CHANNEL.finditer(text):
        src, dst, detail = int(match.group(1)), int(match.group(2)), match.group(3)
        parts = detail.split("/")
        transport = "/".join(parts[:2]) if parts[0] == "NET" else parts[0]
        same = hosts.get(src, "?") == hosts.get(dst, "?")
        seen.setdefault((src, dst, detail), Link(src, dst, transport, detail, same))
    return list(seen.values())


def transport_problems(found: list[Link], intra: str | None, inter: str | None) -> list[str]:
    """Links that do not use the expected transport inside a host (``intra``: P2P ...) or
    across hosts (``inter``: NET/IB ...); None expects nothing. No link at all is a problem
    (the log did not show what NCCL chose)."""
    if not found:
        return ["NCCL's log shows no channel (run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,"
                "NET)"]
    problems = []
    for where, wanted, same in (("inside a node", intra, True), ("across nodes", inter, False)):
        if wanted is None:
            continue
        wrong = sorted({f"{link.src}->{link.dst} via {link.detail}" for link in found
                        if link.same_host is same and link.transport != wanted})
        if wrong:
            shown = ", ".join(wrong[:4]) + (f" (+{len(wrong) - 4} more)" if len(wrong) > 4
                                            else "")
            problems.append(f"{where} NCCL uses {shown}, not {wanted}")
    return problems
