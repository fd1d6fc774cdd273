"""The PCIe fact: each NVIDIA GPU's and each RDMA NIC's PCI path, link width and speed and
IOMMU group type; the kernel command line and the IOMMUs; on a node with both GPUs and NICs,
the ACS control register of every bridge above them; where asked, the NICs' Device Control
register (relaxed ordering, the maximum read request).

Gathered only where the pcie suite or the pcie role runs, in the one facts round trip. The
walk over ``/sys/bus/pci/devices`` reads with the shell's own ``read`` (no process per
device); the devices kept (a few dozen on an HGX node) cost a ``readlink`` each. ACS is read
with ``setpci`` once per bridge above a GPU or a NIC, and only on nodes with both: on an
HGX H100/H200 board that is the PCIe switches' ports and the root ports above them (about
thirty bridges, each a ``setpci`` run of a few milliseconds), which a shell cannot read
otherwise (``ECAP_ACS`` sits in extended configuration space, at an offset each device
places). The checks and the role keep the bridges that lie between each GPU and its nearest
NICs (:func:`gpu_nic_paths`).

The ACS Control and Device Control words are decoded with the bit names ``lspci -vvv``
prints (``ACSCtl: SrcValid+ TransBlk- ReqRedir+ ...``, ``DevCtl: ... RlxdOrd+ ...
MaxReadReq 4096 bytes``), PCI Express Base Specification 7.7.8 and 7.5.3.4.

``root`` prefixes the sysfs and procfs paths: ``""`` on a node; the lab's stand-in tree on
lab nodes, whose kernel is the controller's.
"""

from __future__ import annotations

import functools
import shlex
from typing import Any

from gpufleet.facts.catalog import Fact
from gpufleet.facts.parsers import pcie

NAME = "pcie"
ACS_REGISTER = "ECAP_ACS+6.w"
"""The ACS Control register: the ACS extended capability's offset 6, a 16-bit word."""
DEVCTL_REGISTER = "CAP_EXP+8.w"
"""The Device Control register: the PCI Express capability's offset 8, a 16-bit word."""
ACS_BITS = ("SrcValid", "TransBlk", "ReqRedir", "CmpltRedir", "UpstreamFwd", "EgressCtrl",
            "DirectTrans")
"""ACS Control bits 0-6, as lspci names them."""
ACS_REDIRECTS = ("ReqRedir", "CmpltRedir", "EgressCtrl")
"""The ACS controls that send peer-to-peer traffic up to the root complex (P2P Request
Redirect, P2P Completion Redirect, P2P Egress Control): what breaks GPUDirect through a
PCIe switch."""
ACS_REDIRECT_MASK = 0x0004 | 0x0008 | 0x0020
_BDF = "[0-9a-f][0-9a-f][0-9a-f][0-9a-f]*:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f].[0-7]"
"""A PCI address as a shell pattern (the resolved path's ``pciDDDD:BB`` ends the walk)."""


@functools.cache
def pcie_fact(root: str = "", devctl: bool = False) -> Fact:
    """The PCIe fact, read under ``root``; with ``devctl``, the NICs' Device Control
    register too. One Fact per pair (requests that name it twice gather it once)."""
    r = shlex.quote(root)
    devctl_line = (f'[ "$k" = nic ] && echo "@devctl $b $(setpci -s "$b" {DEVCTL_REGISTER} '
                   '2>&1 | head -n 1)"' if devctl else ":")
    return Fact(NAME, "\n".join([
        f"r={r}; s=\"$r/sys/bus/pci/devices\"",
        '[ -d "$s" ] || { echo "no $s on this host"; exit 127; }',
        'c=; { read -r c <"$r/proc/cmdline"; } 2>/dev/null; echo "@cmdline $c"',
        'for i in "$r"/sys/class/iommu/*; do [ -e "$i" ] && echo "@iommu ${i##*/}"; done',
        "seen=; gpus=0; nics=0",
        'for d in "$s"/*; do',
        '  [ -e "$d/physfn" ] && continue',
        '  v=; c=; { read -r v <"$d/vendor"; read -r c <"$d/class"; } 2>/dev/null',
        "  case \"$v:$c\" in",
        "    0x10de:0x0302*|0x10de:0x0300*) k=gpu; gpus=$((gpus + 1));;",
        "    *:0x0207*|0x15b3:0x0200*) k=nic; nics=$((nics + 1));;",
        '    *:0x0200*) [ -d "$d/infiniband" ] || continue; k=nic; nics=$((nics + 1));;',
        "    *) continue;;",
        "  esac",
        "  cw=; mw=; cs=; ms=; t=",
        '  { read -r cw <"$d/current_link_width"; read -r mw <"$d/max_link_width"; } '
        "2>/dev/null",
        '  { read -r cs <"$d/current_link_speed"; read -r ms <"$d/max_link_speed"; } '
        "2>/dev/null",
        '  { read -r t <"$d/iommu_group/type"; } 2>/dev/null',
        '  p=$(readlink -f "$d"); b=${d##*/}',
        '  echo "@dev|$k|$b|$v|$c|$cw|$mw|$cs|$ms|$t|$p"',
        f"  {devctl_line}",
        '  q=${p%/*}',
        '  while :; do',
        '    case ${q##*/} in',
        f'      {_BDF}) case " $seen " in *" ${{q##*/}} "*) ;; *) seen="$seen ${{q##*/}}";; '
        "esac;;",
        "      *) break;;",
        "    esac",
        "    q=${q%/*}",
        "  done",
        "done",
        '[ "$gpus" -gt 0 ] && [ "$nics" -gt 0 ] || exit 0',
        'if ! command -v setpci >/dev/null 2>&1; then echo "@acs-unknown setpci not found '
        '(pciutils)"',
        'elif [ "$(id -u)" != 0 ]; then echo "@acs-unknown not read as root: the ACS register '
        'is in extended configuration space, which only root reads"',
        f'else for b in $seen; do echo "@acs $b $(setpci -s "$b" {ACS_REGISTER} 2>&1 | '
        'head -n 1)"; done; fi',
    ]), pcie.pcie_state)


