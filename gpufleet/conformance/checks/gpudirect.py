"""GPUDirect RDMA: whether NCCL moved data between nodes straight from GPU memory to the NIC,
as its own ``NCCL_DEBUG=INFO`` log says, and, where it did not or cannot, why, from the
``gpudirect`` fact (``parsers.gpudirect``) and the job's NCCL settings. Pure functions.

What the log says, by NCCL version:

- every NCCL: a channel between nodes ``via NET/IB/0/GDRDMA`` (the IB plugins:
  ``NET/IBext_v8/2/GDRDMA``, ``NET/NCCL RDMA Plugin v9/3/GDRDMA``) moved GPU memory over RDMA;
  ``via NET/IB/0`` without it staged every byte through host memory;
- per HCA, from the IB transport: ``NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'``
  (``(no module)`` in NCCL 2.1x), ``... Enabled for HCA ...``, and, in the IB plugins and newer
  NCCL, the route: ``GPU Direct RDMA (nvidia-peermem) enabled`` / ``(DMABUF) enabled``;
- per GPU and HCA, from the topology: ``GPU Direct RDMA Disabled for GPU 0 / HCA 0
  (distance 8 > 5)``, the GPU too far from the NIC for ``NCCL_NET_GDR_LEVEL``;
- ``DMA-BUF is available on GPU device 0`` (the GPU side of dma-buf; NCCL prints it whatever
  the network) and ``NCCL_NET_GDR_LEVEL set by environment to SYS``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpufleet.conformance.checks.nccl_log import Link, links, rank_hosts
from gpufleet.facts.gpudirect import dmabuf_route
from gpufleet.facts.parsers.gpudirect import GDR_SETTINGS

MAX_LOG_CHARS = 8 * 1024 * 1024
_HCA = re.compile(r"GPU Direct RDMA (?:\((?P<route>[\w-]+)\) )?(?P<state>Enabled|Disabled|enabled"
                  r"|disabled) for HCA (?P<index>\d+) '(?P<name>[^']+)'?(?: \((?P<why>[^)]*)\))?")
_DISTANCE = re.compile(r"GPU Direct RDMA Disabled for GPU (\w+) / HCA (\w+) \(distance (\d+) "
                       r"(?:>|>=) (\d+)\)")
_ENV = re.compile(r"(NCCL_(?:NET|IB)_GDR_(?:LEVEL|READ)|NCCL_DMABUF_ENABLE) set by environment "
                  r"to (\S+)")
_DMABUF_GPU = re.compile(r"DMA-BUF is available on GPU device (\d+)")
_VERSION = re.compile(r"NCCL version (\S+)")
_GDR_OFF = ("0", "LOC")
NO_GDRDMA = "has no GDRDMA"


@dataclass(frozen=True)
class GdrLog:
    """What one NCCL log says about GPUDirect RDMA."""

    version: str | None
    net: list[Link]                   # the channels over an RDMA transport (NET/IB, plugins)
    hcas: dict[str, str] = field(default_factory=dict)   # HCA -> "enabled (DMABUF)" ...
    too_far: list[str] = field(default_factory=list)     # "GPU 0 / HCA 0 (distance 8 > 5)"
    environment: dict[str, str] = field(default_factory=dict)
    dmabuf_gpus: bool = False

    @property
    def used(self) -> bool | None:
        """True: every RDMA channel carried GDRDMA; False: one did not; None: no RDMA channel
        (a single node, or NCCL chose sockets)."""
        return None if not self.net else not self.staged(reads=True)

    def staged(self, reads: bool) -> list[Link]:
        """The RDMA channels without GDRDMA; a sending one only where NCCL should read GPU
        memory to send (``reads``: ``NCCL_NET_GDR_READ``, on by default on NVLink platforms
        only)."""
        return [lk for lk in self.net if "GDRDMA" not in lk.detail.split("/")
                and (reads or " [send] " not in lk.line)]

    def routes(self) -> list[str]:
        """The routes NCCL named for its HCAs (``DMABUF``, ``nvidia-peermem``)."""
        return sorted({state.split("(")[1].rstrip(")") for state in self.hcas.values()
                       if state.startswith("enabled (")})


def read_log(text: str, hosts: Mapping[int, str] | None = None) -> GdrLog:
    """The GPUDirect RDMA lines of an NCCL INFO log (at most ``MAX_LOG_CHARS`` of it, the
    rest ignored); ``hosts`` (rank -> host) as for ``nccl_log.links``. Where the ranks' hosts
    are known, only channels between hosts count; where they are not (an excerpt without
    ``comm .. rank`` lines), every channel over an RDMA network does."""
    text = text[:MAX_LOG_CHARS]
    where = rank_hosts(text) if hosts is None else hosts
    net: list[Link] = []
    seen: set[tuple[int, int, str, bool]] = set()
    for line in text.splitlines():
        if " via NET/" not in line:
            continue
        for lk in links(line, where):
            key = (lk.src, lk.dst, lk.detail, " [send] " in lk.line)
            if lk.transport == "NET/IB" and not (where and lk.same_host) and key not in seen:
                seen.add(key)
                net.append(lk)
    hcas: dict[str, str] = {}
    too_far: list[str] = []
    environment: dict[str, str] = {}
    for line in text.splitlines():
        if "GPU Direct RDMA" in line:
            if match := _HCA.search(line):
                state = match.group("state").lower()
                detail = match.group("route") or match.group("why")
                name = match.group("name")
                if state == "enabled" or name not in hcas or not hcas[name].startswith("enabled"):
                    hcas[name] = f"{state} ({detail})" if detail else state
            elif match := _DISTANCE.search(line):
                entry = (f"GPU {match.group(1)} / HCA {match.group(2)} (distance "
                         f"{match.group(3)} > {match.group(4)})")
                if entry not in too_far:
                    too_far.append(entry)
        elif match := _ENV.search(line):
            environment[match.group(1)] = match.group(2)
    version = _VERSION.search(text)
    return GdrLog(version.group(1) if version else None, net, hcas, too_far, environment,
                  bool(_DMABUF_GPU.search(text)))


def gdr_settings(nccl_env: Mapping[str, Any] | None, state: Mapping[str, Any] | None
                 ) -> dict[str, str]:
    """The GPUDirect settings a job on the node gets: /etc/nccl.conf's (the fact), then the
    inventory's ``nccl_env`` (NCCL's own environment wins over nccl.conf)."""
    found = dict((state or {}).get("nccl_conf") or {})
    found.update({k: str(v) for k, v in (nccl_env or {}).items() if k in GDR_SETTINGS})
    return found


def reads_gpu_memory(settings: Mapping[str, str], log: GdrLog | None, nvlink: bool) -> bool:
    """Whether NCCL should send straight from GPU memory (``NCCL_NET_GDR_READ``): as the
    job's settings say, else as NCCL's log says it read them, else NCCL's default: on NVLink
    platforms (``nvlink``: the node's GPUs have active NVLinks), off on PCIe ones."""
    value = settings.get("NCCL_NET_GDR_READ") or (log.environment.get("NCCL_NET_GDR_READ")
                                                 if log else None)
    return nvlink if value is None else value != "0"


def nvlink_node(nvlink: Mapping[Any, Any] | None) -> bool:
    """Whether the ``nvlink`` fact shows an active NVLink on any GPU."""
    return any(any(speed for speed in speeds or []) for speeds in (nvlink or {}).values())


def setting_problem(settings: Mapping[str, str]) -> str | None:
    """A setting that turns GPUDirect RDMA off: ``NCCL_NET_GDR_LEVEL`` (or its old name
    ``NCCL_IB_GDR_LEVEL``) 0 or LOC; None otherwise."""
    for key in ("NCCL_NET_GDR_LEVEL", "NCCL_IB_GDR_LEVEL"):
        value = settings.get(key)
        if value is not None and value.upper() in _GDR_OFF:
            return f"{key}={value} turns GPUDirect RDMA off"
    return None


def route_problem(state: Mapping[str, Any]) -> str | None:
    """Why neither route is open on the node (None when one is): nvidia-peermem absent from
    the running kernel's modules or not loaded, and the dma-buf route unavailable."""
    if state["peermem_loaded"]:
        return None
    dmabuf = dmabuf_route(dict(state))
    if dmabuf is None:
        return None
    peermem = ("nvidia-peermem is not loaded (the module is installed: "
               f"{state['peermem_file']})" if state["peermem_file"] else
               f"nvidia-peermem is absent (no nvidia-peermem.ko in kernel {state['kernel']}'s "
               "modules.dep)")
    return f"{peermem}, and the dma-buf route is unavailable: {dmabuf}"


def route(state: Mapping[str, Any]) -> str | None:
    """The route GPUDirect RDMA can take on the node: ``dma-buf`` where it is available (the
    route NVIDIA recommends), else ``nvidia-peermem`` where it is loaded; None: neither."""
    if dmabuf_route(dict(state)) is None:
        return "dma-buf"
    return "nvidia-peermem" if state["peermem_loaded"] else None


def causes(state: Mapping[str, Any] | None, why_absent: str, settings: Mapping[str, str],
           log: GdrLog | None = None) -> list[str]:
    """Why GPUDirect RDMA is off, diagnosed from the facts (and the log's own words): the
    settings, the routes, NCCL's distance verdict. When nothing explains it, the possible
    causes are named instead (never an empty list)."""
    found = [p for p in (setting_problem({**(log.environment if log else {}), **settings}),
                         route_problem(state) if state is not None else None) if p]
    if state is None:
        found.append(f"the node's GPUDirect facts are unknown ({why_absent})")
    if log is not None and log.too_far:
        found.append("NCCL judged the GPU too far from the NIC for NCCL_NET_GDR_LEVEL: "
                     + ", ".join(log.too_far[:2]))
    if found:
        return found
    return ["neither nvidia-peermem nor dma-buf is at fault by the facts (nvidia-peermem "
            f"{'loaded' if state and state['peermem_loaded'] else 'not loaded'}, dma-buf "
            f"{'available' if state and route(state) == 'dma-buf' else 'unavailable'}): "
            "possibly ACS on the PCIe switch between GPU and NIC (see the pcie checks), an "
            "IOMMU in translation mode, or an RDMA stack without peer-memory or dma-buf "
            "support"]


def log_problem(log: GdrLog, node_of: Mapping[int, str], node: str,
                reads: bool = True) -> str | None:
    """Why ``node``'s side of the log fails: a channel over RDMA to or from one of its ranks
    without GDRDMA (sending ones only with ``reads``; None when all carried it or none
    touched the node). ``node_of``: rank -> node; an empty mapping counts every channel as
    the node's."""
    mine = [lk for lk in log.staged(reads)
            if not node_of or node in (node_of.get(lk.src), node_of.get(lk.dst))]
    if not mine:
        return None
    first = min(mine, key=lambda lk: (lk.src, lk.dst))
    hcas = ", ".join(f"{name} {state}" for name, state in sorted(log.hcas.items())
                     if not state.startswith("enabled"))
    more = f" (and {len(mine) - 1} more channel(s))" if len(mine) > 1 else ""
    return (f"NCCL staged inter-node data through host memory: channel "
            f"{first.line.removeprefix('Channel ')} {NO_GDRDMA}{more}"
            + (f"; NCCL: GPU Direct RDMA {hcas}" if hcas else ""))


@dataclass(frozen=True)
class NodeGdr:
    """What the verdict on one node of a run needs: whether GPUDirect RDMA is required there
    (a GPU node with RDMA devices, ``gpudirect_required``), its ``gpudirect`` fact (None:
    unknown, with why), the GPUDirect settings its jobs get and whether its GPUs have
    NVLink (NCCL then reads GPU memory to send too)."""

    required: bool
    state: Mapping[str, Any] | None
    why_absent: str
    settings: Mapping[str, str]
    nvlink: bool = False


def run_problem(log: GdrLog, node_of: Mapping[int, str],
                nodes: Mapping[str, NodeGdr]) -> str | None:
    """One message per node where GPUDirect RDMA is required and a channel to or from its
    ranks went over the network without GDRDMA, each with its causes; None otherwise."""
    problems = []
    for name in sorted(nodes):
        view = nodes[name]
        reads = reads_gpu_memory(view.settings, log, view.nvlink)
        problem = log_problem(log, node_of, name, reads) if view.required else None
        if problem is not None:
            why = causes(view.state, view.why_absent, view.settings, log)
            problems.append(f"{name}: {problem} -- cause: {'; '.join(why)}")
    return "; ".join(problems) or None


def required(gpu_node: bool, state: Mapping[str, Any] | None, wanted: bool) -> bool:
    """Whether GPUDirect RDMA is required on a node: ``wanted`` (``gpudirect_required``), a
    GPU node, and RDMA devices (unknown facts count as devices: the check is not dropped
    for want of them)."""
    return wanted and gpu_node and (state is None or bool(state["rdma"]))
