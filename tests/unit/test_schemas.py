"""The shipped JSON Schemas: each is a valid draft 2020-12 schema whose $id carries its
schema id; the documents the commands write over local connections (and an unreachable
host) validate against theirs, the drift history's runs and the node files too; and a
document with a wrong type, a missing key or an unknown one is rejected with its JSON
path named. The whole documents the docs show validate too."""

from __future__ import annotations

import copy
import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpufleet import app
from gpufleet.bootstrap import BootstrapOptions, StepResult, node_state, render_state
from gpufleet.conformance.baseline import BaselineStore, judge_node
from gpufleet.conformance.results import ConformanceReport, Result
from gpufleet.conformance.session import Node
from gpufleet.conformance.verdict import Figure, properties
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.fleet import FleetOptions
from gpufleet.drift import report as drift_report
from gpufleet.drift.compare import Inconsistency
from gpufleet.drift.run import DriftOptions, check_fleet
from gpufleet.facts.gather import gather_facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Inventory
from gpufleet.inventory.target import Target
from gpufleet.report import schemas
from gpufleet.report.schemas import SchemaError, load, validate
from gpufleet.roles import consistency_request
from tests.conftest import ROOT

DOCUMENTS = ["gpufleet.facts/1", "gpufleet.provision/1", "gpufleet.drift/1",
             "gpufleet.conformance/1", "gpufleet.bootstrap/1", "gpufleet.baseline/1",
             "gpufleet.node/1"]
SEQ = Figure("storage.seq_read_mbps", "MB/s", 100.0)


def inventory_text(refused_port: int) -> str:
    """Two hosts on this machine over local connections (the roles' plans computed, never
    applied) and one whose SSH port refuses connections."""
    return f"""all:
  vars:
    ansible_connection: local
    nvidia_repo: false
    cuda_version: "12.4.1"
    nccl_version: "2.21.5"
    nccl_env:
      NCCL_DEBUG: WARN
  children:
    lab:
      hosts:
        here:
        there:
        gone:
          ansible_connection: ssh
          ansible_host: 127.0.0.1
          ansible_port: {refused_port}
"""


