"""The AllReduce hierarchy on a lab of its own with six provisioned nodes: a clean lab
passes, and a pair cut between two nodes that are not the first (node05's nftables
dropping node03's traffic to the high range only, from a foreign table) is found by the
bisection and named with its direction."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.conftest import ROOT
from tests.lab.conftest import lab_config_for, node_processes, node_sh
from tests.lab.test_provision import override

pytestmark = pytest.mark.scale

NODES = 6
FAST = {"allreduce_cpu_procs": 1, "allreduce_timeout_s": 40, "allreduce_bisect_timeout_s": 20}


@pytest.fixture(scope="module")
def six(lab: Lab, provisioned: Path, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[Lab, Path]]:
    """Six nodes provisioned with every role; torch's venv is hard-linked from the session
    lab's node01 into each new node's overlay before the node first looks at /opt, so the
    pytorch role finds it installed instead of pip-installing it six times."""
    inventory = tmp_path_factory.mktemp("bisect") / "lab"
    shutil.copytree(ROOT / "inventory" / "lab" / "group_vars", inventory / "group_vars")
    cut = Lab(lab_config_for("bs", 4, inventory))
    cut.down()
    cut.up(NODES)
    venv = lab.node("node01").dir / "upper" / "opt" / "gpufleet"
    for node in cut.nodes():
        target = node.dir / "upper" / "opt"
        subprocess.run(["cp", "-al", str(venv), str(target)], check=True)
    try:
        assert app.provision_cmd(str(inventory), reboot=True) == 0
        yield cut, inventory
    finally:
        cut.down()


def _allreduce(inventory: Path, tmp_path: Path, name: str) -> tuple[int, dict[str, Any], float]:
    report = tmp_path / f"{name}.json"
    start = time.monotonic()
    with override(inventory, "group_vars", "lab", FAST):
        code = app.conformance_cmd(str(inventory), suites="allreduce", json_path=str(report))
    return code, json.loads(report.read_text()), time.monotonic() - start


def _rows(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["check"], r["host"]): r for r in doc["results"]}


def _leftovers(cut: Lab) -> dict[str, str]:
    found = {n.name: " ".join(p for p in node_processes(cut, n.name) if "gpufleet-probe-" in p)
             for n in cut.nodes()}
    return {n: p for n, p in found.items() if p}


def test_a_clean_lab_passes_every_level(six: tuple[Lab, Path], tmp_path: Path) -> None:
    cut, inventory = six
    code, doc, wall = _allreduce(inventory, tmp_path, "clean")
    rows = _rows(doc)
    assert code == 0, [r["message"] for r in doc["results"] if r["outcome"] == "fail"]
    assert {rows[("test_each_node_alone", f"node0{i}")]["outcome"]
            for i in range(1, NODES + 1)} == {"pass"}
    hierarchy = doc["data"]["allreduce"]["hierarchy"]
    assert [r["nodes"] for r in hierarchy["pairs"]] == [["node01", "node02"],
                                                        ["node03", "node04"],
                                                        ["node05", "node06"]]
    assert hierarchy["all"]["ok"] and hierarchy["bisection"] is None
    assert _leftovers(cut) == {}
    print(f"clean 6-node allreduce suite: {wall:.1f}s")


def test_a_pair_cut_between_two_non_first_nodes_is_named_with_its_direction(
        six: tuple[Lab, Path], tmp_path: Path) -> None:
    cut, inventory = six
    source = cut.node("node03").address
    node_sh(cut, "node05", "nft add table inet cut && nft add chain inet cut input "
            "'{ type filter hook input priority -5; policy accept; }' && "
            f"nft add rule inet cut input ip saddr {source} tcp dport 49152-65535 drop")
    try:
        code, doc, wall = _allreduce(inventory, tmp_path, "cut")
    finally:
        node_sh(cut, "node05", "nft delete table inet cut")
    rows = _rows(doc)
    assert code == 1
    assert {rows[("test_each_node_alone", f"node0{i}")]["outcome"]
            for i in range(1, NODES + 1)} == {"pass"}
    fleet = rows[("test_all_nodes_together", "fleet")]
    assert fleet["outcome"] == "fail"
    message = fleet["message"]
    assert re.search(r"pair (node03 and node05|node05 and node03) \(node05 drops node03's "
                     r"connections, node03 -> node05: \d+ of \d+ probed ports dropped, "
                     r"e\.g\. 49152, .*; open: 29500\)", message), message
    assert "fails together, passes with others" in message
    assert re.search(r"hung in (rendezvous|the first collective)|torchrun exited", message)
    hierarchy = doc["data"]["allreduce"]["hierarchy"]
    [verdict] = hierarchy["verdicts"]
    assert verdict["confirmed"] and sorted(verdict["nodes"]) == ["node03", "node05"]
    assert verdict["blocked"]["node05->node03"] == []
    assert verdict["blocked"]["node03->node05"]
    bisection = hierarchy["bisection"]
    assert bisection["rounds"] <= bisection["max_rounds"] and not bisection["exhausted"]
    assert bisection["seconds"] <= bisection["budget_s"]
    assert _leftovers(cut) == {}
    print(f"cut pair: suite {wall:.1f}s, bisection verdict after {bisection['seconds']}s "
          f"({bisection['rounds']} rounds of at most {bisection['trial_timeout_s']}s)")
