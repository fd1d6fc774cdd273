"""Detection power on real lab nodes: each fault injected on one node is caught on that
node, by name, and a clean lab passes: a foreign higher-priority table that drops the
rendezvous port, a 100-port hole in the middle of the opened range, a GPU missing only
from nvidia-smi's query, an NCCL_SOCKET_IFNAME naming an interface the node lacks."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from gpufleet import app
from gpufleet.lab.cluster import Lab
from tests.lab.conftest import PROVISIONED, foreign_table, node_sh
from tests.lab.fakegpu import install, remove
from tests.lab.test_provision import override, run


def failures(inventory: Path, tmp_path: Path, limit: str, suites: str,
             keyword: str | None = None) -> tuple[int, dict[tuple[str, str], str], list[Any]]:
    report = tmp_path / f"{suites.replace(',', '-')}.json"
    code = app.conformance_cmd(str(inventory), limit=limit, suites=suites,
                               json_path=str(report),
                               extra_args=["-k", keyword] if keyword else None)
    results = json.loads(report.read_text())["results"]
    return code, {(r["host"], r["check"]): r["message"] for r in results
                  if r["outcome"] == "fail"}, results


def test_a_clean_lab_passes_the_firewall_and_stack_checks(provisioned: Path,
                                                          tmp_path: Path) -> None:
    code, failed, results = failures(provisioned, tmp_path, PROVISIONED, "firewall,stack")
    assert (code, failed) == (0, {})
    assert {r["host"] for r in results if r["check"] == "test_live_rules_admit_the_cluster"
            and r["outcome"] == "pass"} == {"node01", "node02", "node03", "node04"}


def test_foreign_rules_are_caught_on_their_node_with_the_rule(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    node2 = lab.node("node02").address
    foreign_table(lab, "node03", f"ip saddr {node2} tcp dport 29500 drop")
    foreign_table(lab, "node04", "tcp dport 57000-57099 drop")
    try:
        code, failed, _ = failures(provisioned, tmp_path, PROVISIONED, "firewall")
        drift = tmp_path / "drift.json"
        app.drift_cmd(str(provisioned), limit=PROVISIONED, roles="firewall",
                      outputs=app.DriftOutputs(json_path=str(drift),
                                               report_dir=str(tmp_path / "h")))
    finally:
        for node in ("node03", "node04"):
            node_sh(lab, node, "nft delete table inet site")
    assert code == 1
    assert set(failed) == {("node03", "test_live_rules_admit_the_cluster"),
                           ("node04", "test_live_rules_admit_the_cluster")}
    assert failed[("node03", "test_live_rules_admit_the_cluster")] == (
        f"tcp dport 29500 from {node2} is dropped by table inet site chain in (priority -10) "
        f"handle 2: ip saddr {node2} tcp dport 29500 drop")
    assert "tcp dports 57000-57099 from 15 sources" in failed[
        ("node04", "test_live_rules_admit_the_cluster")]
    hosts = json.loads(drift.read_text())["hosts"]
    assert [i["resource"] for i in hosts["node03"]["items"]] == [
        "foreign rule in table inet site chain in handle 2"]
    assert hosts["node01"]["items"] == [] and hosts["node02"]["items"] == []


def test_a_ruleset_too_large_to_read_in_time_is_unknown_not_a_timeout(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    """150,000 rules take seconds to list; with one second allowed, the check fails as
    unknown with the limit named, not as a timeout of the host."""
    generate = ("import sys; w = sys.stdout.write; w('table inet big {\\n chain in {\\n type "
                "filter hook input priority 5; policy accept;\\n'); [w(f'ip saddr 10.{i >> 8 & "
                "255}.{i & 255}.9 tcp dport {1024 + i % 60000} accept\\n') for i in "
                "range(150000)]; w(' }\\n}\\n')")
    node_sh(lab, "node04", f"python3 -c {shlex.quote(generate)} > /tmp/big.nft && "
            "nft -f /tmp/big.nft && rm /tmp/big.nft")
    try:
        with override(provisioned, "host_vars", "node04", {"firewall_read_timeout_s": 1}):
            code, failed, _ = failures(provisioned, tmp_path, "node04", "firewall")
    finally:
        node_sh(lab, "node04", "nft delete table inet big")
    assert code == 1
    assert failed == {("node04", "test_live_rules_admit_the_cluster"):
                      "unknown: ruleset too large to read in 1 s (nft -j list ruleset and the "
                      "iptables saves did not finish; firewall_read_timeout_s and the host's "
                      "budget bound it)"}


def test_a_gpu_missing_only_from_the_query_fails_that_node(
        lab: Lab, inventory_path: Path, tmp_path: Path) -> None:
    install(lab, "node09")
    install(lab, "node10", drop_last_gpu=True)
    try:
        code, failed, _ = failures(inventory_path, tmp_path, "node09:node10", "gpu",
                                   "count_and_model")
    finally:
        remove(lab, "node09")
        remove(lab, "node10")
    assert code == 1
    assert failed == {("node10", "test_count_and_model"): (
        "GPU counts disagree: 2 on nvidia-smi -L, 1 on the nvidia-smi query, 2 on the "
        "topology")}


def test_an_nccl_interface_the_node_lacks_fails_that_node(
        lab: Lab, provisioned: Path, tmp_path: Path) -> None:
    node_sh(lab, "node02", "sed -i 's/^NCCL_SOCKET_IFNAME=.*/NCCL_SOCKET_IFNAME=eth9/' "
            "/etc/default/gpufleet-nccl")
    try:
        code, failed, _ = failures(provisioned, tmp_path, PROVISIONED, "stack",
                                   "nccl_environment")
    finally:
        run(provisioned, "node02", role_names="nccl_env")
    assert code == 1
    assert failed == {("node02", "test_nccl_environment"): (
        "NCCL_SOCKET_IFNAME=eth9: no interface 'eth9' on this node (it has eth0, lo)")}
