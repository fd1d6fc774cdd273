"""Parsers for the small formats that gpufleet's own fact snippets print."""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.facts.parsers import timesync
from gpufleet.facts.parsers.cuda import torch_info
from gpufleet.facts.parsers.kernel import dkms_status, modinfo


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


MAX_RDMA_PORTS = 1024
_RDMA_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec \((\d+X)(?: ?([A-Z0-9]+))?\)$")
_PKEY = re.compile(r"^0x[0-9a-f]{1,4}$")
_SYSFS_ENUM = re.compile(r"^\d+: ?(\S.*)$")


def rdma_rate(text: str) -> tuple[float, str, str | None]:
    """A port's sysfs ``rate`` (``400 Gb/sec (4X NDR)``) as (Gb/s, width, speed): the
    kernel prints the width and the lane speed's name, none for SDR (``10 Gb/sec (4X)``)."""
    match = _RDMA_RATE.match(text.strip())
    if match is None:
        raise ParseError(f"RDMA port rate: expected 'N Gb/sec (WIDTH SPEED)', got {text!r}")
    return float(match.group(1)), match.group(2), match.group(3)


def _enum(text: str) -> str:
    """``4: ACTIVE`` -> ``ACTIVE`` (sysfs's ``state`` and ``phys_state``)."""
    match = _SYSFS_ENUM.match(text.strip())
    return match.group(1).strip() if match else text.strip()


def _pkeys(text: str) -> list[str]:
    keys = []
    for key in text.lower().split(","):
        if not _PKEY.match(key):
            raise ParseError(f"RDMA partition key: expected 0x and 1 to 4 hex digits, got {key!r}")
        if int(key, 16):
            keys.append(key)
    return keys


def rdma_devices(text: str) -> list[dict[str, Any]]:
    """Tab-separated lines ``DEVICE PORT LINK_LAYER STATE PHYS_STATE RATE PKEYS NETDEVS``,
    each value as its sysfs file holds it (``-`` for a file that could not be read): the
    port's ``state`` and ``phys_state`` names, its rate read into ``rate_gbps``, ``width``
    and ``speed`` (None where unreadable), the partition keys (indexes 0 and 1, comma
    separated; an empty entry, ``0x0000``, left out) and the device's netdevs. At most
    MAX_RDMA_PORTS ports."""
    devices: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 8 or not fields[1].isdigit():
            raise ParseError(f"expected 8 tab-separated fields per RDMA port, the port a "
                             f"number, got {line[:120]!r}")
        if len(devices) == MAX_RDMA_PORTS:
            raise ParseError(f"more than {MAX_RDMA_PORTS} RDMA ports")
        dev, port, layer, state, phys, rate, pkeys, netdevs = (f.strip() for f in fields)
        gbps, width, speed = rdma_rate(rate) if rate != "-" else (None, None, None)
        devices.append({
            "device": dev,
            "port": int(port),
            "link_layer": None if layer == "-" else layer,
            "state": None if state == "-" else _enum(state),
            "phys_state": None if phys == "-" else _enum(phys),
            "rate_gbps": gbps,
            "width": width,
            "speed": speed,
            "pkeys": [] if pkeys == "-" else _pkeys(pkeys),
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


def _sections(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """A snippet's output split at its ``@NAME`` lines (each of ``names`` at most once)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@"):
            name = line[1:].strip()
            if name not in names or name in sections:
                raise ParseError(f"unexpected section {line.strip()!r} (expected "
                                 f"{', '.join('@' + n for n in names)}, each once)")
            current = sections[name] = []
        elif current is None:
            if line.strip():
                raise ParseError(f"output before the first section: {line.strip()[:80]!r}")
        else:
            current.append(line)
    return {name: "\n".join(lines) + "\n" for name, lines in sections.items()}


def time_sync(text: str) -> dict[str, Any]:
    """The ``time_sync`` snippet's output: ``@chronyc`` and ``chronyc -n tracking``, or
    ``@timedatectl`` and ``timedatectl show -p NTPSynchronized -p NTP``.

    Returns ``source`` (``chrony``, or ``systemd``: the kernel's synchronised flag, which
    systemd-timesyncd or another daemon sets), ``synchronised``, ``offset_s`` (how far the
    clock is ahead of chrony's time, negative when behind; None from systemd's flag) and
    ``server`` (chrony's reference)."""
    sections = _sections(text, ("chronyc", "timedatectl"))
    if len(sections) != 1:
        raise ParseError("expected one of @chronyc and @timedatectl")
    if "chronyc" in sections:
        tracking = timesync.chronyc_tracking(sections["chronyc"])
        return {"source": "chrony", "synchronised": tracking["synchronised"],
                "offset_s": tracking["offset_s"], "server": tracking["reference"]}
    flag = timesync.timedatectl_show(sections["timedatectl"]).get("NTPSynchronized")
    if flag not in ("yes", "no"):
        raise ParseError(f"timedatectl show: NTPSynchronized must be yes or no, got {flag!r}")
    return {"source": "systemd", "synchronised": flag == "yes", "offset_s": None,
            "server": None}


_KERNEL_MARKS = {"@running": 1, "@boot": 1, "@headers": 1, "@module": 2, "@dkms": 0}


def _marked(text: str) -> list[tuple[str, list[str], list[str]]]:
    """A snippet's output as (mark, its arguments, the lines under it), in order."""
    found: list[tuple[str, list[str], list[str]]] = []
    for line in text.splitlines():
        if line.startswith("@"):
            mark, *args = line.split()
            if _KERNEL_MARKS.get(mark) != len(args):
                raise ParseError(f"unexpected line {line[:80]!r}")
            found.append((mark, args, []))
        elif found:
            found[-1][2].append(line)
        elif line.strip():
            raise ParseError(f"output outside a section: {line[:80]!r}")
    return found


def kernel_state(text: str) -> dict[str, Any]:
    """The ``kernel_state`` snippet's output: ``@running K``, one ``@boot K`` per
    /boot/vmlinuz-K, one ``@headers K`` per /lib/modules/K with a ``build`` link, then per
    kernel and module ``@module K M`` and modinfo's filename, version, vermagic and name
    lines (or its error), and, where dkms is installed, ``@dkms`` and, when a module was
    missing, ``dkms status``.

    Returns ``running``, ``boot`` and ``headers`` (releases), ``modules`` (release ->
    module -> modinfo's fields, or ``{"error": ...}``) and ``dkms`` (``dkms status`` read,
    empty where it was not asked; None without dkms)."""
    state: dict[str, Any] = {"running": None, "boot": [], "headers": [], "modules": {},
                             "dkms": None}
    for mark, args, lines in _marked(text):
        if mark in ("@boot", "@headers"):
            state[mark[1:]].append(args[0])
        elif mark == "@running":
            if state["running"] is not None:
                raise ParseError("two @running lines")
            state["running"] = args[0]
        elif mark == "@dkms":
            if state["dkms"] is not None:
                raise ParseError("two @dkms sections")
            state["dkms"] = dkms_status("\n".join(lines))
        else:
            errors = [line.strip() for line in lines if line.startswith("modinfo:")]
            fields = {"error": errors[0]} if errors else modinfo("\n".join(lines))
            state["modules"].setdefault(args[0], {})[args[1]] = fields
        if mark not in {"@module", "@dkms"} and any(line.strip() for line in lines):
            raise ParseError(f"output under {mark}: {lines[0][:80]!r}")
    if state["running"] is None:
        raise ParseError("no @running line")
    return state
