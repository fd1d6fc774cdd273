"""The pytest plugin behind ``invoke conformance``: inventory-driven nodes, a per-host
PASS / FAIL / SKIP summary with reasons, and a JSON report.

Checks that take a ``node`` argument run once per selected host, on every host at once
(``gpufleet.conformance.parallel``); checks without it run once for the fleet
(reachability matrix, multi-node AllReduce).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet.conformance.baseline import BASELINE_FILE, BaselineStore
from gpufleet.conformance.launch import cleanup_active
from gpufleet.conformance.parallel import FleetParallel, NodeRun, replay
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.fleet import DEFAULT_FORKS, FleetOptions, host_timeout
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.report.jsonfile import envelope, write_json
from gpufleet.report.terminal import plain
from gpufleet.slurm import inventory as slurm_inventory
from gpufleet.slurm.drain import slurm_client
from gpufleet.slurm.launcher import Allocation
from gpufleet.target import load_source

FLEET = "fleet"
CONFORMANCE_TIMEOUT_S = 3600.0
SESSION_KEY = pytest.StashKey[ConformanceSession]()
ALLOCATION_KEY = pytest.StashKey[Allocation]()
LAUNCHERS = ("ssh", "slurm")
RESULTS_KEY = pytest.StashKey[list["Result"]]()
PARALLEL_KEY = pytest.StashKey[FleetParallel]()
RUN_KEY = pytest.StashKey[NodeRun]()
BASELINES_KEY = pytest.StashKey[dict[str, dict[str, Any]]]()


@dataclass
class Result:
    """One check's outcome on one host (or on the fleet)."""

    suite: str
    check: str
    host: str
    outcome: str  # pass | fail | skip
    message: str
    duration: float
    properties: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "check": self.check, "host": self.host,
                "outcome": self.outcome, "message": self.message,
                "duration_s": round(self.duration, 3), "properties": self.properties}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpufleet", "gpufleet conformance")
    group.addoption("--gpufleet-inventory", help="inventory name or path")
    group.addoption("--gpufleet-limit", default=None, help="Ansible host pattern")
    group.addoption("--gpufleet-pairs", default="auto",
                    help="reachability pairs: auto, all, ring or sample:K")
    group.addoption("--gpufleet-with-nccl-tests", action="store_true",
                    help="also run nccl-tests' all_reduce_perf where installed")
    group.addoption("--gpufleet-json", default=None, help="write the JSON report here")
    group.addoption("--gpufleet-artifacts", default=None,
                    help="directory for plots and CSV files (default: beside the JSON report)")
    group.addoption("--gpufleet-forks", type=int, default=DEFAULT_FORKS)
    group.addoption("--gpufleet-connect-timeout", type=float, default=10.0)
    group.addoption("--gpufleet-timeout", type=float, default=None,
                    help="seconds each node may take for the whole run")
    group.addoption("--gpufleet-record-baseline", action="store_true",
                    help=f"record each passing node's figures in {BASELINE_FILE} on the node")
    group.addoption("--gpufleet-compare-baseline", action="store_true",
                    help="gate figures at max(floor, baseline_fraction x the node's baseline)")
    group.addoption("--gpufleet-launcher", choices=LAUNCHERS, default="ssh",
                    help="reach nodes by SSH, or as steps of a Slurm allocation")
    group.addoption("--gpufleet-partition", default=None,
                    help="with --gpufleet-launcher slurm: the partition to allocate from")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[RESULTS_KEY] = []
    config.addinivalue_line("markers", "fleet: a check that runs once for the whole selection")