def acs_flags(word: int) -> dict[str, bool]:
    """An ACS Control word as lspci's ``ACSCtl:`` flags."""
    return {name: bool(word >> bit & 1) for bit, name in enumerate(ACS_BITS)}


def acs_redirects(word: int) -> list[str]:
    """The redirecting controls an ACS Control word enables (lspci's names)."""
    return [name for name, on in acs_flags(word).items() if on and name in ACS_REDIRECTS]


def device_control(word: int) -> dict[str, Any]:
    """A Device Control word: ``relaxed_ordering`` (bit 4, lspci's ``RlxdOrd``) and
    ``max_read_request`` in bytes (bits 14:12, lspci's ``MaxReadReq``: 128 << n)."""
    return {"relaxed_ordering": bool(word >> 4 & 1), "max_read_request": 128 << (word >> 12 & 7)}


def gpu_nic_paths(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each GPU's path to its nearest NICs: the NICs that share the deepest bridge with it
    (a GPU that shares none with any NIC, whose traffic crosses the root complex anyway, has
    no path). Each path: ``gpu``, ``nic``, ``shared`` (the deepest bridge both are below:
    the PCIe switch's port) and ``bridges`` (from ``shared`` down to the GPU and to the NIC:
    every port a GPUDirect transfer between them passes)."""
    gpus = [d for d in devices if d["kind"] == "gpu"]
    nics = [d for d in devices if d["kind"] == "nic"]
    paths = []
    for gpu in gpus:
        depths = {nic["address"]: _common(gpu["path"], nic["path"]) for nic in nics}
        best = max(depths.values(), default=0)
        if best == 0:
            continue
        for nic in nics:
            if depths[nic["address"]] != best:
                continue
            below = [*gpu["path"][best - 1:], *nic["path"][best:]]
            paths.append({"gpu": gpu["address"], "nic": nic["address"],
                          "shared": gpu["path"][best - 1], "bridges": below})
    return paths


def _common(one: list[str], other: list[str]) -> int:
    count = 0
    for a, b in zip(one, other, strict=False):
        if a != b:
            break
        count += 1
    return count


def path_bridges(state: dict[str, Any]) -> list[str]:
    """The bridges on the GPU-NIC paths of a PCIe fact, each once, in order."""
    found: list[str] = []
    for path in gpu_nic_paths(state["devices"]):
        found += [b for b in path["bridges"] if b not in found]
    return found


TRANSLATING = ("DMA", "DMA-FQ")
"""IOMMU group types whose DMA the IOMMU translates (``identity`` is passthrough)."""
PASSTHROUGH = ("iommu=pt", "iommu.passthrough=1", "iommu=off", "intel_iommu=off",
               "amd_iommu=off")
"""Kernel command-line words that leave DMA untranslated."""


def translating(state: dict[str, Any]) -> list[str]:
    """``KIND BDF (TYPE)`` of each GPU and NIC whose IOMMU group translates its DMA."""
    return [f"{d['kind'].upper()} {d['address']} ({d['iommu_group_type']})"
            for d in state["devices"] if d["iommu_group_type"] in TRANSLATING]


def cmdline_passthrough(cmdline: str) -> list[str]:
    """The words of a kernel command line that leave DMA untranslated."""
    return [word for word in cmdline.split() if word in PASSTHROUGH]