@pytest.fixture(scope="module")
def refused_port() -> Iterator[int]:
    """A port bound on 127.0.0.1 that nothing listens on: connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, refused_port: int) -> dict[str, Any]:
    """Every report the commands write, by name, as read back from its file."""
    out = tmp_path_factory.mktemp("reports")
    inventory = out / "hosts.yml"
    inventory.write_text(inventory_text(refused_port))
    source = str(inventory)
    codes = {
        "facts": app.facts(source, json_path=str(out / "facts.json")),
        "provision": app.provision_cmd(source, check=True, json_path=str(out / "provision.json")),
        "drift": app.drift_cmd(source, outputs=app.DriftOutputs(
            json_path=str(out / "drift.json"), report_dir=str(out / "history"))),
        "conformance": app.conformance_cmd(source, suites="host_sizing,stack",
                                           json_path=str(out / "conformance.json")),
        "bootstrap": app.bootstrap_cmd(source, BootstrapOptions(host="gone", connect_timeout=5),
                                       json_path=str(out / "bootstrap.json")),
    }
    assert codes == {"facts": 3, "provision": 3, "drift": 3, "conformance": 1, "bootstrap": 3}
    found: dict[str, Any] = {name: json.loads((out / f"{name}.json").read_text())
                             for name in codes}
    [history] = (out / "history").rglob("drift-*.json")
    found["history"] = json.loads(history.read_text())
    found["inventory"] = source
    return found


def test_each_schema_is_valid_draft_2020_12_and_its_id_carries_the_schema_id() -> None:
    assert schemas.ids() == sorted(DOCUMENTS)
    for schema_id in [*DOCUMENTS, schemas.COMMON]:
        schema = load(schema_id)
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"] == f"https://gpufleet.dev/schemas/{schema_id}"
        if schema_id != schemas.COMMON:
            assert schema["properties"]["schema"] == {"const": schema_id}
    shipped = sorted(p.name for p in files("gpufleet").joinpath("schemas").iterdir())
    assert shipped == sorted(f"{i.split('.')[1].split('/')[0]}.schema.json"
                             for i in [*DOCUMENTS, schemas.COMMON])


@pytest.mark.parametrize("name", ["facts", "provision", "drift", "history", "conformance",
                                  "bootstrap"])
def test_each_report_a_command_writes_validates(written: dict[str, Any], name: str) -> None:
    document = written[name]
    validate(document)
    assert list(document)[:7] == ["schema", "gpufleet_version", "generated_at", "inventory",
                                  "inventory_digest", "duration_s", "summary"]
    assert document["inventory"] == written["inventory"]
    assert document["inventory_digest"] == load_inventory(Path(written["inventory"])).digest()


def test_the_reports_count_what_they_list(written: dict[str, Any]) -> None:
    assert written["facts"]["summary"] == {"hosts": 3, "ok": 2, "failed": 0, "unreachable": 1,
                                           "skipped": 0}
    provision = written["provision"]
    changes = [c for h in provision["hosts"].values() for c in h.get("changes", [])]
    assert provision["summary"] == {"hosts": 3, "ok": 0, "changed": 2, "failed": 0,
                                    "unreachable": 1, "skipped": 0, "reboot_required": 0,
                                    "changes": len(changes), "applied": 0}
    assert changes  # the roles' plans on this machine, computed in check mode
    bootstrap = written["bootstrap"]
    assert [s["step"] for s in bootstrap["steps"]] == ["trust", "mark"]
    assert bootstrap["summary"] == {"steps": 2, "ok": 1, "failed": 1, "skipped": 0}
    assert written["history"] == written["drift"]


def test_a_drift_run_with_inconsistencies_and_a_remediation_validates(
        tmp_path: Path, refused_port: int) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(inventory_text(refused_port))
    run = check_fleet(Target.select(load_inventory(inventory), "here:there"),
                      DriftOptions(fleet=FleetOptions()))
    run.inconsistencies.append(Inconsistency("lab", "nccl", {"2.21.5-1": ["here"],
                                                             "2.23.4-1": ["there"]}, None))
    run.remediation = {"here": {"status": "reboot required", "error": None,
                                "applied": ["nccl/package libnccl2"]},
                       "there": {"status": "failed", "error": "apt failed", "applied": []}}
    validate(json.loads(json.dumps(drift_report.to_json(run))))


def local_inventory(tmp_path: Path) -> Inventory:
    inventory = tmp_path / "node.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01:\n      ansible_connection: local\n")
    return load_inventory(inventory)


def local_node(tmp_path: Path) -> Node:
    return Node(local_inventory(tmp_path).hosts["gpu01"], ConnectOptions())


def test_the_baseline_a_run_records_and_the_report_of_its_trend_validate(
        tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    node = local_node(tmp_path)
    recording = BaselineStore(record=True, path=str(path))
    verdicts = judge_node(node, recording, [SEQ], lambda trials: {SEQ.name: [1000.0] * trials})
    recorded = recording.write(node, node.conn.put)
    validate(json.loads(path.read_text()))
    comparing = BaselineStore(compare=True, path=str(path))
    judge_node(node, comparing, [SEQ], lambda trials: {SEQ.name: [500.0] * trials})
    node.close()
    report = ConformanceReport(
        "inv", "0" * 64, 1_700_000_000.0, 2.5,
        [Result("storage", "test_read", "gpu01", "pass", "", 2.0,
                {"verdicts": properties(verdicts)})],
        {"gpu01": {**comparing.trend(node), "recorded": recorded}})
    validate(json.loads(json.dumps(report.to_json())))


def test_the_node_state_bootstrap_writes_validates(tmp_path: Path) -> None:
    inventory = local_inventory(tmp_path)
    host = inventory.hosts["gpu01"]
    node = Node(host, ConnectOptions())
    facts = gather_facts(node.conn, consistency_request(host))
    certify = StepResult("certify", "ok", "9 checks passed", 1.0, {"conformance": {
        "node": {"pass": 7, "fail": 0, "skip": 2}, "pair": {"pass": 2, "fail": 0, "skip": 0}}})
    for ready, reason in ((True, None), (False, "preflight: / has 3 GB free")):
        state = node_state(host, inventory, facts, ready=ready, reason=reason,
                           steps=[certify] if ready else [], peer="gpu03" if ready else None)
        validate(json.loads(render_state(state)))
    node.close()


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        target: Any = document
        for key in parents:
            target = target[int(key) if isinstance(target, list) else key]
        if value is KeyError:
            del target[last]
        else:
            target[int(last) if isinstance(target, list) else last] = value
    return change


@pytest.mark.parametrize(("name", "path", "value", "message"), [
    ("facts", "hosts/here/status", "changed",
     r"^gpufleet.facts/1: \$.hosts.here.status: 'changed' is not one of "),
    ("facts", "generated_at", "2026-02-30T00:00:00Z",
     r"^gpufleet.facts/1: \$.generated_at: '2026-02-30T00:00:00Z' is not a 'date-time'$"),
    ("provision", "summary/changes", KeyError,
     r"^gpufleet.provision/1: \$.summary: 'changes' is a required property$"),
    ("provision", "hosts/here/changes/0/applied", "no",
     r"^gpufleet.provision/1: \$.hosts.here.changes\[0\].applied: 'no' is not of type "
     r"'boolean'$"),
    ("drift", "hosts/here/items/0/desired", 3,
     r"^gpufleet.drift/1: \$.hosts.here.items\[0\].desired: 3 is not of type "),
    ("history", "inventory_digest", "abc",
     r"^gpufleet.drift/1: \$.inventory_digest: 'abc' does not match "),
    ("conformance", "results/0/outcome", "error",
     r"^gpufleet.conformance/1: \$.results\[0\].outcome: 'error' is not one of "),
    ("conformance", "verdict", "PASS",
     r"^gpufleet.conformance/1: \$: Unevaluated properties are not allowed \('verdict' was "
     r"unexpected\)$"),
    ("bootstrap", "steps/0/step", "reboot",
     r"^gpufleet.bootstrap/1: \$.steps\[0\].step: 'reboot' is not one of "),
    ("bootstrap", "duration_s", -1,
     r"^gpufleet.bootstrap/1: \$.duration_s: -1 is less than the minimum of 0$"),
])
def test_a_wrong_report_is_rejected_naming_the_path(written: dict[str, Any], name: str,
                                                     path: str, value: Any,
                                                     message: str) -> None:
    document = copy.deepcopy(written[name])
    _set(path, value)(document)
    with pytest.raises(SchemaError, match=message):
        validate(document)


def test_a_wrong_node_file_is_rejected_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    node = local_node(tmp_path)
    store = BaselineStore(record=True, path=str(path))
    judge_node(node, store, [SEQ], lambda trials: {SEQ.name: [1000.0] * trials})
    store.write(node, node.conn.put)
    node.close()
    baseline = json.loads(path.read_text())
    baseline["figures"][SEQ.name]["value"] = 0
    with pytest.raises(SchemaError, match=r"^gpufleet.baseline/1: \$.figures\['storage."
                                          r"seq_read_mbps'\].value: 0 is less than or equal "):
        validate(baseline)
    inventory = local_inventory(tmp_path)
    state = json.loads(render_state(node_state(
        inventory.hosts["gpu01"], inventory, None, ready=True, reason=None, steps=[],
        peer=None)))
    state["status"] = "drained"
    with pytest.raises(SchemaError, match=r"^gpufleet.node/1: \$.status: 'drained' is not one "):
        validate(state)
    del state["status"]
    with pytest.raises(SchemaError, match=r"^gpufleet.node/1: \$: 'status' is a required "):
        validate(state)


@pytest.mark.parametrize(("document", "message"), [
    ([], r"^not a gpufleet document: no 'schema' string at \$$"),
    ({"hosts": {}}, r"^not a gpufleet document: no 'schema' string at \$$"),
    ({"schema": "gpufleet.common/1"}, r"^\$.schema: no schema 'gpufleet.common/1': gpufleet "
                                      r"ships gpufleet.baseline/1, "),
    ({"schema": "gpufleet.drift/9"}, r"^\$.schema: no schema 'gpufleet.drift/9'"),
])
def test_what_is_no_gpufleet_document_is_named(document: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        validate(document)
    with pytest.raises(SchemaError, match=r"^no schema 'gpufleet.drift/9': gpufleet ships "):
        load("gpufleet.drift/9")


JSON_BLOCK = re.compile(r"^```json\n(?P<text>.*?)^```", re.MULTILINE | re.DOTALL)


def _shown_documents() -> list[tuple[str, dict[str, Any]]]:
    """The JSON examples of the docs that are whole documents (others show a fragment)."""
    shown = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for match in JSON_BLOCK.finditer(path.read_text()):
            if match["text"].startswith('{"schema"') or match["text"].startswith('{\n  "schema"'):
                shown.append((path.name, json.loads(match["text"])))
    return shown


SHOWN = _shown_documents()


def test_the_docs_show_a_document_of_every_report() -> None:
    assert {d["schema"] for _, d in SHOWN} == {
        "gpufleet.facts/1", "gpufleet.provision/1", "gpufleet.drift/1",
        "gpufleet.conformance/1", "gpufleet.bootstrap/1", "gpufleet.baseline/1"}


@pytest.mark.parametrize("document", [d for _, d in SHOWN],
                         ids=[f"{doc}:{d['schema']}" for doc, d in SHOWN])
def test_a_document_the_docs_show_validates(document: dict[str, Any]) -> None:
    validate(document)


OFFLINE_CHECK = """
import os
import socket
import sys