def _session(config: pytest.Config) -> ConformanceSession:
    if SESSION_KEY not in config.stash:
        name = config.getoption("gpufleet_inventory")
        if not name:
            raise pytest.UsageError("conformance checks need --gpufleet-inventory")
        inventory = load_source(name)
        hosts = inventory.select(config.getoption("gpufleet_limit"))
        if not hosts:
            raise pytest.UsageError("--gpufleet-limit selects no host")
        fleet = FleetOptions(forks=config.getoption("gpufleet_forks"),
                             host_timeout=config.getoption("gpufleet_timeout"),
                             default_timeout=CONFORMANCE_TIMEOUT_S, connect=ConnectOptions(
                                 connect_timeout=config.getoption("gpufleet_connect_timeout"),
                                 known_hosts_base=inventory.base))
        if config.getoption("gpufleet_launcher") == "slurm":
            allocation = _allocate(config, name, hosts, fleet)
            config.stash[ALLOCATION_KEY] = allocation
            fleet.connector = allocation.connect
        json_path = config.getoption("gpufleet_json")
        artifacts = config.getoption("gpufleet_artifacts") or (
            str(Path(json_path).resolve().parent / "conformance-artifacts") if json_path
            else "reports/conformance-artifacts")
        config.stash[SESSION_KEY] = ConformanceSession.start(inventory, hosts, fleet, {
            "artifacts": Path(artifacts),
            "pairs": config.getoption("gpufleet_pairs"),
            "with_nccl_tests": config.getoption("gpufleet_with_nccl_tests"),
            "fleet": fleet, "baseline": _baseline_store(config)})
        if ALLOCATION_KEY in config.stash:
            allocation = config.stash[ALLOCATION_KEY]
            config.stash[SESSION_KEY].add_report("launcher", "slurm", {
                "job_id": allocation.job_id, "left_out": allocation.left_out,
                "nodes": {h: n.name for h, n in allocation.nodes.items()}})
    return config.stash[SESSION_KEY]


def _allocate(config: pytest.Config, name: str, hosts: list[Host], fleet: FleetOptions
              ) -> Allocation:
    """The run's Slurm allocation: the partition given, else the ``slurm:`` inventory's."""
    partition = config.getoption("gpufleet_partition") or (
        slurm_inventory.parse_source(name)[0] if slurm_inventory.is_slurm_source(name)
        else None)
    try:
        longest = max(host_timeout(h, fleet) for h in hosts)
        return Allocation.open(hosts, slurm_client(hosts[0]), partition=partition,
                               time_limit_s=longest)
    except GpufleetError as exc:
        raise pytest.UsageError(f"--launcher slurm: {exc}") from None


def _baseline_store(config: pytest.Config) -> BaselineStore | None:
    record = bool(config.getoption("gpufleet_record_baseline"))
    compare = bool(config.getoption("gpufleet_compare_baseline"))
    return BaselineStore(record=record, compare=compare) if record or compare else None


