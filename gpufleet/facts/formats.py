"""Parsers for the small formats that gpufleet's own fact snippets print."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.facts.parsers.cuda import torch_info


@dataclass(frozen=True)
class FileState:
    """A file on a host: whether it exists, its bytes, mode and owner."""

    path: str
    exists: bool
    content: bytes = b""
    mode: str | None = None
    owner: str | None = None

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def file_state(path: str, text: str) -> FileState:
    """``missing`` or ``present MODE OWNER`` then the base64 of the content."""
    head, _, body = text.partition("\n")
    fields = head.split()
    if fields == ["missing"]:
        return FileState(path, False)
    if len(fields) != 3 or fields[0] != "present":
        raise ParseError(f"expected 'present MODE OWNER' or 'missing' for {path}, got {head!r}")
    try:
        content = base64.b64decode("".join(body.split()), validate=True)
    except ValueError as exc:  # binascii.Error, or characters outside ASCII
        raise ParseError(f"bad base64 content for {path}: {exc}") from exc
    return FileState(path, True, content, fields[1], fields[2])


@dataclass(frozen=True)
class FileDigest:
    """A file on a host known by its digest only (its bytes are not transferred)."""

    path: str
    exists: bool
    sha256: str = ""
    size: int = 0
    mode: str | None = None
    owner: str | None = None


def file_digest(path: str, text: str) -> FileDigest:
    """``missing`` or ``present MODE OWNER SIZE SHA256``."""
    fields = text.split()
    if fields == ["missing"]:
        return FileDigest(path, False)
    if len(fields) != 5 or fields[0] != "present" or not fields[3].isdigit() \
            or not re.fullmatch(r"[0-9a-f]{64}", fields[4]):
        raise ParseError(f"expected 'present MODE OWNER SIZE SHA256' or 'missing' for {path}, "
                         f"got {text.strip()[:80]!r}")
    return FileDigest(path, True, fields[4], int(fields[3]), fields[1], fields[2])


_TORCH_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)
_TORCH_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(?:None|['"]([^'"]*)['"])""", re.MULTILINE)
_NCCL_WHEEL = re.compile(r"-(\d[^-/]*)\.dist-info$")


def torch_files(text: str) -> dict[str, Any]:
    """torch's version, CUDA and bundled NCCL from the files of a virtual environment
    (``@venv``/``@nccl`` lines, then torch/version.py), or the probe's JSON otherwise."""
    if not text.startswith("@venv"):
        return torch_info(text)
    head, nccl_line, body = [*text.split("\n", 2), "", ""][:3]
    version = _TORCH_VERSION.search(body)
    cuda = _TORCH_CUDA.search(body)
    if version is None or cuda is None:
        raise ParseError(f"torch/version.py without __version__ or cuda: {body[:80]!r}")
    wheel = _NCCL_WHEEL.search(nccl_line.strip())
    return {"python": head.removeprefix("@venv").strip() or None, "torch": version.group(1),
            "cuda": cuda.group(1), "nccl": wheel.group(1) if wheel else None}


def link_target(text: str) -> str | None:
    """``missing`` or ``-> TARGET`` (the literal link target)."""
    line = text.strip()
    if line == "missing":
        return None
    if line.startswith("-> "):
        return line[3:]
    if line.startswith("notlink"):
        return ""
    raise ParseError(f"expected '-> TARGET', 'notlink' or 'missing', got {line[:80]!r}")


def firewall(text: str) -> dict[str, Any]:
    """``key value`` lines: nft, nft_gpufleet, iptables, iptables_gpufleet, ufw, firewalld."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            values[key] = value.strip()
    if "nft" not in values or "iptables" not in values:
        raise ParseError(f"expected nft and iptables lines, got {text[:80]!r}")

    def digest(key: str) -> str | None:
        value = values.get(key, "absent")
        return None if value in ("absent", "") else value

    nft_tables = values["nft"].split(",") if values["nft"] not in ("absent", "none", "") else []
    return {
        "nft_available": values["nft"] != "absent",
        "nft_tables": [t for t in nft_tables if t],
        "nft_gpufleet_digest": digest("nft_gpufleet"),
        "iptables_available": values["iptables"] != "absent",
        "iptables_gpufleet_digest": digest("iptables_gpufleet"),
        "ufw": values.get("ufw", "absent"),
        "firewalld": values.get("firewalld", "absent"),
    }


def rdma_devices(text: str) -> list[dict[str, Any]]:
    """Lines ``DEVICE PORT LINK_LAYER STATE NETDEV[,NETDEV]`` (``-`` for none)."""
    devices = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5 or not fields[1].isdigit():
            raise ParseError(f"expected 5 fields per RDMA port, the port a number, got {line!r}")
        dev, port, layer, state, netdevs = fields
        devices.append({
            "device": dev,
            "port": int(port),
            "link_layer": layer,
            "state": state,
            "netdevs": [] if netdevs == "-" else netdevs.split(","),
        })
    return devices


def disk_free(text: str) -> dict[str, int]:
    """``df -Pk`` output -> mount point -> free bytes. df's own complaints (``df: /opt: No
    such file or directory``) and ``-`` where a filesystem gives no figure are not rows; any
    other row that does not read is an error, never left out."""
    free: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        if not line.strip() or line.startswith("df: "):
            continue
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[3] == "-":
            continue
        if len(fields) < 6 or not fields[3].isdigit():
            raise ParseError(f"df row without a free-space figure: {line[:120]!r}")
        free[fields[5]] = int(fields[3]) * 1024
    if not free:
        raise ParseError(f"no filesystems in df output: {text[:80]!r}")
    return free


def time_sync(text: str) -> bool | None:
    """True/False from timedatectl or chronyc output; None when neither could tell."""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("NTPSynchronized="):
            return line.split("=", 1)[1] == "yes"
        if line.startswith("Leap status"):
            return line.split(":", 1)[1].strip() == "Normal"
    return None
