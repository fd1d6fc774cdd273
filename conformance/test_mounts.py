"""mounts: every node sees the shared filesystems the inventory declares (shared_mounts)
mounted where declared, of the declared type, from the same source as the others (or the
declared one), with the required options, readable (and writable where declared); a
marker file one node writes is seen with the same content by every other node (the same
filesystem, not just the same path); and each node mounts the same network filesystems as
the other nodes of its groups.

Variables: shared_mounts ([{path, fstype, source, options, writable}]; default none: the
per-mount checks skip, the group comparison still runs).
"""

from __future__ import annotations

import contextlib
import secrets
import shlex
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpufleet.conformance.checks.mounts import (
    NFS,
    NFS_CLIENTS_NOTE,
    Mount,
    SharedMount,
    declared,
    group_differences,
    majority,
    mount_problems,
    mounted_at,
    network_mounts,
)
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.mounts import MountsSettings
from gpufleet.connect.connection import node_local
from gpufleet.errors import GpufleetError

ACCESS_TIMEOUT_S = 30


def _entries(node: Node) -> list[SharedMount]:
    return declared(node.typed(MountsSettings).shared_mounts,
                    f"host {node.name}: shared_mounts")


def _mounts(node: Node) -> list[Mount]:
    found = node.facts.get("mountinfo") if node.facts else None
    if found is None:
        reason = node.facts.why_absent("mountinfo") if node.facts else "no facts"
        pytest.fail(f"unknown: /proc/self/mountinfo: {reason}")
    return list(found)


def _sources(conformance: ConformanceSession, path: str) -> list[str]:
    sources = []
    for other in conformance.ready():
        mount = mounted_at(other.known.get("mountinfo") or [], path)
        if mount is not None:
            sources.append(mount.source)
    return sources


def _access(node: Node, entries: list[SharedMount]) -> list[str]:
    """Each mounted path read (and written where declared writable) on the node."""
    token = secrets.token_hex(6)
    lines = []
    for e in entries:
        p = shlex.quote(e.path)
        lines.append(f"ls -A {p} > /dev/null 2>&1 && echo ok || echo 'not readable: {e.path}'")
        if e.writable:
            f = shlex.quote(f"{e.path}/.gpufleet-write-{token}")
            lines.append(f"(echo x > {f} && rm -f {f}) 2>/dev/null && echo ok || "
                         f"echo 'not writable: {e.path}'")
    result = node.run("\n".join(lines), timeout=ACCESS_TIMEOUT_S)
    return [line for line in result.stdout.splitlines() if line != "ok"]


def test_shared_mounts(node: Node, conformance: ConformanceSession,
                       record_property: RecordProperty) -> None:
    entries = _entries(node)
    if not entries:
        pytest.skip("no shared_mounts declared")
    mounts = _mounts(node)
    problems: list[str] = []
    reachable = []
    for entry in entries:
        mount = mounted_at(mounts, entry.path)
        sources = _sources(conformance, entry.path)
        problems += mount_problems(entry, mount, majority(sources))
        if mount is not None:
            reachable.append(entry)
            if mount.fstype in NFS and len(sources) > NFS_CLIENTS_NOTE:
                record_property("nfs_note", f"{entry.path}: NFS with {len(sources)} clients "
                                "(beyond 4 concurrent clients NFS degrades: measure it with "
                                "the storage suite, storage_dataset_path on this mount)")
    record_property("mounts", {e.path: (m.source if (m := mounted_at(mounts, e.path)) else None)
                               for e in entries})
    if reachable:
        try:
            problems += _access(node, reachable)
        except GpufleetError as exc:
            problems.append(f"access check failed: {exc}")
    assert not problems, "; ".join(problems)


@pytest.fixture(scope="session")
def markers(conformance: ConformanceSession) -> dict[str, dict[str, str]]:
    """For each writable shared mount: what every node reads of a marker one node wrote
    (path -> node -> problem, or "" when it reads the marker)."""
    nodes = conformance.ready()
    paths = sorted({e.path for n in nodes for e in _safe_entries(n) if e.writable})
    return {path: _marker(conformance, path) for path in paths}


def _marker(conformance: ConformanceSession, path: str) -> dict[str, str]:
    """A marker written on ``path`` by the first node whose mount has the source most nodes
    have, read back on every node, then removed."""
    nodes = conformance.ready()
    usual = majority(_sources(conformance, path))
    writers = [n for n in nodes
               if (m := mounted_at(n.known.get("mountinfo") or [], path)) is not None
               and m.source == usual]
    if not writers:
        return {n.name: f"no node to write a marker on {path}" for n in nodes}
    writer, token = writers[0], secrets.token_hex(16)
    marker = shlex.quote(f"{path}/.gpufleet-marker-{token}")
    try:
        writer.run(f"printf %s {token} > {marker}", timeout=ACCESS_TIMEOUT_S).check(
            f"writing {marker}")
    except GpufleetError as exc:
        return {n.name: f"the marker could not be written on {writer.name}: {exc}"
                for n in nodes}

    def read(node: Node) -> tuple[str, str]:
        try:
            with node_local():
                out = node.run(f"cat {marker} 2>/dev/null || true",
                               timeout=ACCESS_TIMEOUT_S).stdout
        except GpufleetError as exc:
            return node.name, f"could not read {path}: {exc}"
        if out == token:
            return node.name, ""
        return node.name, (f"{path} is not the filesystem {writer.name} writes to: its "
                           "marker file is " + ("absent" if not out else "different"))

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(conformance.forks, len(nodes)))) as pool:
            return dict(pool.map(read, nodes))
    finally:
        with contextlib.suppress(GpufleetError):
            writer.run(f"rm -f {marker}", timeout=ACCESS_TIMEOUT_S)


def _safe_entries(node: Node) -> list[SharedMount]:
    try:
        return _entries(node)
    except ValueError:
        return []


def test_same_filesystem(node: Node, markers: dict[str, dict[str, str]]) -> None:
    mine = {p: by_node.get(node.name, "") for p, by_node in markers.items()
            if p in {e.path for e in _entries(node) if e.writable}}
    if not mine:
        pytest.skip("no writable shared_mounts declared (a marker needs one node to write)")
    problems = [why for why in mine.values() if why]
    assert not problems, "; ".join(problems)


def test_mounts_agree_within_each_group(node: Node, conformance: ConformanceSession,
                                        record_property: RecordProperty) -> None:
    mine = network_mounts(_mounts(node))
    record_property("network_mounts", sorted(f"{t} {f} {s}" for t, f, s in mine))
    groups = sorted(node.host.groups - {"all"}) or ["all"]
    problems = []
    for group in groups:
        others = [network_mounts(n.known.get("mountinfo") or [])
                  for n in conformance.ready() if group in n.host.groups]
        if len(others) < 2:
            continue
        found = group_differences(mine, others)
        if found:
            problems.append(f"group {group}: " + ", ".join(found))
    assert not problems, "; ".join(problems)
