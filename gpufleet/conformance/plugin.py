"""The pytest plugin behind conformance: inventory-driven nodes, a per-host PASS / FAIL /
SKIP summary with reasons, and the results as typed objects.

``run_suites`` (the conformance runner) hands the plugin a started session and reads the
results back. Run directly (``pytest -p gpufleet.conformance.plugin --gpufleet-inventory
NAME``), the plugin loads the inventory, gathers the facts, and writes the JSON report
itself.

Checks that take a ``node`` argument run once per selected host, on every host at once
(``gpufleet.conformance.parallel``); checks without it run once for the fleet
(reachability matrix, multi-node AllReduce).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.conformance.baseline import BASELINE_FILE
from gpufleet.conformance.launch import cleanup_active
from gpufleet.conformance.options import ConformanceOptions
from gpufleet.conformance.parallel import FleetParallel, NodeRun, replay
from gpufleet.conformance.results import FLEET, ConformanceReport, Result, host_summary
from gpufleet.conformance.session import ConformanceSession, Node
from gpufleet.connect.connection import ConnectOptions
from gpufleet.connect.fleet import DEFAULT_FORKS, FleetOptions, host_timeout
from gpufleet.errors import GpufleetError
from gpufleet.inventory.model import Host
from gpufleet.report.jsonfile import write_json
from gpufleet.report.terminal import fold, plain
from gpufleet.slurm import inventory as slurm_inventory
from gpufleet.slurm.drain import slurm_client
from gpufleet.slurm.launcher import Allocation
from gpufleet.sources import load_source

CONFORMANCE_TIMEOUT_S = 3600.0
LAUNCHERS = ("ssh", "slurm")
Selection = Callable[[str, str], bool]


@dataclass
class RunState:
    """One run's session and what its checks found. ``only(suite, check)`` keeps a check;
    ``owned``: the plugin built the session itself (pytest run directly) and ends it."""

    session: ConformanceSession
    only: Selection | None = None
    results: list[Result] = field(default_factory=list)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)
    owned: bool = False
    allocation: Allocation | None = None
    started: float = field(default_factory=time.time)


STATE_KEY = pytest.StashKey[RunState]()
PARALLEL_KEY = pytest.StashKey[FleetParallel]()
RUN_KEY = pytest.StashKey[NodeRun]()


class Supplied:
    """The runner's side of the plugin: a state it started, handed in before collection,
    and the suite files pytest could not collect (pytest ends such a run as "interrupted",
    which the runner must not take for Ctrl-C)."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.uncollected: list[str] = []
        self.root = Path()

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        config.stash[STATE_KEY] = self.state
        self.root = config.rootpath

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            name = str(self.root / report.nodeid) if report.nodeid else "the suites"
            self.uncollected.append(f"{name}: {collection_error(report.longreprtext)}")


def collection_error(text: str) -> str:
    """The one line that says why pytest could not collect a file: the exception it ended
    with, and the line a syntax error is on."""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    last = errors[-1] if errors else next(
        (line.strip() for line in reversed(text.splitlines()) if line.strip()), "no reason given")
    where = next((m.group(1) for line in errors
                  if (m := re.match(r'File ".*", line (\d+)', line))), None)
    return f"{last} (line {where})" if where else last


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
                    help="reach nodes by SSH, or as steps of a Slurm allocation (slurm: node-local "
                         "commands of many nodes in one step; slurm-per-node: a step "
                         "per command)")
    group.addoption("--gpufleet-partition", default=None,
                    help="with --gpufleet-launcher slurm: the partition to allocate from")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fleet: a check that runs once for the whole selection")


def _state(config: pytest.Config) -> RunState:
    """The run's state: the runner's, or one built from the command line (pytest direct)."""
    if STATE_KEY not in config.stash:
        config.stash[STATE_KEY] = _state_from_options(config)
    return config.stash[STATE_KEY]


def _state_from_options(config: pytest.Config) -> RunState:
    name = config.getoption("gpufleet_inventory")
    if not name:
        raise pytest.UsageError("conformance checks need --gpufleet-inventory")
    try:
        inventory = load_source(name)
    except GpufleetError as exc:
        raise pytest.UsageError(str(exc)) from None
    hosts = inventory.select(config.getoption("gpufleet_limit"))
    if not hosts:
        raise pytest.UsageError("--gpufleet-limit selects no host")
    fleet = FleetOptions(forks=config.getoption("gpufleet_forks"),
                         host_timeout=config.getoption("gpufleet_timeout"),
                         default_timeout=CONFORMANCE_TIMEOUT_S, connect=ConnectOptions(
                             connect_timeout=config.getoption("gpufleet_connect_timeout"),
                             known_hosts_base=inventory.base))
    allocation = None
    launcher = config.getoption("gpufleet_launcher")
    if launcher != "ssh":
        partition = config.getoption("gpufleet_partition") or (
            slurm_inventory.parse_source(name)[0] if slurm_inventory.is_slurm_source(name)
            else None)
        try:
            allocation = open_allocation(hosts, fleet, partition,
                                         combine=launcher == "slurm")
        except GpufleetError as exc:
            raise pytest.UsageError(f"--launcher {launcher}: {exc}") from None
    json_path = config.getoption("gpufleet_json")
    artifacts = config.getoption("gpufleet_artifacts") or (
        str(Path(json_path).resolve().parent / "conformance-artifacts") if json_path
        else "reports/conformance-artifacts")
    options = ConformanceOptions(
        pairs=config.getoption("gpufleet_pairs"),
        with_nccl_tests=config.getoption("gpufleet_with_nccl_tests"),
        record_baseline=config.getoption("gpufleet_record_baseline"),
        compare_baseline=config.getoption("gpufleet_compare_baseline"),
        launcher=launcher, partition=config.getoption("gpufleet_partition"), source=name,
        fleet=fleet, artifacts=Path(artifacts))
    session = ConformanceSession.start(inventory, hosts, options)
    if allocation is not None:
        describe_allocation(session, allocation)
    return RunState(session, owned=True, allocation=allocation)


