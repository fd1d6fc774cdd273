"""Each report of a run on the lab validates against its shipped schema: facts, provision
(checked and applied), drift (drifted, remediated, clean again) with its history, and
conformance with AllReduce's data and verdicts. The conftest validates every document as it
is written; here each is also read back from its file, its header checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpufleet import app
from gpufleet.inventory.load import load_inventory
from gpufleet.lab.cluster import Lab
from gpufleet.report.schemas import validate
from tests.lab.conftest import PROVISIONED, node_sh

HEADER = ["schema", "gpufleet_version", "generated_at", "inventory", "inventory_digest",
          "duration_s", "summary"]


def _read(path: Path, schema: str, digest: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    validate(document)
    assert list(document)[:len(HEADER)] == HEADER
    assert (document["schema"], document["inventory_digest"]) == (schema, digest)
    return document


def test_every_report_of_a_lab_run_validates(lab: Lab, provisioned: Path,
                                             tmp_path: Path) -> None:
    inventory = str(provisioned)
    digest = load_inventory(provisioned).digest()
    history = str(tmp_path / "history")

    def drift(name: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        path = tmp_path / f"{name}.json"
        code = app.drift_cmd(inventory, limit=PROVISIONED, outputs=app.DriftOutputs(
            json_path=str(path), report_dir=history), **kwargs)
        return code, _read(path, "gpufleet.drift/1", digest)

    assert app.facts(inventory, limit=PROVISIONED, json_path=str(tmp_path / "facts.json")) == 0
    facts = _read(tmp_path / "facts.json", "gpufleet.facts/1", digest)
    assert facts["summary"]["ok"] == 4

    node_sh(lab, "node02", "echo 'NCCL_DEBUG=TRACE' >> /etc/nccl.conf")
    assert app.provision_cmd(inventory, limit=PROVISIONED, check=True,
                             json_path=str(tmp_path / "check.json")) == 0
    check = _read(tmp_path / "check.json", "gpufleet.provision/1", digest)
    assert (check["summary"]["changes"], check["summary"]["applied"]) == (1, 0)
    assert app.provision_cmd(inventory, limit="node02",
                             json_path=str(tmp_path / "apply.json")) == 0
    applied = _read(tmp_path / "apply.json", "gpufleet.provision/1", digest)
    assert applied["hosts"]["node02"]["changes"][0]["applied"] is True

    node_sh(lab, "node02", "echo 'NCCL_DEBUG=TRACE' >> /etc/nccl.conf")
    code, drifted = drift("drifted")
    assert code == 1
    [item] = drifted["hosts"]["node02"]["items"]
    assert item["diff"] and item["new"]
    code, remediated = drift("remediated", remediate=True)
    assert code == 0
    assert remediated["remediation"]["node02"]["status"] == "changed"
    code, clean = drift("clean")
    assert code == 0
    assert clean["resolved_since_last"] == [f"node02 {item['item']}"]
    runs = sorted((tmp_path / "history").rglob("drift-*.json"))
    assert len(runs) == 3
    for run in runs:
        validate(json.loads(run.read_text()))

    assert app.conformance_cmd(inventory, limit="node01:node02",
                               suites="stack,reachability,allreduce",
                               json_path=str(tmp_path / "conformance.json")) == 0
    conformance = _read(tmp_path / "conformance.json", "gpufleet.conformance/1", digest)
    assert conformance["data"]["allreduce"]
    assert any(r["properties"].get("verdicts") for r in conformance["results"])
