"""What the controller's /proc, /sys and /run/netns say about a lab's namespaces: mounts,
live processes and the namespaces they are in, network namespaces and links; and ending
every process of a namespace (a reused PID is never hit)."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def mounted(path: Path) -> bool:
    """Whether something is mounted at ``path``."""
    target = str(path)
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == target for line in fh)


def pid_alive(pidfile: Path) -> int | None:
    """The pid in ``pidfile`` if that process runs (a zombie, dead but not reaped, does not)."""
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return None if zombie(pid) else pid


def cmdline(pid: int) -> list[str]:
    """The process's command line; empty when it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")
    except OSError:
        return []


def ns_inode(path: Path) -> int | None:
    """The inode of a namespace file (its identity); None when it is gone."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def inside(pid: int, inodes: set[int]) -> bool:
    """Whether the process's net or mount namespace is one of ``inodes``."""
    for kind in ("net", "mnt"):
        try:
            link = os.readlink(f"/proc/{pid}/ns/{kind}")
        except OSError:
            continue
        match = re.search(r"\[(\d+)\]", link)
        if match and int(match.group(1)) in inodes:
            return True
    return False


def pids_in_namespaces(inodes: set[int]) -> list[int]:
    """Every process whose net or mount namespace is one of ``inodes``."""
    return [int(e) for e in os.listdir("/proc") if e.isdigit() and inside(int(e), inodes)]


def kill_all(pids: Iterable[int], inodes: set[int] | None = None) -> None:
    """SIGTERM, then SIGKILL after 3 s; with ``inodes``, each process is checked to still be
    in those namespaces right before it is signalled (a reused PID is never hit)."""
    pids = [p for p in pids if p != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if inodes is not None and not inside(pid, inodes):
                continue
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not zombie(p)]
            if not pids:
                return
            time.sleep(0.05)


def zombie(pid: int) -> bool:
    """Whether the process is dead but not reaped (or gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def netns_exists(name: str) -> bool:
    """Whether the named network namespace exists."""
    return Path("/run/netns", name).exists()


def link_exists(name: str) -> bool:
    """Whether the network link exists."""
    return Path("/sys/class/net", name).exists()
