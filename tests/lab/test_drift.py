"""Drift on real lab nodes: every kind of hand-made drift, all outputs, read-only proof."""

from __future__ import annotations

import json
import os
import stat
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path
from typing import Any

from gpufleet import app, roles
from gpufleet.lab.cluster import Lab
from tests.junit_schema import check_junit
from tests.lab.conftest import PROVISIONED, node_sh
from tests.lab.test_provision import override, run
from tests.unit.test_metrics import promtool, samples

DRIFT_HOSTS = PROVISIONED


def drift(inventory_path: Path, tmp_path: Path, name: str, **kwargs: Any
          ) -> tuple[int, dict[str, Any], ET.Element, str]:
    """Run drift with every output; return exit code, JSON, JUnit root, Prometheus text."""
    outputs = app.DriftOutputs(str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.xml"),
                               str(tmp_path / f"{name}.prom"), str(tmp_path / "history"))
    kwargs.setdefault("limit", DRIFT_HOSTS)
    code = app.drift_cmd(str(inventory_path), outputs=outputs, **kwargs)
    check_junit(tmp_path / f"{name}.xml")
    promtool(tmp_path / f"{name}.prom")
    return (code, json.loads((tmp_path / f"{name}.json").read_text()),
            ET.parse(tmp_path / f"{name}.xml").getroot(), (tmp_path / f"{name}.prom").read_text())


def metric(prom: str, name: str, **labels: str) -> float | None:
    """The value of the series ``name`` with ``labels`` (and the lab's inventory label)."""
    wanted = tuple(sorted({"inventory": "lab", **labels}.items()))
    return samples(prom).get((name, wanted))


def snapshot(lab: Lab, nodes: list[str]) -> dict[str, tuple[int, ...]]:
    """Every entry of the nodes' overlay upper layers with its metadata (a write changes
    size, mtime or ctime; a new or removed file changes the listing)."""
    entries: dict[str, tuple[int, ...]] = {}
    for node in nodes:
        upper = lab.node(node).dir / "upper"
        for root, dirs, files in os.walk(upper):
            for name in dirs + files:
                path = os.path.join(root, name)
                st = os.lstat(path)
                entries[path] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns,
                                 st.st_ctime_ns, st.st_rdev if stat.S_ISCHR(st.st_mode) else 0)
    return entries


def standin_torch_wheel(directory: Path, version: str) -> Path:
    """A minimal wheel named torch (a stand-in "other torch" that reports ``version``)."""
    wheel = directory / f"torch-{version}-py3-none-any.whl"
    dist = f"torch-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("torch/__init__.py", "from torch.version import __version__\n")
        zf.writestr("torch/version.py", f"__version__ = '{version}'\ncuda = None\n")
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
        zf.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: gpufleet-tests\n"
                    "Root-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{dist}/RECORD", "")
    return wheel


def host_items(doc: dict[str, Any], host: str) -> dict[str, tuple[str, str]]:
    return {i["item"]: (i["desired"], i["actual"]) for i in doc["hosts"][host]["items"]}


def test_a_provisioned_lab_has_no_drift(provisioned: Path, tmp_path: Path) -> None:
    code, doc, junit_root, prom = drift(provisioned, tmp_path, "clean")
    assert code == 0
    assert doc["schema"] == "gpufleet.drift/1"
    assert doc["summary"] == {"hosts": 4, "clean": 4, "drifted": 0, "unreachable": 0,
                              "error": 0, "items": 0, "new": 0, "resolved": 0}
    assert junit_root.find("testsuite").get("failures") == "0"  # type: ignore[union-attr]
    assert metric(prom, "gpufleet_host_reachable", host="node01") == 1
    assert "gpufleet_drift_items{" not in prom


