"""Which transports NCCL chose, from its ``NCCL_DEBUG=INFO`` log (``NCCL_DEBUG_SUBSYS=
INIT,NET``): each channel's ``via P2P/CUMEM``, ``via SHM/direct/direct``, ``via NET/IB/0``
or ``via NET/Socket/0``, and which ranks share a host. Pure functions over log text.

A healthy NVLink node connects its GPUs by P2P; a cluster with InfiniBand or RoCE crosses
nodes by NET/IB. A silent fallback (SHM inside a node, NET/Socket across nodes) still gives
the right sums, only slower: this is what catches it.

Shared: the allreduce suite's transport verdict reads it, and ``launch`` condenses every
torchrun probe's log with it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# In brackets: the rank's CUDA device (NCCL 2.19 and later) or its PCI bus id in hex
# (``2[c7000]``, NCCL 2.18 and earlier).
_CHANNEL = re.compile(r"Channel (?:\d+(?:/\d+)?) : (\d+)\[([0-9a-f]+)\] -> (\d+)\[([0-9a-f]+)\]"
                      r"(?: \[\w+\])? via (NET/[A-Za-z][\w .-]*?/\S+|\S+)")
_DEVICE = re.compile(r"^\d{1,3}$")
# The IB plugins of HPC-X and DOCA (nccl-rdma-sharp-plugins) name themselves IBext, IBext_v8..
# and, from their v9, "NCCL RDMA Plugin v9" (a name with spaces: ``via NET/NCCL RDMA Plugin
# v9/3/GDRDMA``).
_IB_PLUGIN = re.compile(r"^(?:IBext(?:_v\d+)?|NCCL RDMA Plugin v\d+)$")
_RANK_HOST = re.compile(r"^(\S+?):\d+:\d+ \[\d+\] NCCL INFO comm 0x[0-9a-f]+ rank (\d+) ")


@dataclass(frozen=True)
class Link:
    """One channel's connection between two ranks, and the transport it uses."""

    src: int
    dst: int
    transport: str  # P2P, SHM, NET/IB, NET/Socket (or the log's own word)
    detail: str     # P2P/CUMEM, NET/IB/0 ...
    same_host: bool
    src_gpu: int = -1  # the CUDA device of each rank (-1 where the log printed a bus id)
    dst_gpu: int = -1
    line: str = ""  # the channel line from "Channel" on


def rank_hosts(text: str) -> dict[int, str]:
    """Rank -> host, from the log's ``host:pid:tid [dev] NCCL INFO comm 0x.. rank N`` lines."""
    return {int(m.group(2)): m.group(1) for line in text.splitlines()
            if (m := _RANK_HOST.match(line.strip()))}


def links(text: str, hosts: Mapping[int, str] | None = None) -> list[Link]:
    """Every channel connection in the log (each once), with whether its ranks share a host
    (as ``hosts`` says, else the log's ``host:pid:tid`` prefixes; unknown ranks count as one
    host)."""
    where = rank_hosts(text) if hosts is None else hosts
    seen: dict[tuple[int, int, str], Link] = {}
    for match in _CHANNEL.finditer(text):
        src, dst, detail = int(match.group(1)), int(match.group(3)), match.group(5)
        same = where.get(src, "?") == where.get(dst, "?")
        seen.setdefault((src, dst, detail), Link(
            src, dst, _transport(detail), detail, same, _device(match.group(2)),
            _device(match.group(4)), match.group(0)))
    return list(seen.values())


def _transport(detail: str) -> str:
    """``P2P`` of ``P2P/CUMEM/read``, ``NET/IB`` of ``NET/IB/0/GDRDMA`` and of the IB
    plugins' ``NET/IBext_v8/2``."""
    parts = detail.split("/")
    if parts[0] != "NET" or len(parts) < 2:
        return parts[0]
    return "NET/IB" if _IB_PLUGIN.match(parts[1]) else f"NET/{parts[1]}"


