"""Fabric ports as declared: a node's ACTIVE RDMA ports against the ports its group declares
(count, rate, width, link layer, partition key), and an optional rail plan (the NIC that
serves each GPU) against the GPU topology.

The ports judged are those NCCL may use (``NCCL_IB_HCA`` of ``nccl_env``; every port when
unset): the same ports the line-rate gate sums. Where the inventory declares nothing, the
GPU model's defaults apply (MODEL_DEFAULTS): an HGX H100 or H200 board (eight SXM GPUs)
with its compute fabric has eight ACTIVE 400 Gb/s NDR InfiniBand ports of width 4X, one
ConnectX-7 per GPU (NVIDIA DGX H100/H200 User Guide, "Network Modules"; NVIDIA DGX BasePOD
Reference Architecture and Deployment Guide, the compute fabric's eight ports). The default
applies only where that fabric is seen (an InfiniBand port among the ports judged); on any
other node (RoCE, no RDMA device, another model) nothing is declared, nothing is checked,
and the check says so. No partition key is a default: the fabric's subnet manager sets it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

LINK_LAYERS = ("InfiniBand", "Ethernet")
WIDTH = re.compile(r"^\d+X$")
PKEY = re.compile(r"^0x[0-9a-fA-F]{1,4}$")
GPU_LABEL = re.compile(r"^GPU\d+$")
VARIABLES = {"count": "rdma_port_count", "rate_gbps": "rdma_port_rate_gbps",
             "width": "rdma_port_width", "link_layer": "rdma_port_link_layer",
             "pkey": "rdma_port_pkey"}
HGX_SOURCE = ("NVIDIA DGX H100/H200 User Guide, Network Modules (eight single-port ConnectX-7, "
              "one per GPU, behind four OSFP ports); NVIDIA DGX BasePOD Reference "
              "Architecture, Core Components (up to 400 Gb/s InfiniBand) and Deployment Guide, "
              "Network Ports (the eight ports form the InfiniBand compute fabric)")
HGX_PORTS: dict[str, Any] = {"count": 8, "rate_gbps": 400.0, "width": "4X",
                             "link_layer": "InfiniBand"}
MODEL_DEFAULTS: tuple[tuple[re.Pattern[str], int, dict[str, Any], str], ...] = (
    (re.compile(r"\bH(?:100|200)\b(?!.*\b(?:PCIe|NVL)\b)"), 8, HGX_PORTS, HGX_SOURCE),
)
"""(GPU model as nvidia-smi names it, GPUs on the board, the ports, the source)."""
# nvidia-smi topo -m's PCIe distances, nearest first.
DISTANCE = ("PIX", "PXB", "PHB", "NODE", "SYS")
HARDWARE = "hardware"
CONFIGURATION = "configuration"


@dataclass(frozen=True)
class Finding:
    """One difference from the declaration: its text and its class (hardware or
    configuration)."""

    text: str
    kind: str


@dataclass(frozen=True)
class Declaration:
    """The ports a node should have; ``origin`` says for each field whether the inventory set
    it or a model default did, ``source`` where that default comes from; ``note`` says why
    nothing is declared."""

    count: int | None = None
    rate_gbps: float | None = None
    width: str | None = None
    link_layer: str | None = None
    pkey: str | None = None
    origin: dict[str, str] = field(default_factory=dict)
    note: str = ""
    source: str = ""

    def empty(self) -> bool:
        return all(getattr(self, k) is None for k in VARIABLES)

    def variable(self, key: str) -> str:
        """The variable that sets ``key``, with the default's source where it came from one."""
        return self.origin.get(key, VARIABLES[key])


def port_name(port: Mapping[str, Any]) -> str:
    return f"{port['device']}/{port['port']}"


def _hca_spec(spec: str) -> tuple[bool, list[tuple[str, str | None]]]:
    """NCCL_IB_HCA as (exclude, [(device prefix, port)]); ``=`` (exact names) read as a
    prefix, which names the same devices for NCCL's usual names."""
    exclude = spec.startswith("^")
    names = spec.lstrip("^=")
    return exclude, [(n.split(":")[0], n.split(":")[1] if ":" in n else None)
                     for n in names.split(",") if n]