def test_every_kind_of_drift_on_one_node_is_reported_on_that_node_only(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    wheel = standin_torch_wheel(lab.config.root, "2.12.0+lab")
    node_sh(lab, "node02", " && ".join([
        "DEBIAN_FRONTEND=noninteractive apt-get -qq -y --allow-change-held-packages install "
        "--allow-downgrades libnccl2=2.23.4-1+cuda12.6 libnccl-dev=2.23.4-1+cuda12.6 >/dev/null",
        "apt-mark unhold libnccl2 >/dev/null",
        "apt-mark unhold cuda-toolkit-12-4 >/dev/null",
        "rm /etc/apt/preferences.d/gpufleet-driver.pref",
        "sed -i 's/NCCL_DEBUG=WARN/NCCL_DEBUG=INFO/; $a NCCL_IB_PASSWORD=hunter2' /etc/nccl.conf",
        "sysctl -qw net.ipv4.ip_local_port_range='32768 60999'",
        "nft flush table inet gpufleet",
        f"/opt/gpufleet/venv/bin/pip -q install --no-deps --force-reinstall {wheel}",
    ]))
    conf_size = int(node_sh(lab, "node02", "stat -c %s /etc/nccl.conf"))
    try:
        code, doc, junit_root, prom = drift(provisioned, tmp_path, "dirty")
        assert code == 1
        assert [h for h, e in doc["hosts"].items() if e["status"] == "drifted"] == ["node02"]
        items = host_items(doc, "node02")
        assert items == {
            "driver/file /etc/apt/preferences.d/gpufleet-driver.pref": ("165 bytes", "absent"),
            "cuda/hold cuda-toolkit-12-4": ("held", "not held"),
            "nccl/package libnccl2": ("2.21.5-1+cuda12.4", "2.23.4-1+cuda12.6"),
            "nccl/package libnccl-dev": ("2.21.5-1+cuda12.4", "2.23.4-1+cuda12.6"),
            "pytorch/torch": ("{torch: 2.13.0, cuda: none}", "{torch: 2.12.0+lab}"),
            "nccl_env/file /etc/nccl.conf": ("127 bytes", f"{conf_size} bytes (differs)"),
            "nccl_env/sysctl net.ipv4.ip_local_port_range": ("49152 65535", "32768 60999"),
            "firewall/live ruleset (nftables)": ("as rendered",
                                                 "changed since gpufleet loaded it"),
        }
        kinds = {i["item"]: i["kind"] for i in doc["hosts"]["node02"]["items"]}
        assert kinds["driver/file /etc/apt/preferences.d/gpufleet-driver.pref"] == "apt-pin"
        assert kinds["nccl/package libnccl2"] == "package"
        assert kinds["cuda/hold cuda-toolkit-12-4"] == "hold"
        conf = next(i for i in doc["hosts"]["node02"]["items"] if i["item"].endswith("nccl.conf"))
        assert "-NCCL_DEBUG=INFO" in conf["diff"] and "+NCCL_DEBUG=WARN" in conf["diff"]
        assert "-NCCL_IB_PASSWORD=********" in conf["diff"]
        assert "hunter2" not in json.dumps(doc) and "hunter2" not in prom
        assert all(i["new"] for i in doc["hosts"]["node02"]["items"])
        failures = {c.get("name"): c.find("failure").get("message")  # type: ignore[union-attr]
                    for c in junit_root.iter("testcase") if c.find("failure") is not None}
        assert failures["nccl/package libnccl2"] == \
            "desired 2.21.5-1+cuda12.4, actual 2.23.4-1+cuda12.6"
        assert len(failures) == 8
        assert {c.get("classname") for c in junit_root.iter("testcase")
                if c.find("failure") is not None} == {"drift.node02"}
        assert metric(prom, "gpufleet_drift_items", host="node02", role="nccl",
                      item="package libnccl2") == 1
        assert metric(prom, "gpufleet_drift_host_items", host="node02") == 8
        assert metric(prom, "gpufleet_drift_host_items", host="node01") == 0
    finally:
        restored = run(provisioned, "node02")
    assert restored["node02"].status == "changed", restored["node02"].error
    code, doc, _, _ = drift(provisioned, tmp_path, "after")
    assert code == 0
    assert doc["resolved_since_last"] == sorted(f"node02 {item}" for item in items)


def test_new_and_resolved_since_the_last_run(lab: Lab, provisioned: Path,
                                              tmp_path: Path) -> None:
    assert drift(provisioned, tmp_path, "first")[0] == 0
    node_sh(lab, "node03", "apt-mark unhold libnccl-dev >/dev/null")
    code, doc, _, _ = drift(provisioned, tmp_path, "second")
    assert code == 1
    assert doc["new_since_last"] == ["node03 nccl/hold libnccl-dev"]
    assert doc["roles_checked"] == sorted(["consistency", "watch", *(r.name for r in roles.ALL)])
    node_sh(lab, "node03", "apt-mark hold libnccl-dev >/dev/null")
    code, doc, _, _ = drift(provisioned, tmp_path, "third")
    assert code == 0
    assert doc["resolved_since_last"] == ["node03 nccl/hold libnccl-dev"]
    history = sorted((tmp_path / "history").glob("*/drift-*.json"))
    assert len(history) == 3


def test_history_is_bounded(provisioned: Path, tmp_path: Path) -> None:
    outputs = app.DriftOutputs(report_dir=str(tmp_path / "history"), keep=2)
    for _ in range(4):
        assert app.drift_cmd(str(provisioned), limit="node01", outputs=outputs) == 0
    assert len(list((tmp_path / "history").glob("*/drift-*.json"))) == 2


def test_a_pending_reboot_is_drift(lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    with override(provisioned, "host_vars", "node04", {
            "nvidia_driver_version": "550.144.03"}):
        assert run(provisioned, "node04")["node04"].status == "changed"
        code, doc, _, _ = drift(provisioned, tmp_path, "reboot", limit="node04")
        assert code == 1
        module = next(i for i in doc["hosts"]["node04"]["items"]
                      if i["item"] == "driver/kernel module nvidia")
        assert (module["desired"], module["actual"], module["reboot_required"], module["kind"]) \
            == ("550.144.03 (proprietary)", "550.127.05 (proprietary)", True, "reboot")
    run(provisioned, "node04")
    code, doc, _, _ = drift(provisioned, tmp_path, "reboot-after", limit="node04")
    assert code == 0, doc["hosts"]["node04"]


def test_consistency_catches_a_value_the_inventory_does_not_pin(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    unpinned = tmp_path / "unpinned.yml"
    hosts = {n: {"ansible_host": lab.node(n).address} for n in ("node01", "node02", "node03")}
    unpinned.write_text(json.dumps({"all": {"vars": {
        "ansible_user": "root", "ansible_ssh_private_key_file": str(lab.config.key),
        "gpufleet_known_hosts": str(lab.config.known_hosts),
        "pytorch_venv": "/opt/gpufleet/venv"},
        "children": {"training": {"hosts": hosts}}}}))
    node_sh(lab, "node02", "DEBIAN_FRONTEND=noninteractive apt-get -qq -y "
            "--allow-change-held-packages install libnccl2=2.23.4-1+cuda12.6 "
            "libnccl-dev=2.23.4-1+cuda12.6 >/dev/null")
    try:
        code, doc, _, _ = drift(unpinned, tmp_path, "consistency", limit="all")
    finally:
        run(provisioned, "node02")
    assert code == 1
    assert doc["consistency"] == [{
        "group": "training", "key": "nccl",
        "values": {"2.21.5-1+cuda12.4": ["node01", "node03"],
                   "2.23.4-1+cuda12.6": ["node02"]},
        "majority": "2.21.5-1+cuda12.4", "outliers": ["node02"]}]
    assert host_items(doc, "node02") == {
        "consistency/nccl in group training": ("2.21.5-1+cuda12.4", "2.23.4-1+cuda12.6")}
    assert doc["hosts"]["node01"]["status"] == "clean"


def test_an_unreachable_node_is_an_error_and_the_others_are_reported(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    lab.set_link("node03", up=False)
    try:
        code, doc, junit_root, prom = drift(
            provisioned, tmp_path, "unreachable",
            fleet=app.FleetArgs(connect_timeout=2))
    finally:
        lab.set_link("node03", up=True)
    assert code == 3
    assert doc["hosts"]["node03"]["status"] == "unreachable"
    assert "timed out" in doc["hosts"]["node03"]["error"]
    assert {doc["hosts"][n]["status"] for n in ("node01", "node02", "node04")} == {"clean"}
    assert metric(prom, "gpufleet_host_reachable", host="node03") == 0
    errors = [c for c in junit_root.iter("testcase") if c.find("error") is not None]
    assert [(c.get("classname"), c.get("name")) for c in errors] == [("drift.node03",
                                                                      "reachable")]


def test_drift_never_writes_on_a_node(lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    nodes = ["node01", "node02", "node03", "node04"]
    node_sh(lab, "node02", "echo 'NCCL_DEBUG=TRACE' >> /etc/nccl.conf")
    try:
        before = snapshot(lab, nodes)
        code, doc, _, _ = drift(provisioned, tmp_path, "readonly")
        after = snapshot(lab, nodes)
        assert code == 1 and doc["summary"]["drifted"] == 1
        changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        assert changed == []
        assert len(before) > 1000
    finally:
        run(provisioned, "node02")


def test_remediate_brings_drifted_hosts_back(lab: Lab, provisioned: Path,
                                             tmp_path: Path) -> None:
    node_sh(lab, "node01", "apt-mark unhold libnccl2 >/dev/null")
    code, doc, _, _ = drift(provisioned, tmp_path, "remediate", remediate=True)
    assert code == 0
    assert doc["remediation"] == {"node01": {"status": "changed", "error": None,
                                             "applied": ["nccl/hold libnccl2"]}}
    assert drift(provisioned, tmp_path, "remediated")[0] == 0


def test_drift_on_16_nodes_costs_one_round_trip_per_host(lab: Lab, inventory_path: Path,
                                                         tmp_path: Path) -> None:
    code, doc, _, _ = drift(inventory_path, tmp_path, "sixteen", limit="all", roles="nccl_env")
    assert len(doc["hosts"]) == 16
    assert {h["round_trips"] for h in doc["hosts"].values()} == {1}
    assert code == 1  # nodes 05-16 were never provisioned: their NCCL files are missing
    assert [i for i in doc["hosts"]["node01"]["items"] if i["role"] == "nccl_env"] == []
    assert "nccl_env/file /etc/nccl.conf" in host_items(doc, "node16")