def open_allocation(hosts: list[Host], fleet: FleetOptions, partition: str | None,
                    combine: bool = True) -> Allocation:
    """One Slurm allocation of the selected nodes for the whole run; the fleet's
    connections become job steps in it (node-local commands of many nodes one step
    together when ``combine``)."""
    longest = max(host_timeout(h, fleet) for h in hosts)
    allocation = Allocation.open(hosts, slurm_client(hosts[0]), partition=partition,
                                 time_limit_s=longest, combine=combine)
    fleet.connector = allocation.connect
    return allocation


def describe_allocation(session: ConformanceSession, allocation: Allocation) -> None:
    session.add_report("launcher", "slurm", {
        "job_id": allocation.job_id, "left_out": allocation.left_out,
        "nodes": {h: n.name for h, n in allocation.nodes.items()},
        "combined_steps": allocation.fanout is not None})


def baselines(state: ConformanceSession, results: list[Result]) -> dict[str, dict[str, Any]]:
    """Per node: the trend of its figures against its baseline (comparing), and whether its
    figures were recorded (recording: only on a node that failed no check)."""
    store = state.options.baseline
    if store is None:
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
        names = list(_state(metafunc.config).session.nodes)
        metafunc.parametrize("node", names, ids=names, indirect=True)


def _suite_of(item: pytest.Item) -> str:
    module = getattr(item, "module", None)
    return module.__name__.rsplit(".", 1)[-1].removeprefix("test_") if module else "?"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the checks the runner's selection does not keep."""
    only = _state(config).only
    if only is None:
        return
    kept = [i for i in items if only(_suite_of(i), getattr(i, "originalname", i.name))]
    dropped = [i for i in items if i not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    state = _state(config)
    parallel = FleetParallel(lambda name: state.session.nodes[name], state.session.forks)
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
    return _state(request.config).session


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
        check = getattr(item, "originalname", item.name)
        others = {k: v for k, v in (callspec.params.items() if callspec else ()) if k != "node"}
        if others:  # a check parametrised beyond the node: test_role_converged[driver]
            check += f"[{'-'.join(str(v) for v in others.values())}]"
        state = "pass" if report.passed else "skip" if report.skipped else "fail"
        _state(item.config).results.append(Result(
            _suite_of(item), check, host, state, _message(report), report.duration,
            dict(report.user_properties)))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int,
                            config: pytest.Config) -> None:
    state = config.stash.get(STATE_KEY, None)
    if state is None or not state.results:
        return
    tr = terminalreporter
    tr.section("gpufleet conformance")
    for line, color in summary_lines(state.results, state.baselines):
        tr.write_line(line, **({color: True} if color else {}))


def summary_lines(results: list[Result], trends: dict[str, dict[str, Any]]
                  ) -> list[tuple[str, str | None]]:
    """The per-host summary: status and counts, each failure, skips by reason, trends;
    hosts whose lines are the same are one entry (``node[001-998]``), failing hosts
    first."""
    summary = host_summary(results)
    colors = {"PASS": "green", "FAIL": "red", "SKIP": "yellow"}

    def details(host: str) -> tuple[tuple[str, str | None], ...]:
        lines: list[tuple[str, str | None]] = []
        skips: dict[str, list[str]] = {}
        for r in results:
            if r.host != host:
                continue
            if r.outcome == "fail":
                lines.append((f"FAIL {plain(r.suite)}/{plain(r.check)}: {plain(r.message)}",
                              "red"))
            elif r.outcome == "skip":
                skips.setdefault(r.message, []).append(f"{r.suite}/{r.check}")
        lines += [(f"SKIP {plain(', '.join(c))}: {plain(reason)}", None)
                  for reason, c in skips.items()]
        lines += [(plain(t), None) for t in trend_lines(trends.get(host))]
        entry = summary[host]
        return ((entry["status"], None), (f"{entry['pass']} passed, {entry['fail']} failed, "
                                          f"{entry['skip']} skipped", None), *lines)

    order = {"FAIL": 0, "SKIP": 1, "PASS": 2}
    hosts = sorted(summary, key=lambda h: order[summary[h]["status"]])
    groups = fold(hosts, details)
    width = max(len(plain(h)) for h, _, _ in groups)
    lines: list[tuple[str, str | None]] = []
    for name, ((status, _), (counts, _), *rest), _ in groups:
        lines.append((f"{plain(name):<{width}}  {status:<4}  {counts}", colors[status]))
        lines += [(f"{'':<{width}}    {text}", color) for text, color in rest]
    return lines


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


def report_of(state: RunState, complete: bool) -> ConformanceReport:
    """The run's typed report."""
    session = state.session
    left_out = session.report.get("launcher", {}).get("slurm", {}).get("left_out", {})
    unreachable = {name: str(node.error) for name, node in session.nodes.items()
                   if node.facts is None}
    return ConformanceReport(str(session.inventory.path), session.inventory.digest(),
                             state.started, time.time() - state.started, list(state.results),
                             state.baselines, session.report, complete, dict(left_out),
                             unreachable)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    state = config.stash.get(STATE_KEY, None)
    if state is None:
        return
    state.baselines = baselines(state.session, state.results)
    if not state.owned:
        return
    try:
        path = config.getoption("gpufleet_json", None)
        if path:
            write_json(path, report_of(state, int(exitstatus) in (0, 1)).to_json())
    finally:
        cleanup_active()
        state.session.close()
        if state.allocation is not None:
            state.allocation.release()