def nccl_usable(name: str, spec: str) -> bool:
    """Whether NCCL may use port ``mlx5_0/1`` under NCCL_IB_HCA ``spec`` (all when empty)."""
    if not spec:
        return True
    dev, number = name.split("/")
    exclude, pairs = _hca_spec(spec)
    named = any(dev.startswith(d) and (p is None or p == number) for d, p in pairs)
    return named != exclude


def judged_ports(ports: Sequence[Mapping[str, Any]], spec: str) -> list[Mapping[str, Any]]:
    """The ports NCCL may use, in device order."""
    return sorted((p for p in ports if nccl_usable(port_name(p), spec)), key=port_name)


def declaration(values: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]] | None,
                ports: Sequence[Mapping[str, Any]]) -> Declaration:
    """The inventory's values (``count``, ``rate_gbps``, ``width``, ``link_layer``,
    ``pkey``) over the GPU model's defaults; ``ports`` are those judged (the default
    applies where one of them is InfiniBand)."""
    given = {k: values.get(k) for k in VARIABLES if values.get(k) is not None}
    origin: dict[str, str] = {}
    merged: dict[str, Any] = {}
    note = source = ""
    model = str(gpus[0].get("name", "")) if gpus else ""
    default = next(((d, source) for pattern, count, d, source in MODEL_DEFAULTS
                    if pattern.search(model) and len(gpus or []) == count), None)
    if default is None:
        note = (f"no default for {len(gpus)}x {model}" if gpus else "no default without GPUs")
    elif not any(p.get("link_layer") == "InfiniBand" for p in ports):
        note = (f"the default for {len(gpus or [])}x {model} is an InfiniBand fabric, and this "
                "node shows no InfiniBand port: its fabric is unknown")
    else:
        fields_, source = default
        source = f"8x {model}: {source}"
        for key, value in fields_.items():
            merged[key] = value
            origin[key] = f"{VARIABLES[key]}, the default for {len(gpus or [])}x {model}"
    merged.update(given)
    for key in given:
        origin[key] = VARIABLES[key]
    if not merged and not note:
        note = "nothing declared"
    return Declaration(count=merged.get("count"),
                       rate_gbps=None if merged.get("rate_gbps") is None
                       else float(merged["rate_gbps"]),
                       width=merged.get("width"), link_layer=merged.get("link_layer"),
                       pkey=None if merged.get("pkey") is None else str(merged["pkey"]).lower(),
                       origin=origin, note=note, source=source)


def _gbps(value: float) -> str:
    return f"{value:g} Gb/s"


def port_findings(ports: Sequence[Mapping[str, Any]], decl: Declaration,
                  expected_devices: Sequence[str] = (), named: bool = False) -> list[Finding]:
    """What differs between the judged ports and the declaration. The ports of the declared
    link layer are counted: fewer ACTIVE than declared fails, naming the ports not ACTIVE,
    the ACTIVE ports of another link layer (a port configured for the other protocol) and
    the ``expected_devices`` with no port at all. Each ACTIVE port of the declared link
    layer is held to the rate, width and partition key. A port of another link layer fails
    by itself only where NCCL_IB_HCA names the ports (``named``): elsewhere it may be a
    storage or management port beside the fabric."""
    found: list[Finding] = []
    layer_var = decl.variable("link_layer")
    other = [p for p in ports if decl.link_layer is not None
             and p.get("link_layer") != decl.link_layer]
    fabric = [p for p in ports if p not in other]
    active = [p for p in fabric if p.get("state") == "ACTIVE"]
    wrong_layer = [Finding(f"{port_name(p)}: link layer {p.get('link_layer') or 'unknown'}, "
                           f"expected {decl.link_layer} ({layer_var})", CONFIGURATION)
                   for p in other if p.get("state") == "ACTIVE"]
    if decl.count is not None and len(active) < decl.count:
        down = [f"{port_name(p)} {p.get('state') or 'state unknown'}"
                + (f" ({p['phys_state']})" if p.get("phys_state") else "")
                for p in fabric if p.get("state") != "ACTIVE"]
        present = {p["device"] for p in ports}
        absent = [f"{d} absent" for d in expected_devices if d not in present]
        detail = "; ".join(down + [f.text for f in wrong_layer] + absent)
        explained = len(active) + len(wrong_layer) >= decl.count
        kind = CONFIGURATION if explained and not down and not absent else HARDWARE
        layer = f" {decl.link_layer}" if decl.link_layer else ""
        found.append(Finding(f"{len(active)} ACTIVE{layer} RDMA ports, expected "
                             f"{decl.count} ({decl.variable('count')})"
                             + (f": {detail}" if detail else ""), kind))
    elif named:
        found += wrong_layer
    for p in active:
        name = port_name(p)
        rate, width = p.get("rate_gbps"), p.get("width")
        if decl.rate_gbps is not None:
            if rate is None:
                found.append(Finding(f"{name}: rate unknown, expected {_gbps(decl.rate_gbps)} "
                                     f"({decl.variable('rate_gbps')})", HARDWARE))
            elif rate != decl.rate_gbps:
                trained = " (trained down)" if rate < decl.rate_gbps else ""
                found.append(Finding(f"{name}: rate {_gbps(rate)}{trained}, expected "
                                     f"{_gbps(decl.rate_gbps)} ({decl.variable('rate_gbps')})",
                                     HARDWARE if rate < decl.rate_gbps else CONFIGURATION))
        if decl.width is not None and width != decl.width:
            found.append(Finding(f"{name}: width {width or 'unknown'}, expected {decl.width} "
                                 f"({decl.variable('width')})", HARDWARE))
        keys = [str(k).lower() for k in p.get("pkeys") or []]
        if decl.pkey is not None and int(decl.pkey, 16) not in {int(k, 16) for k in keys}:
            found.append(Finding(f"{name}: partition keys {', '.join(keys) or 'none'}, "
                                 f"expected {decl.pkey} ({decl.variable('pkey')})",
                                 CONFIGURATION))
    return found