def baselines(state: ConformanceSession, results: list[Result]) -> dict[str, dict[str, Any]]:
    """Per node: the trend of its figures against its baseline (comparing), and whether its
    figures were recorded (recording: only on a node that failed no check)."""
    store = state.options.get("baseline")
    if not isinstance(store, BaselineStore):
        return {}
    out = {}
    for name in store.measured_nodes():
        node = state.nodes[name]
        entry = store.trend(node) if store.compare else {}
        if store.record:
            failed = sum(r.outcome == "fail" for r in results if r.host == name)
            if failed:
                entry["recorded"] = f"not recorded: {failed} check(s) failed"
            else:
                try:
                    entry["recorded"] = store.write(node, node.conn.put)
                except GpufleetError as exc:
                    entry["recorded"] = f"not recorded: {exc}"
        out[name] = entry
    return out


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "node" in metafunc.fixturenames:
        names = list(_session(metafunc.config).nodes)
        metafunc.parametrize("node", names, ids=names, indirect=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    parallel = FleetParallel(lambda name: _session(config).nodes[name],
                             config.getoption("gpufleet_forks"))
    parallel.collect(session.items)
    config.stash[PARALLEL_KEY] = parallel


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A per-node check's item reports its node's share of the group's concurrent run."""
    parallel = pyfuncitem.config.stash.get(PARALLEL_KEY, None)
    run = parallel.run(pyfuncitem) if parallel is not None else None
    if run is None:
        return None
    pyfuncitem.stash[RUN_KEY] = run
    replay(pyfuncitem, run)
    return True


@pytest.fixture(scope="session")
def conformance(request: pytest.FixtureRequest) -> ConformanceSession:
    """The run's nodes, options and report."""
    return _session(request.config)


@pytest.fixture
def node(request: pytest.FixtureRequest, conformance: ConformanceSession) -> Node:
    """One selected node; a node whose facts could not be gathered fails every check."""
    selected = conformance.nodes[request.param]
    if selected.facts is None:
        pytest.fail(f"unreachable or facts failed: {selected.error}")
    return selected


def _message(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        text = getattr(crash, "message", None) or str(report.longrepr)
        first = text.strip().splitlines()[0] if text.strip() else ""
        return first.removeprefix("Failed: ").removeprefix("AssertionError: ").strip()
    return ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, Any, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.when == "call" and RUN_KEY in item.stash:
        report.duration = item.stash[RUN_KEY].duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        callspec = getattr(item, "callspec", None)
        host = callspec.params.get("node", FLEET) if callspec else FLEET
        module = getattr(item, "module", None)
        suite = module.__name__.rsplit(".", 1)[-1].removeprefix("test_") if module else "?"
        check = getattr(item, "originalname", item.name)
        others = {k: v for k, v in (callspec.params.items() if callspec else ()) if k != "node"}
        if others:  # a check parametrised beyond the node: test_role_converged[driver]
            check += f"[{'-'.join(str(v) for v in others.values())}]"
        state = "pass" if report.passed else "skip" if report.skipped else "fail"
        item.config.stash[RESULTS_KEY].append(Result(
            suite, check, host, state, _message(report), report.duration,
            dict(report.user_properties)))


def host_summary(results: list[Result]) -> dict[str, dict[str, Any]]:
    """Per host: PASS / FAIL / SKIP and counts (a host fails when any of its checks fails);
    checks that run once for the whole selection are counted under ``fleet``."""
    summary: dict[str, dict[str, Any]] = {}
    for r in results:
        entry = summary.setdefault(r.host, {"pass": 0, "fail": 0, "skip": 0})
        entry[r.outcome] += 1
    for entry in summary.values():
        entry["status"] = "FAIL" if entry["fail"] else ("PASS" if entry["pass"] else "SKIP")
    return summary


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    results = config.stash.get(RESULTS_KEY, [])
    if not results:
        return
    tr = terminalreporter
    tr.section("gpufleet conformance")
    summary = host_summary(results)
    width = max(len(plain(h)) for h in summary)
    for host, entry in summary.items():
        color = {"PASS": {"green": True}, "FAIL": {"red": True}, "SKIP": {"yellow": True}}
        tr.write_line(f"{plain(host):<{width}}  {entry['status']:<4}  {entry['pass']} passed, "
                      f"{entry['fail']} failed, {entry['skip']} skipped",
                      **color[entry["status"]])
        skips: dict[str, list[str]] = {}
        for r in results:
            if r.host != host:
                continue
            if r.outcome == "fail":
                tr.write_line(f"{'':<{width}}    FAIL {plain(r.suite)}/{plain(r.check)}: "
                              f"{plain(r.message)}", red=True)
            elif r.outcome == "skip":
                skips.setdefault(r.message, []).append(f"{r.suite}/{r.check}")
        for reason, checks in skips.items():
            tr.write_line(f"{'':<{width}}    SKIP {plain(', '.join(checks))}: {plain(reason)}")
        for line in trend_lines(config.stash.get(BASELINES_KEY, {}).get(host)):
            tr.write_line(f"{'':<{width}}    {plain(line)}")


def trend_lines(entry: dict[str, Any] | None) -> list[str]:
    """A node's baseline trend and recording, as terminal lines."""
    if not entry:
        return []
    lines = [f"BASELINE {entry['fallback']}"] if entry.get("fallback") else []
    for name, f in entry.get("figures", {}).items():
        if f.get("baseline"):
            unit = f" {f['unit']}" if f["unit"] else ""
            lines.append(f"TREND {name}: {f['now']:.4g}{unit} now vs baseline "
                         f"{f['baseline']:.4g} ({f['ratio']:.2f}x)")
    if entry.get("recorded"):
        lines.append(f"BASELINE {entry['recorded']}")
    return lines


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    path = config.getoption("gpufleet_json", None)
    state = config.stash.get(SESSION_KEY, None)
    results = config.stash.get(RESULTS_KEY, [])
    config.stash[BASELINES_KEY] = baselines(state, results) if state else {}
    if path:
        write_json(path, envelope(
            "gpufleet.conformance/1",
            inventory=str(state.inventory.path) if state else None,
            finished_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            hosts=host_summary(results),
            results=[r.to_dict() for r in results],
            baselines=config.stash[BASELINES_KEY],
            data=state.report if state else {}))
    if state:
        cleanup_active()
        state.close()
    allocation = config.stash.get(ALLOCATION_KEY, None)
    if allocation is not None:
        allocation.release()
