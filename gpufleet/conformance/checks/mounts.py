"""Shared filesystems: the mounts every node must see (``shared_mounts``), read from
``/proc/self/mountinfo`` in the facts round trip, and the verdicts on them.

A mount's source is written as findmnt writes it: the mount source, and the directory of
that filesystem it shows when it is not the filesystem's root (``/dev/sdb1[/exports/a]``,
a bind mount of a directory), so two nodes mounting different directories of one device
differ, and an NFS export reads ``server:/export``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.facts.catalog import Fact

NETWORK_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "ceph", "fuse.ceph",
                        "beegfs", "glusterfs", "fuse.glusterfs", "wekafs", "9p",
                        "fuse.juicefs", "fuse.s3fs", "virtiofs"})
NFS = frozenset({"nfs", "nfs4"})
NFS_CLIENTS_NOTE = 4
KEYS = frozenset({"path", "fstype", "source", "options", "writable"})


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo."""

    target: str
    source: str
    fstype: str
    options: frozenset[str]


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space)."""
    if "\\" not in text:
        return text
    return text.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")


def parse_mountinfo(text: str) -> list[Mount]:
    """``/proc/self/mountinfo`` -> its mounts, in order (a later mount on the same target
    hides an earlier one)."""
    mounts = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, sep, right = line.partition(" - ")
        head, tail = left.split(), right.split()
        if not sep or len(head) < 6 or len(tail) < 2:
            raise ParseError(f"unreadable mountinfo line {line[:120]!r}")
        root, target = _unescape(head[3]), _unescape(head[4])
        fstype, source = tail[0], _unescape(tail[1])
        options = set(head[5].split(","))  # the mount's own: rw or ro is decided here
        if len(tail) > 2:
            options |= set(tail[2].split(",")) - {"rw", "ro"}
        shown = source if root == "/" else f"{source}[{root}]"
        mounts.append(Mount(target, shown, fstype, frozenset(options)))
    return mounts


MOUNTINFO = Fact("mountinfo", "cat /proc/self/mountinfo", parse_mountinfo)


@dataclass(frozen=True)
class SharedMount:
    """One entry of ``shared_mounts``."""

    path: str
    fstype: str | None = None
    source: str | None = None
    options: tuple[str, ...] = ()
    writable: bool = False


def declared(value: Any, where: str) -> list[SharedMount]:
    """``shared_mounts`` as entries; ValueError naming the entry and key otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where}: a list of mappings, got {type(value).__name__}")
    entries = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise ValueError(f"{at}: a mapping with path (and fstype, source, options, "
                             f"writable), got {item!r}")
        unknown = sorted(set(map(str, item)) - KEYS)
        if unknown:
            raise ValueError(f"{at}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(KEYS))})")
        path = item.get("path")
        if not isinstance(path, str) or not path.startswith("/") or "\n" in path:
            raise ValueError(f"{at}.path: an absolute path, got {path!r}")
        for key in ("fstype", "source"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise ValueError(f"{at}.{key}: a string, got {item[key]!r}")
        options = item.get("options") or []
        if isinstance(options, str):
            options = [o for o in options.split(",") if o]
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise ValueError(f"{at}.options: a list of mount options, got {options!r}")
        writable = item.get("writable", False)
        if not isinstance(writable, bool):
            raise ValueError(f"{at}.writable: true or false, got {writable!r}")
        entries.append(SharedMount(path.rstrip("/") or "/", item.get("fstype"),
                                   item.get("source"), tuple(options), writable))
    return entries


def mounted_at(mounts: Sequence[Mount], path: str) -> Mount | None:
    """The mount whose target is exactly ``path`` (the last one: it hides the others)."""
    found = [m for m in mounts if m.target == path]
    return found[-1] if found else None


def mount_problems(entry: SharedMount, mount: Mount | None, majority_source: str | None
                   ) -> list[str]:
    """What is wrong with one declared mount on one node (its access is judged apart)."""
    if mount is None:
        return [f"{entry.path} is not mounted"]
    problems = []
    if entry.fstype and mount.fstype != entry.fstype:
        problems.append(f"{entry.path} is {mount.fstype}, expected {entry.fstype}")
    wanted = entry.source or majority_source
    if wanted and mount.source != wanted:
        origin = "expected" if entry.source else "the other nodes mount"
        problems.append(f"{entry.path} is mounted from {mount.source}, {origin} {wanted}")
    missing = [o for o in entry.options if o not in mount.options]
    if missing:
        problems.append(f"{entry.path} lacks option(s) {', '.join(missing)} "
                        f"(has {','.join(sorted(mount.options))})")
    if entry.writable and "ro" in mount.options:
        problems.append(f"{entry.path} is mounted read-only, declared writable")
    return problems


def majority(values: Sequence[str]) -> str | None:
    """The value most nodes have, when more than half have it."""
    if not values:
        return None
    value, count = Counter(values).most_common(1)[0]
    return value if count * 2 > len(values) else None


def network_mounts(mounts: Sequence[Mount]) -> set[tuple[str, str, str]]:
    """(target, fstype, source) of every network filesystem mounted (hidden ones left
    out)."""
    last = {m.target: m for m in mounts}
    return {(m.target, m.fstype, m.source) for m in last.values() if m.fstype in NETWORK_FS}


def group_differences(mine: set[tuple[str, str, str]],
                      others: Sequence[set[tuple[str, str, str]]]) -> list[str]:
    """How a node's network mounts differ from what most of its group's nodes mount."""
    counts = Counter(m for s in others for m in s)
    usual = {m for m, c in counts.items() if c * 2 > len(others)}
    missing = sorted(usual - mine)
    extra = sorted(mine - usual)
    return ([f"missing {t} ({f} from {s})" for t, f, s in missing]
            + [f"extra {t} ({f} from {s})" for t, f, s in extra])
