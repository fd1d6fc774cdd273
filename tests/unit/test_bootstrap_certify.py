"""Bootstrap's certify verdict: a node is certified only when every conformance run completed,
nothing failed and each required suite passed at least one check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.bootstrap import Certifier, certify, required_suites
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import Facts
from gpufleet.inventory.model import Host


def result(suite: str, outcome: str, host: str = "gpu17", check: str = "test_x") -> dict[str, Any]:
    return {"suite": suite, "check": check, "host": host, "outcome": outcome, "message": ""}


class FakeConformance:
    """Answers each run with an exit code and the results it writes (None: no report)."""

    def __init__(self, *answers: tuple[int, list[dict[str, Any]] | None]) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []

    def __call__(self, inventory: str, **kwargs: Any) -> int:
        self.calls.append(kwargs)
        code, results = self.answers.pop(0)
        if results is not None:
            Path(kwargs["json_path"]).write_text(json.dumps({"hosts": {}, "results": results}))
        return code


def certifier(tmp_path: Path, fake: FakeConformance) -> Certifier:
    return Certifier(fake, "lab", tmp_path)


def test_every_required_suite_passing_certifies(tmp_path: Path) -> None:
    fake = FakeConformance(
        (0, [result("stack", "pass"), result("allreduce", "pass"), result("gpu", "skip")]),
        (0, [result("storage", "pass"), result("thermal", "skip")]),
        (0, [result("reachability", "pass"), result("allreduce", "pass")]))
    detail, data = certify(certifier(tmp_path, fake), "gpu17", "gpu03", ["stack", "allreduce"])
    assert detail == "5 checks passed with peer gpu03"
    assert data["conformance"]["local"] == {"pass": 2, "fail": 0, "skip": 1}
    assert data["conformance"]["baseline"] == {"pass": 1, "fail": 0, "skip": 1}
    assert [c["limit"] for c in fake.calls] == ["gpu17", "gpu17", "gpu03:gpu17"]
    # the node-local and the performance suites record the node's baseline; the pair does not
    assert [c["suites"] for c in fake.calls] == ["stack,firewall,gpu,rdma,allreduce",
                                                 "ddp,p2p,storage,thermal",
                                                 "reachability,allreduce"]
    assert [c.get("record_baseline", False) for c in fake.calls] == [True, True, False]


def test_a_collection_error_never_certifies(tmp_path: Path) -> None:
    fake = FakeConformance((2, None))
    with pytest.raises(GpufleetError, match=r"^the stack,firewall,gpu,rdma,allreduce suites did "
                                            r"not run \(conformance exit 2\)$"):
        certify(certifier(tmp_path, fake), "gpu17", None, ["stack"])


def test_a_run_that_did_not_complete_never_certifies(tmp_path: Path) -> None:
    fake = FakeConformance((3, [result("stack", "pass")]))
    with pytest.raises(GpufleetError, match=r"did not complete \(conformance exit 3\)"):
        certify(certifier(tmp_path, fake), "gpu17", None, ["stack"])


def test_zero_checks_passed_never_certifies(tmp_path: Path) -> None:
    fake = FakeConformance((0, [result("stack", "skip"), result("allreduce", "pass")]))
    with pytest.raises(GpufleetError, match=r"^required suite\(s\) stack passed no check"):
        certify(certifier(tmp_path, fake), "gpu17", None, ["stack", "allreduce"])


def test_a_failed_check_is_named(tmp_path: Path) -> None:
    fake = FakeConformance((1, [result("gpu", "fail", check="test_health")]))
    with pytest.raises(GpufleetError, match=r"^gpu/test_health on gpu17: $"):
        certify(certifier(tmp_path, fake), "gpu17", None, [])


def test_required_suites_follow_the_hardware_and_the_inventory() -> None:
    plain = Host("gpu17", {}, frozenset({"all"}))
    facts = Facts("gpu17", values={"pci_gpus": [{"slot": "0000:01:00.0"}], "rdma": [{}]})
    assert required_suites(plain, None) == ["stack", "firewall", "allreduce"]
    assert required_suites(plain, facts) == ["stack", "firewall", "allreduce", "gpu", "rdma"]
    pinned = Host("gpu17", {"bootstrap_required_suites": "stack,gpu"}, frozenset({"all"}))
    assert required_suites(pinned, None) == ["stack", "gpu"]
    wrong = Host("gpu17", {"bootstrap_required_suites": ["stack", "ddp"]}, frozenset({"all"}))
    with pytest.raises(GpufleetError, match=r"bootstrap_required_suites names ddp; the "
                                            "node-local suites are"):
        required_suites(wrong, None)