def refuse(*args, **kwargs):
    sys.stderr.write(f"network access attempted: {args[:2]!r}\\n")
    sys.stderr.flush()
    os._exit(99)


socket.getaddrinfo = refuse
socket.create_connection = refuse
socket.socket.connect = refuse
from check_jsonschema import main

sys.argv[0] = "check-jsonschema"
sys.exit(main())
"""


def check_jsonschema(schema: Path, *documents: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema, a generic validator, given one schema file: in a process whose
    every attempt to resolve a name or connect ends it with exit 99, no cache."""
    return subprocess.run([sys.executable, "-c", OFFLINE_CHECK, "--no-cache", "--schemafile",
                           str(schema), *map(str, documents)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_network_guard_catches_a_schema_that_refers_out(tmp_path: Path) -> None:
    schema = tmp_path / "refers.schema.json"
    schema.write_text(json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema",
                                  "$ref": "https://gpufleet.dev/schemas/gpufleet.common/1"}))
    (tmp_path / "doc.json").write_text("{}")
    proc = check_jsonschema(schema, tmp_path / "doc.json")
    assert proc.returncode == 99 and "network access attempted" in proc.stderr


def test_check_jsonschema_validates_every_document_offline_with_its_schema_file_alone(
        written: dict[str, Any], tmp_path: Path) -> None:
    """Each shipped document schema, the only file given, validates the documents gpufleet
    wrote (the reports, a drift history run, the docs' baseline, a node state) without
    reaching for the common schema over the network."""
    inventory = local_inventory(tmp_path)
    node = Node(inventory.hosts["gpu01"], ConnectOptions())
    state = node_state(inventory.hosts["gpu01"], inventory,
                       gather_facts(node.conn, consistency_request(inventory.hosts["gpu01"])),
                       ready=False, reason="preflight: / has 3 GB free", steps=[], peer=None)
    node.close()
    documents = {name: written[name] for name in ("facts", "provision", "drift", "history",
                                                  "conformance", "bootstrap")}
    documents["baseline"] = next(d for _, d in SHOWN if d["schema"] == "gpufleet.baseline/1")
    documents["node"] = json.loads(render_state(state))
    by_schema: dict[str, list[Path]] = {}
    for name, document in documents.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        by_schema.setdefault(document["schema"], []).append(path)
    assert sorted(by_schema) == sorted(DOCUMENTS)
    shipped = Path(str(files("gpufleet").joinpath("schemas")))
    for schema_id, paths in by_schema.items():
        stem = schema_id.split(".")[1].split("/")[0]
        proc = check_jsonschema(shipped / f"{stem}.schema.json", *paths)
        assert proc.returncode == 0, (schema_id, proc.stdout + proc.stderr)
        assert "ok -- validation done" in proc.stdout


def test_each_document_schema_bundles_the_common_schema_as_shipped() -> None:
    """The copy of gpufleet.common/1 in each document schema's $defs is common.schema.json
    itself: an edit of one without the others fails here."""
    common = load(schemas.COMMON)
    for schema_id in DOCUMENTS:
        assert load(schema_id)["$defs"][schemas.COMMON] == common, schema_id
