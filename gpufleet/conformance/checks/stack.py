"""NCCL's environment, linted against the node it runs on: every interface, HCA and GID
that nccl.conf or the environment file names must exist (and be up) there. Pure functions
over file contents and facts."""

from __future__ import annotations

import re
import shlex
from typing import Any

INTERFACE_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
_LINE = re.compile(r"^\s*(?:export\s+)?([A-Z][A-Z0-9_]*)=(.*?)\s*$")


def settings(*texts: str) -> dict[str, str]:
    """KEY=VALUE settings of nccl.conf and an environment file (quoted as a shell reads
    them; comments and other lines ignored); later texts win."""
    found: dict[str, str] = {}
    for text in texts:
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            if match := _LINE.match(line):
                try:
                    words = shlex.split(match.group(2))
                except ValueError:
                    words = [match.group(2)]
                found[match.group(1)] = words[0] if words else ""
    return found


def _entries(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL's interface/HCA list syntax: (excluding, exact, names) for ``^a,b`` / ``=a``."""
    excluding = value.startswith("^")
    value = value.lstrip("^")
    exact = value.startswith("=")
    value = value.lstrip("=")
    return excluding, exact, [v.strip() for v in value.split(",") if v.strip()]


def interface_problems(key: str, value: str, interfaces: list[dict[str, Any]]) -> list[str]:
    """The interfaces ``value`` selects must exist and be up (NCCL takes names as prefixes,
    ``=name`` exactly; ``^`` excludes, so it selects whatever is left)."""
    excluding, exact, names = _entries(value)
    if excluding or not names:
        return []
    problems = []
    for name in names:
        matched = [i for i in interfaces
                   if (i["name"] == name if exact else i["name"].startswith(name))]
        if not matched:
            problems.append(f"{key}={value}: no interface {name!r} on this node (it has "
                            f"{', '.join(sorted(i['name'] for i in interfaces))})")
        elif not any(str(i.get("state")).upper() in ("UP", "UNKNOWN") for i in matched):
            problems.append(f"{key}={value}: interface {matched[0]['name']} is "
                            f"{matched[0].get('state')}")
    return problems


def hca_problems(value: str, rdma: list[dict[str, Any]]) -> list[str]:
    """NCCL_IB_HCA's devices (``mlx5_0`` or ``mlx5_0:1`` with a port) must exist and be
    ACTIVE on this node."""
    excluding, exact, names = _entries(value)
    if excluding or not names:
        return []
    problems = []
    for entry in names:
        device, _, port = entry.partition(":")
        ports = [p for p in rdma if (p["device"] == device if exact
                                     else p["device"].startswith(device))
                 and (not port or str(p["port"]) == port)]
        if not ports:
            problems.append(f"NCCL_IB_HCA={value}: no RDMA device {entry!r} on this node (it "
                            f"has {', '.join(sorted({p['device'] for p in rdma})) or 'none'})")
        elif not any(p["state"] == "ACTIVE" for p in ports):
            problems.append(f"NCCL_IB_HCA={value}: {entry} is {ports[0]['state']}")
    return problems


def lint(found: dict[str, str], interfaces: list[dict[str, Any]],
         rdma: list[dict[str, Any]] | None) -> list[str]:
    """Everything the settings name that this node does not have."""
    problems = []
    for key in INTERFACE_VARS:
        if key in found:
            problems += interface_problems(key, found[key], interfaces)
    if "NCCL_IB_HCA" in found and rdma is not None:
        problems += hca_problems(found["NCCL_IB_HCA"], rdma)
    return problems


def gid_paths(found: dict[str, str], rdma: list[dict[str, Any]]) -> list[str]:
    """The sysfs GID entries NCCL_IB_GID_INDEX selects on the HCAs NCCL will use."""
    index = found.get("NCCL_IB_GID_INDEX")
    if index is None or not index.isdigit():
        return []
    _, exact, names = _entries(found.get("NCCL_IB_HCA", ""))
    ports = [p for p in rdma if not names or any(
        p["device"] == n.partition(":")[0] if exact else p["device"].startswith(
            n.partition(":")[0]) for n in names)]
    return [f"/sys/class/infiniband/{p['device']}/ports/{p['port']}/gids/{index}"
            for p in ports]
