"""The cluster's addresses in a set file of their own: a node joining a provisioned lab
changes that one small file on the other nodes, never their rulesets; drift reports
exactly it, provisioning loads it alone (the new node reaches the rendezvous port at
once), and the firewall suite and the whole-range analysis pass with the sets."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet import app
from gpufleet.lab.cluster import Lab
from gpufleet.roles.firewall import CLUSTER_FILE
from tests.lab.conftest import PROVISIONED, node_sh
from tests.lab.test_provision import items, run

NODES = PROVISIONED.split(":")


def _connect(lab: Lab, client: str, server: str, port: int) -> str:
    """A real TCP connect from ``client`` to ``server``:``port`` (a listener started there
    for it): ``open``, or why not."""
    address = lab.node(server).address
    node_sh(lab, server, f"(timeout 20 python3 -c 'import socket; s = socket.socket(); "
            f"s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"\", {port})); "
            "s.listen(); s.accept()' >/dev/null 2>&1 &) ; sleep 0.5")
    probe = (f"import socket; s = socket.socket(); s.settimeout(3); "
             f"s.connect(('{address}', {port})); print('open')")
    return node_sh(lab, client, f"python3 -c \"{probe}\" 2>&1 | tail -n1", check=False).strip()


def test_a_node_joining_changes_only_the_set_file(lab: Lab, provisioned: Path,
                                                  tmp_path: Path) -> None:
    rulesets = {n: node_sh(lab, n, "sha256sum /etc/gpufleet/firewall.nft") for n in NODES}
    before = node_sh(lab, "node01", f"cat {CLUSTER_FILE}")
    node = lab.add()
    try:
        drift = tmp_path / "drift.json"
        code = app.drift_cmd(str(provisioned), limit=PROVISIONED, roles="firewall",
                             outputs=app.DriftOutputs(json_path=str(drift),
                                                      report_dir=str(tmp_path / "h")))
        assert code == 1
        hosts = json.loads(drift.read_text())["hosts"]
        assert {n: [i["item"] for i in hosts[n]["items"]] for n in NODES} == {
            n: [f"firewall/file {CLUSTER_FILE}"] for n in NODES}
        assert _connect(lab, node.name, "node01", 29500) != "open"

        outcomes = run(provisioned, PROVISIONED, role_names="firewall")
        assert {n: [c.item for c in o.value.applied] for n, o in outcomes.items()
                if o.value is not None} == {n: [f"firewall/file {CLUSTER_FILE}"] for n in NODES}
        assert {n: node_sh(lab, n, "sha256sum /etc/gpufleet/firewall.nft") for n in NODES} \
            == rulesets
        assert lab.node(node.name).address in node_sh(lab, "node01",
                                                      "nft list set inet gpufleet cluster4")
        assert _connect(lab, node.name, "node01", 29500) == "open"
        assert all(items(run(provisioned, n, check=True)[n]) == [] for n in NODES)
        report = tmp_path / "firewall.json"
        assert app.conformance_cmd(str(provisioned), limit=PROVISIONED, suites="firewall",
                                   json_path=str(report)) == 0
    finally:
        lab.remove(node.name)
        run(provisioned, PROVISIONED, role_names="firewall")
    assert node_sh(lab, "node01", f"cat {CLUSTER_FILE}") == before
