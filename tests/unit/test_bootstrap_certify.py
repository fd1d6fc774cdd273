"""Bootstrap's certify verdict: a node is certified only when every conformance run completed,
nothing failed and each required suite passed at least one check. The runner is replaced by
one that answers with typed reports; what bootstrap asked it for is checked too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet import exitcodes
from gpufleet.bootstrap import Certifier, certify, required_suites
from gpufleet.conformance import registry
from gpufleet.conformance.options import ConformanceOptions
from gpufleet.conformance.results import ConformanceReport, Result
from gpufleet.conformance.runner import RunIncomplete
from gpufleet.connect.fleet import FleetOptions
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import Facts
from gpufleet.inventory.load import load_inventory
from gpufleet.inventory.model import Host
from gpufleet.inventory.target import Target
from tests.unit.test_cli import LOCAL, gpufleet, one_line


def result(suite: str, outcome: str, host: str = "gpu17", check: str = "test_x") -> Result:
    return Result(suite, check, host, outcome, "", 0.1, {})


class FakeRunner:
    """Answers each run with the results given (an exception is raised instead)."""

    def __init__(self, *answers: list[Result] | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[str], ConformanceOptions]] = []

    def __call__(self, target: Target, options: ConformanceOptions) -> ConformanceReport:
        self.calls.append(([h.name for h in target.hosts], options))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return ConformanceReport("inv", "0" * 64, 0.0, 1.0, answer)


def certifier(tmp_path: Path, fake: FakeRunner) -> Certifier:
    hosts = tmp_path / "hosts.yml"
    hosts.write_text("all:\n  hosts:\n    gpu03:\n    gpu17:\n")
    return Certifier(load_inventory(hosts), FleetOptions(), "lab", run_suites=fake)


def test_every_required_suite_passing_certifies(tmp_path: Path) -> None:
    fake = FakeRunner(
        [result("stack", "pass"), result("allreduce", "pass"), result("gpu", "skip"),
         result("storage", "pass"), result("thermal", "skip")],
        [result("reachability", "pass"), result("allreduce", "pass")])
    detail, data = certify(certifier(tmp_path, fake), "gpu17", "gpu03", ["stack", "allreduce"])
    assert detail == "5 checks passed with peer gpu03"
    assert data["conformance"]["node"] == {"pass": 3, "fail": 0, "skip": 2}
    assert data["conformance"]["pair"] == {"pass": 2, "fail": 0, "skip": 0}
    (alone, node_run), (pair, pair_run) = fake.calls
    assert (alone, pair) == (["gpu17"], ["gpu03", "gpu17"])
    # every suite bootstrap runs comes from the registry, with the node's baseline recorded
    assert node_run.suites == ("stack", "firewall", "allreduce", "rdma", "gpu", "ddp",
                               "thermal", "storage", "bmc", "p2p")
    assert pair_run.suites == ("reachability", "allreduce")
    assert (node_run.record_baseline, pair_run.record_baseline) == (True, False)
    assert (node_run.source, node_run.fleet) == ("lab", FleetOptions())


def test_the_node_run_keeps_node_local_checks_and_the_pair_run_the_peer_checks(
        tmp_path: Path) -> None:
    fake = FakeRunner([result("stack", "pass")], [result("reachability", "pass"),
                                                 result("allreduce", "pass")])
    certify(certifier(tmp_path, fake), "gpu17", "gpu03", ["stack"])
    (_, node_run), (_, pair_run) = fake.calls
    assert node_run.only is not None and pair_run.only is not None
    allreduce, stack = registry.suite("allreduce"), registry.suite("stack")
    assert node_run.only(allreduce, "test_each_node_alone")
    assert not node_run.only(allreduce, "test_all_nodes_together")
    assert not node_run.only(stack, "test_versions_agree_within_each_group")
    assert pair_run.only(allreduce, "test_all_nodes_together")
    assert not pair_run.only(allreduce, "test_each_node_alone")
    assert pair_run.only(registry.suite("reachability"), "test_reachable_from_the_cluster")


def test_a_run_that_did_not_complete_never_certifies(tmp_path: Path) -> None:
    fake = FakeRunner(RunIncomplete("the conformance run could not complete (pytest exit 2)"))
    with pytest.raises(GpufleetError, match=r"^the stack,firewall,.* suites did not complete: "
                                            r"the conformance run could not complete"):
        certify(certifier(tmp_path, fake), "gpu17", None, ["stack"])


def test_zero_checks_passed_never_certifies(tmp_path: Path) -> None:
    fake = FakeRunner([result("stack", "skip"), result("allreduce", "pass")])
    with pytest.raises(GpufleetError, match=r"^required suite\(s\) stack passed no check"):
        certify(certifier(tmp_path, fake), "gpu17", None, ["stack", "allreduce"])


def test_a_failed_check_is_named(tmp_path: Path) -> None:
    fake = FakeRunner([result("gpu", "fail", check="test_health")])
    with pytest.raises(GpufleetError, match=r"^gpu/test_health on gpu17: $"):
        certify(certifier(tmp_path, fake), "gpu17", None, [])


def test_required_suites_follow_the_hardware_and_the_inventory() -> None:
    plain = Host("gpu17", {}, frozenset({"all"}))
    facts = Facts("gpu17", values={"pci_gpus": [{"slot": "0000:01:00.0"}], "rdma": [{}]})
    assert required_suites(plain, None) == ["stack", "firewall", "allreduce"]
    assert required_suites(plain, facts) == ["stack", "firewall", "allreduce", "rdma", "gpu"]
    pinned = Host("gpu17", {"bootstrap_required_suites": "stack,gpu"}, frozenset({"all"}))
    assert required_suites(pinned, None) == ["stack", "gpu"]
    wrong = Host("gpu17", {"bootstrap_required_suites": ["stack", "ddp"]}, frozenset({"all"}))
    with pytest.raises(GpufleetError, match=r"bootstrap_required_suites names ddp; the "
                                            "suites bootstrap can require are stack, firewall, "
                                            "allreduce, rdma, gpu"):
        required_suites(wrong, None)


# The suites pytest collects, moved to a directory given by the environment (one of them
# broken there), then the command; the node-changing steps of bootstrap stand in.
BROKEN_SUITES = """
import os, sys
from pathlib import Path
from gpufleet import bootstrap, cli
from gpufleet.conformance import registry
registry.suites_dir = lambda: Path(os.environ["BROKEN_SUITES"])
for step in ("preflight", "provision_node", "admit", "mark"):
    setattr(bootstrap, step, lambda *args: ("stood in", {}))
