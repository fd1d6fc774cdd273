"""A short per-host summary of facts, for tables and the facts JSON."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpufleet.facts.gather import Facts
from gpufleet.facts.watch import reading

SYSTEM_NCCL = "libnccl2"


def _gpus(facts: Facts) -> str:
    gpus = facts.get("gpus")
    if gpus is None:
        return "none"
    names = Counter(str(g.get("name")) for g in gpus)
    return ", ".join(f"{n}x {name}" for name, n in names.items()) or "0"


def _torch(facts: Facts) -> str | None:
    for name, value in facts.values.items():
        if name.startswith("torch:") and isinstance(value, dict):
            extras = ", ".join(f"{k.upper() if k == 'cuda' else k} {value[k]}"
                               for k in ("cuda", "nccl") if value.get(k))
            return f"{value.get('torch')}" + (f" ({extras})" if extras else "")
    return None


def _driver(facts: Facts) -> str | None:
    module = facts.get("nvidia_module")
    if module:
        return str(module)
    gpus = facts.get("gpus") or []
    return str(gpus[0].get("driver_version")) if gpus else None


def _versions(values: list[Any]) -> str:
    """One version, or the distinct ones (``a/b``) where devices differ."""
    return "/".join(sorted({str(v) for v in values}))


def _firmware(facts: Facts) -> str | None:
    """``HCA 28.39.1002, VBIOS 96.00.A5.00.1A, GSP 580.159.04, BIOS 2.1.V1 (board X)``: the
    kinds the host has; None where it has none."""
    hca = facts.get("hca_firmware") or {}
    gpus = facts.get("gpus") or []
    gsp = facts.get("gsp_firmware") or {}
    bios = facts.get("bios")
    parts = [f"HCA {_versions([d['fw_ver'] for d in hca.values()])}" if hca else "",
             f"VBIOS {_versions([g.get('vbios_version') for g in gpus])}"
             if any(g.get("vbios_version") for g in gpus) else "",
             f"GSP {_versions(list(gsp.values()))}" if gsp else ""]
    if bios:
        board = " ".join(x for x in (bios.get("board_vendor"), bios.get("board_name")
                                     or bios.get("product_name")) if x)
        parts.append(f"BIOS {bios['bios_version']}" + (f" ({board})" if board else ""))
    return ", ".join(p for p in parts if p) or None


def _firewall(facts: Facts) -> str | None:
    fw = facts.get("firewall")
    if fw is None:
        return None
    if fw.get("nft_gpufleet_digest") or fw.get("iptables_gpufleet_digest"):
        return "gpufleet rules loaded"
    tables = fw.get("nft_tables") or []
    return f"nft tables: {', '.join(tables)}" if tables else "no rules"


def _watch(facts: Facts) -> str | None:
    """``1 open, 1 pending, 1 silenced``, ``clean``, ``unknown``, with ``, 3 rising`` when
    counters rose within their window; None without the watch."""
    found = reading(facts)
    if found is None:
        return None
    if found.report is None:
        return "unknown"
    counts = [f"{len(found.report.having(s))} {s}" for s in ("open", "pending", "silenced")
              if found.report.having(s)]
    rising = [f"{len(found.report.rising)} rising"] if found.report.rising else []
    return ", ".join([", ".join(counts) or "clean", *rising])


def summarize_facts(facts: Facts) -> dict[str, Any]:
    """The key facts of a host as short strings and numbers."""
    os_release = facts.get("os_release") or {}
    mem = (facts.get("meminfo") or {}).get("MemTotal")
    packages = facts.get("packages") or {}
    nccl = packages.get(SYSTEM_NCCL, {})
    return {
        "os": os_release.get("PRETTY_NAME"),
        "kernel": facts.get("kernel"),
        "cpus": facts.get("cpus"),
        "mem_gib": round(mem / 2**30, 1) if mem else None,
        "gpus": _gpus(facts),
        "driver": _driver(facts),
        "firmware": _firmware(facts),
        "cuda": facts.cuda_version,
        "nccl": nccl.get("version") if nccl.get("installed") else None,
        "torch": _torch(facts),
        "firewall": _firewall(facts),
        "port_range": "-".join(str(p) for p in facts.get("port_range") or ()) or None,
        "watch": _watch(facts),
    }
