"""Shared filesystems on a lab of its own. This kernel cannot serve NFS from a network
namespace (no nfsd), so the shared filesystem is a directory of the controller bind-mounted
into each node's own mount namespace at /mnt/data: every node that mounts it sees one
filesystem, as with an NFS export. Faults: node03 without the mount, node04 mounted from
another directory (another export), node05 mounted read-only although declared writable.
Each fails the right check, named; node01 and node02 pass."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.conftest import ROOT
from tests.lab.conftest import lab_config_for, node_sh
from tests.lab.test_provision import override

NODES = 5
MOUNT = "/mnt/gpufleet-shared"


@pytest.fixture(scope="module")
def mounts_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("lab tests need root: they create network namespaces and mounts")
    inventory_dir = tmp_path_factory.mktemp("mounts-inventory") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory_dir / "group_vars")
    lab = Lab(lab_config_for("mt", 8, inventory_dir))
    lab.down()
    lab.up(NODES)
    yield lab
    for node in lab.nodes():
        node_sh(lab, node.name, f"umount {MOUNT} 2>/dev/null; true", check=False)
    lab.down()
    with contextlib.suppress(OSError):
        Path(MOUNT).rmdir()


def _run(lab: Lab, tmp_path: Path) -> tuple[int, dict[tuple[str, str], str]]:
    report = tmp_path / "mounts.json"
    code = app.conformance_cmd(str(lab.config.inventory_dir), suites="mounts",
                               json_path=str(report))
    return code, {(r["host"], r["check"].removeprefix("test_")):
                  f"{r['outcome']}: {r.get('message') or ''}"
                  for r in json.loads(report.read_text())["results"]}


def test_missing_foreign_and_read_only_mounts_fail_their_nodes(mounts_lab: Lab,
                                                               tmp_path: Path) -> None:
    lab = mounts_lab
    exports = {name: lab.config.root / "exports" / name for name in ("a", "b")}
    for path in exports.values():
        path.mkdir(parents=True, exist_ok=True)
    Path(MOUNT).mkdir(exist_ok=True)
    for node, export in [("node01", "a"), ("node02", "a"), ("node04", "b"), ("node05", "a")]:
        node_sh(lab, node, f"mount --bind {exports[export]} {MOUNT}")
    node_sh(lab, "node05", f"mount -o remount,bind,ro {MOUNT}")
    declared = {"shared_mounts": [{"path": MOUNT, "options": ["rw"], "writable": True}]}
    with override(lab.config.inventory_dir, "group_vars", "lab", declared):
        code, results = _run(lab, tmp_path)
    assert code == 1
    failed = {k: v for k, v in results.items() if not v.startswith("pass")}
    source_a = f"[{exports['a']}]"
    assert set(failed) == {("node03", "shared_mounts"), ("node03", "same_filesystem"),
                           ("node04", "shared_mounts"), ("node04", "same_filesystem"),
                           ("node05", "shared_mounts")}, results
    assert failed[("node03", "shared_mounts")] == f"fail: {MOUNT} is not mounted"
    assert f"{MOUNT} is mounted from " in failed[("node04", "shared_mounts")]
    assert f"[{exports['b']}], the other nodes mount " in failed[("node04", "shared_mounts")]
    assert source_a in failed[("node04", "shared_mounts")]
    assert failed[("node04", "same_filesystem")] == (
        f"fail: {MOUNT} is not the filesystem node01 writes to: its marker file is absent")
    assert "is mounted read-only, declared writable" in failed[("node05", "shared_mounts")]
    assert f"not writable: {MOUNT}" in failed[("node05", "shared_mounts")]
    assert results[("node05", "same_filesystem")].startswith("pass")
    assert {results[(n, "mounts_agree_within_each_group")][:4] for n in
            [f"node0{i}" for i in range(1, NODES + 1)]} == {"pass"}
    assert not list(exports["a"].iterdir()), "the marker and the write test leave nothing"