def _device(bracket: str) -> int:
    """The CUDA device in a channel line's brackets; -1 where older NCCL put the bus id."""
    return int(bracket) if _DEVICE.match(bracket) else -1


# What each expectation accepts: the expected transport or a better one. NVLS shares its
# channels with P2P (rings and trees still connect by P2P), so both pass ``nvls``.
INTRA = {"p2p": ("P2P", "NVLS"), "nvls": ("NVLS", "P2P"), "shm": ("SHM", "P2P", "NVLS"),
         "any": ()}
INTER = {"ib": ("NET/IB",), "socket": ("NET/Socket", "NET/IB"), "any": ()}
EXPECTED = {"p2p": "P2P (NVLink)", "nvls": "NVLS or P2P (NVLink)", "shm": "SHM or P2P",
            "ib": "NET/IB (InfiniBand/RoCE)", "socket": "NET/Socket or NET/IB"}


def mismatches(found: list[Link], intra: str, inter: str,
               node_of: Mapping[int, str] | None = None) -> list[str]:
    """One message per unexpected transport inside a node and across nodes, naming the
    GPUs (and nodes, from ``node_of``: rank -> node), a sample channel line and what was
    expected; ``intra``/``inter`` are keys of :data:`INTRA`/:data:`INTER`."""
    nodes = node_of or {}
    problems = []
    for same, wanted, accepted in ((True, intra, INTRA[intra]), (False, inter, INTER[inter])):
        if not accepted:
            continue
        wrong: dict[str, list[Link]] = {}
        for link in found:
            if link.same_host is same and link.transport not in accepted:
                wrong.setdefault(link.transport, []).append(link)
        for transport, bad in wrong.items():
            first = min(bad, key=lambda lk: (lk.src, lk.dst))
            src, dst = _gpu(first.src, first.src_gpu), _gpu(first.dst, first.dst_gpu)
            ends = (f"{src} and {dst}" if same else
                    f"{nodes.get(first.src, f'rank {first.src}')} {src} and "
                    f"{nodes.get(first.dst, f'rank {first.dst}')} {dst}")
            prefix = f"{nodes[first.src]}: " if same and first.src in nodes else ""
            more = f" (and {len(bad) - 1} more link(s) via {transport})" if len(bad) > 1 else ""
            problems.append(f"{prefix}NCCL used {transport} between {ends} "
                            f"(channel {first.line.removeprefix('Channel ')}), expected "
                            f"{EXPECTED[wanted]}{more}")
    return problems


def _gpu(rank: int, device: int) -> str:
    """``GPU 3``, or ``rank 2`` where the log named the GPU by its bus id."""
    return f"GPU {device}" if device >= 0 else f"rank {rank}"


def observed(found: list[Link]) -> dict[str, list[str]]:
    """The transports seen inside nodes and across nodes (``P2P/CUMEM``, ``NET/IB/0`` ...)."""
    return {"intra": sorted({lk.detail for lk in found if lk.same_host}),
            "inter": sorted({lk.detail for lk in found if not lk.same_host})}


_KEPT = ("Using network", "NET/IB : No device found", " NCCL WARN ", "NCCL version")


def condense(lines: list[str], tail: int = 20, most: int = 200) -> list[str]:
    """The NCCL log lines a transport verdict needs, in order: each rank's ``comm .. rank``
    line, each distinct channel connection once, the network NCCL chose and its warnings;
    then the last ``tail`` lines; at most ``most`` lines in all."""
    kept: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for line in lines:
        channel = _CHANNEL.search(line)
        rank = _RANK_HOST.match(line.strip())
        if channel:
            key: tuple[str, ...] = ("channel", channel.group(1), channel.group(3),
                                    channel.group(5))
        elif rank:
            key = ("rank", rank.group(1), rank.group(2))
        elif any(word in line for word in _KEPT):
            key = ("line", line.split(" NCCL ", 1)[-1])
        else:
            continue
        if key not in seen:
            seen.add(key)
            kept.append(line)
    end = [line for line in lines[-tail:] if line not in kept] if tail else []
    return (kept[:most - len(end)] + end)[:most]