def finding_class(findings: Sequence[Finding]) -> str:
    """The class of a failing result: hardware when any finding is, else configuration."""
    return HARDWARE if any(f.kind == HARDWARE for f in findings) else CONFIGURATION


def nearest_nics(topology: Mapping[str, Any], gpu: str) -> tuple[str | None, list[str]]:
    """The distance and names of the NICs nearest ``gpu`` in ``nvidia-smi topo -m`` (the
    NIC Legend's names where printed, else NIC0...); (None, []) without NICs."""
    row = (topology.get("matrix") or {}).get(gpu) or {}
    legend = topology.get("nics") or {}
    nics = {legend.get(c, c): row[c] for c in row if not GPU_LABEL.match(c) and row[c] != "X"
            and row[c] in DISTANCE}
    if not nics:
        return None, []
    best = min(nics.values(), key=DISTANCE.index)
    return best, sorted(n for n, d in nics.items() if d == best)


def rail_findings(rails: Mapping[str, str], topology: Mapping[str, Any],
                  ports: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Each GPU's declared NIC (``rdma_rails``, a name of the NIC Legend or NIC0...) is among
    the NICs nearest it in the topology, and has an ACTIVE port where it is an RDMA device."""
    found: list[Finding] = []
    legend = topology.get("nics") or {}
    labels = {v: k for k, v in legend.items()}
    matrix = topology.get("matrix") or {}
    gpus = topology.get("gpus") or []
    devices = {p["device"] for p in ports}
    active = {p["device"] for p in ports if p.get("state") == "ACTIVE"}
    for gpu, given in sorted(rails.items(), key=lambda kv: int(kv[0][3:])):
        if gpu not in gpus:
            found.append(Finding(f"{gpu}: not in nvidia-smi topo -m (GPUs: "
                                 f"{', '.join(gpus) or 'none'}) (rdma_rails)", CONFIGURATION))
            continue
        nic = legend.get(given, given)
        seen = matrix[gpu].get(labels.get(nic, nic))
        if seen is None:
            names = sorted(legend.values()) or sorted(c for c in matrix[gpu]
                                                      if not GPU_LABEL.match(c))
            found.append(Finding(f"{gpu}: rail {nic} is not in nvidia-smi topo -m (NICs: "
                                 f"{', '.join(names) or 'none'}) (rdma_rails)", HARDWARE))
            continue
        distance, nearest = nearest_nics(topology, gpu)
        if nic not in nearest:
            found.append(Finding(f"{gpu}: rail {nic} is {seen} from it, expected the nearest "
                                 f"NIC: {', '.join(nearest)} ({distance}) (rdma_rails)",
                                 CONFIGURATION))
        if nic in devices and nic not in active:
            found.append(Finding(f"{gpu}: rail {nic} has no ACTIVE port (rdma_rails)",
                                 HARDWARE))
    return found
