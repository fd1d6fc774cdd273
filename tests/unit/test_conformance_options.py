"""The conformance command's flags become one ConformanceOptions, built once: the runner
gets it as the command built it, and the session hands the same value to the suites."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet import app
from gpufleet.conformance.baseline import BaselineStore
from gpufleet.conformance.options import ConformanceOptions
from gpufleet.conformance.results import ConformanceReport
from gpufleet.conformance.session import ConformanceSession
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.target import Target

INVENTORY = "all:\n  hosts:\n    n1:\n      ansible_connection: local\n"


def test_the_flags_reach_the_runner_as_one_typed_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    seen: list[ConformanceOptions] = []

    def run_suites(target: Target, options: ConformanceOptions) -> ConformanceReport:
        seen.append(options)
        return ConformanceReport(str(target.inventory.path), target.inventory.digest(), 0.0)

    monkeypatch.setattr(app, "run_suites", run_suites)
    json_path = tmp_path / "out" / "c.json"
    assert app.conformance_cmd(str(tmp_path / "hosts.yml"), suites="stack,gpu", pairs="ring",
                               record_baseline=True, image="registry.example/train:1",
                               json_path=str(json_path), extra_args=["-k", "x"]) == 0
    options, = seen
    assert options.suites == ("stack", "gpu")
    assert (options.pairs, options.image, options.pytest_args) == (
        "ring", "registry.example/train:1", ("-k", "x"))
    assert options.artifacts == json_path.resolve().parent / "conformance-artifacts"
    assert options.fleet.default_timeout == app.HOST_TIMEOUTS["conformance"]
    assert isinstance(options.baseline, BaselineStore)
    assert (options.baseline.record, options.baseline.compare) == (True, False)


def test_a_run_that_neither_records_nor_compares_has_no_baseline_store() -> None:
    assert ConformanceOptions().baseline is None
    assert ConformanceOptions(compare_baseline=True).baseline is not None


def test_the_session_hands_the_suites_the_options_it_was_given(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    inventory = load_inventory(tmp_path / "hosts.yml")
    options = ConformanceOptions(pairs="all", with_nccl_tests=True)
    session = ConformanceSession.start(inventory, [], options)
    assert session.options is options