sys.argv = ["gpufleet", *sys.argv[1:]]
cli.main()
"""


def broken_suites(tmp_path: Path, suite: str, source: str) -> dict[str, str]:
    """A copy of the installed suites in which ``suite`` is ``source``."""
    copy = tmp_path / "suites"
    shutil.copytree(registry.suites_dir(), copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    (copy / suite).write_text(source)
    return {"BROKEN_SUITES": str(copy)}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    (tmp_path / "hosts.yml").write_text(LOCAL)
    return tmp_path / "work"


def test_a_suite_pytest_cannot_collect_is_an_internal_error_not_an_interruption(
        work: Path, tmp_path: Path) -> None:
    env = broken_suites(tmp_path, "test_stack.py", "def test_versions(:\n    pass\n")
    done = gpufleet("conformance", "-i", "../hosts.yml", "--suite", "stack", cwd=work,
                    env=env, code=BROKEN_SUITES)
    assert done.returncode == exitcodes.INTERNAL == 70, done.stderr
    line = one_line(done.stderr)
    assert line == (f"error: the conformance suites could not be collected: "
                    f"{tmp_path / 'suites' / 'test_stack.py'}: SyntaxError: invalid syntax "
                    "(line 1)")


def test_bootstrap_certifies_nothing_and_exits_70_when_a_suite_cannot_be_collected(
        work: Path, tmp_path: Path) -> None:
    env = broken_suites(tmp_path, "test_gpu.py", "import gpufleet.no_such_module\n")
    done = gpufleet("bootstrap", "-i", "../hosts.yml", "--host", "here", cwd=work, env=env,
                    code=BROKEN_SUITES)
    assert done.returncode == exitcodes.INTERNAL == 70, done.stdout + done.stderr
    assert "interrupted" not in done.stdout + done.stderr
    certify_line = next(line for line in done.stdout.splitlines()
                        if line.strip().startswith("certify"))
    assert "failed" in certify_line
    assert (f"{tmp_path / 'suites' / 'test_gpu.py'}: ModuleNotFoundError: No module named "
            "'gpufleet.no_such_module'") in done.stdout
    assert "here: NOT READY" in done.stdout
