"""Bootstrap a new node to certified-ready: trust its host key explicitly, preflight,
provision, admit it in the cluster's firewalls, certify (node-local suites, then
reachability and a two-node AllReduce with a known-good peer), and mark the node ready or
not ready, with a report of every step."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet import __version__, exitcodes
from gpufleet import roles as role_registry
from gpufleet.conformance import registry
from gpufleet.conformance.baseline import BaselineStore
from gpufleet.conformance.checks import bmc as bmc_checks
from gpufleet.conformance.options import ConformanceOptions
from gpufleet.conformance.registry import Suite
from gpufleet.conformance.results import ConformanceReport, Result, counts
from gpufleet.conformance.runner import RunIncomplete, run_suites
from gpufleet.connect.connection import Budget, Connection, ConnectOptions, Unreachable
from gpufleet.connect.fleet import FleetOptions, Outcome
from gpufleet.connect.fleet import host_timeout as fleet_host_timeout
from gpufleet.connect.open import connect
from gpufleet.connect.ssh import SSHConnection, known_hosts_files
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import Facts, gather_facts
from gpufleet.inventory.model import Host, Inventory
from gpufleet.inventory.target import Target
from gpufleet.provision.engine import (
    HostRun,
    RunOptions,
    provision,
    validate,
)
from gpufleet.provision.plan import ApplyOptions
from gpufleet.provision.role import Role, RoleVars, Var
from gpufleet.report.jsonfile import BadJson, envelope, opening, read_json
from gpufleet.roles import comparable, consistency_request
from gpufleet.slurm import drain
from gpufleet.slurm.client import RunFindings

STATE_FILE = "/etc/gpufleet/node.json"
NODE_SCHEMA = "gpufleet.node/1"
STAMPS = frozenset({"generated_at", "marked_at"})  # node.json's times, not its state
SUPPORTED_OS = ["ubuntu:22.04", "ubuntu:24.04", "debian:12"]
BOOTSTRAP_TIMEOUT_S = 7200.0
HOOK_TIMEOUT_S = 300.0
PEER_READ_TIMEOUT_S = 60.0


@dataclass
class StepResult:
    """One bootstrap step: ok, failed or skipped, with what it found and how long it took."""

    name: str
    status: str
    detail: str
    duration: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)
    unreachable: bool = False
    internal: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.name, "status": self.status, "detail": self.detail,
                "duration_s": round(self.duration, 3), "data": self.data,
                "unreachable": self.unreachable}


@dataclass
class BootstrapOptions:
    """What the user asked for."""

    host: str
    peer: str | None = None
    expect_fingerprint: str | None = None
    reboot: bool = False
    recertify: bool = False
    report_dir: Path = field(default_factory=lambda: Path("reports/bootstrap"))
    connect_timeout: float = 10.0
    timeout: float | None = None


@dataclass
class Bootstrap:
    """Everything one bootstrap run did; ``reports`` are the certify step's conformance
    runs (for the acceptance report; the JSON document keeps their counts)."""

    host: str
    steps: list[StepResult] = field(default_factory=list)
    ready: bool = False
    reason: str | None = None
    passed_checks: list[str] = field(default_factory=list)
    reports: list[ConformanceReport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ready": self.ready, "reason": self.reason,
                "steps": [s.to_dict() for s in self.steps]}

    def summary(self) -> dict[str, int]:
        """Steps run, and how many ended ok, failed and skipped."""
        counts = {status: sum(s.status == status for s in self.steps)
                  for status in ("ok", "failed", "skipped")}
        return {"steps": len(self.steps), **counts}

    def to_json(self, inventory: Inventory, duration: float) -> dict[str, Any]:
        """The bootstrap report document (schema gpufleet.bootstrap/1)."""
        return envelope("gpufleet.bootstrap/1", inventory=str(inventory.path),
                        inventory_digest=inventory.digest(), duration_s=duration,
                        summary=self.summary(), **self.to_dict())

    @property
    def exit_code(self) -> int:
        if self.ready:
            return exitcodes.OK
        if any(s.internal for s in self.steps):  # gpufleet could not judge the node
            return exitcodes.INTERNAL
        if any(s.unreachable for s in self.steps):
            return exitcodes.UNREACHABLE
        return exitcodes.FAILED


class StepFailure(GpufleetError):
    """A step failed; the node is marked not ready with this reason."""


class AlreadyCertified(GpufleetError):
    """Not a failure: the node is certified ready for this inventory and stack."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.data = data


class NodeUnreachable(Unreachable):
    """The node could not be reached during a step; the report's exit code is 3."""


def _timed(run: Bootstrap, name: str, func: Callable[[], tuple[str, dict[str, Any]]]) -> None:
    """Run one step; record it; raise StepFailure when it fails."""
    start = time.monotonic()
    try:
        detail, data = func()
    except AlreadyCertified as done:
        run.steps.append(StepResult(name, "skipped", str(done), time.monotonic() - start,
                                    done.data))
        return
    except GpufleetError as exc:
        run.steps.append(StepResult(name, "failed", str(exc), time.monotonic() - start,
                                    unreachable=isinstance(exc, Unreachable),
                                    internal=exc.exit_code == exitcodes.INTERNAL))
        raise StepFailure(f"{name}: {exc}") from exc
    run.steps.append(StepResult(name, "ok", detail, time.monotonic() - start, data))


# ---- 1. trust on first use, explicitly ----------------------------------------------------

def trust(host: Host, base: Path, options: BootstrapOptions) -> tuple[str, dict[str, Any]]:
    """Connect accepting an unknown key (recorded to the inventory's known_hosts), but only
    if it matches --expect-fingerprint when given; a recorded key that differs is refused."""
    if host.connection == "local":
        return "local connection: no host key", {}
    known = known_hosts_files(host, base)
    conn = SSHConnection(host, ConnectOptions(
        connect_timeout=options.connect_timeout, accept_new_host_keys=True,
        expect_fingerprint=options.expect_fingerprint, known_hosts_base=base))
    try:
        conn.connect()
        key_type, fp = conn.host_key()
    finally:
        conn.close()
    if options.expect_fingerprint and fp != options.expect_fingerprint:
        raise GpufleetError(f"host key of {host.address} is {key_type} {fp}, not the expected "
                            f"{options.expect_fingerprint}; refusing to continue")
    how = f"newly recorded in {known[0]}" if conn.accepted_fingerprint else "already known"
    return f"{key_type} {fp} ({how})", {"fingerprint": fp, "recorded": bool(
        conn.accepted_fingerprint)}


# ---- 2. preflight --------------------------------------------------------------------------

VARIABLES = {
    "bootstrap_supported_os": Var(SUPPORTED_OS, "list", "OS:VERSION the node may run"),
    "bootstrap_min_free_gb": Var(20, "number", "free space on / needed"),
    "bootstrap_max_clock_skew_s": Var(2.0, "number", "clock skew allowed without NTP status"),
    "bootstrap_required_suites": Var(None, "list", "suites that must each pass a check"),
    "nvidia_driver_dkms": Var(True, "boolean", "the driver builds with DKMS"),
    "nvidia_driver_install": Var("apt", "string", "apt or preinstalled"),
    "gpu_count": Var(None, "integer", "GPUs the node must have"),
}


def bootstrap_vars(host: Host) -> RoleVars:
    """The host's bootstrap variables over their defaults, each checked (VarError names the
    host, the variable and where it is set)."""
    v = RoleVars(host, {key: var.default for key, var in VARIABLES.items()})
    for key, var in VARIABLES.items():
        if v.get(key) is not None:
            v.checked(key, var.kind)
    return v


def preflight_problems(facts: Facts, host: Host, controller_clock: float) -> list[str]:
    """Why the node cannot take the stack yet (empty when it can)."""
    v = bootstrap_vars(host)
    problems = []
    release = facts.get("os_release") or {}
    os_id = f"{release.get('ID', '?')}:{release.get('VERSION_ID', '?')}"
    supported = [str(s) for s in v.items("bootstrap_supported_os")]
    if os_id not in supported:
        problems.append(f"OS {os_id} is not supported ({', '.join(supported)})")
    min_free = v.number("bootstrap_min_free_gb")
    free = (facts.get("disk_free") or {}).get("/")
    if free is None:
        problems.append(f"free disk space unknown: {facts.why_absent('disk_free')}")
    elif free < min_free * 1e9:
        problems.append(f"{free / 1e9:.1f} GB free on /, need {min_free:g} GB")
    if v.boolean("nvidia_driver_dkms") and "nvidia_driver_version" in v \
            and v.string("nvidia_driver_install") != "preinstalled" \
            and not facts.get("kernel_headers"):
        problems.append(f"kernel headers for {facts.get('kernel')} are missing (the driver's "
                        "DKMS module cannot build)")
    wanted = None if v.get("gpu_count") is None else v.integer("gpu_count")
    on_bus = facts.get("pci_gpus")
    if wanted is not None and on_bus is not None and len(on_bus) != wanted:
        problems.append(f"{len(on_bus)} NVIDIA GPUs on the PCI bus, inventory expects {wanted}")
    synced = (facts.get("time_sync") or {}).get("synchronised")
    skew = abs(float(facts.get("clock") or controller_clock) - controller_clock)
    max_skew = v.number("bootstrap_max_clock_skew_s")
    if synced is False:
        problems.append("the clock is not synchronised (NTP reports unsynchronised)")
    elif skew > max_skew:
        problems.append(f"the clock is {skew:.1f}s off the controller's (max {max_skew:g}s)")
    return problems


def preflight(conn: Connection, host: Host, seen: dict[str, Facts]) -> tuple[str, dict[str, Any]]:
    """One facts round trip and the checks on it; the facts are kept in ``seen``."""
    before = time.time()
    facts = gather_facts(conn, role_registry.host_request(host))
    seen["preflight"] = facts
    controller = (before + time.time()) / 2
    problems = preflight_problems(facts, host, controller)
    if problems:
        raise GpufleetError("; ".join(problems))
    release = (facts.get("os_release") or {}).get("PRETTY_NAME")
    return (f"{release}, kernel {facts.get('kernel')}, "
            f"{len(facts.get('pci_gpus') or [])} GPU(s) on the PCI bus"), {}


# ---- 3. provision --------------------------------------------------------------------------

def provision_node(inventory: Inventory, host: Host, fleet: FleetOptions, reboot: bool
                   ) -> tuple[str, dict[str, Any]]:
    """Apply every role, rebooting when asked, then re-check that nothing is left to do."""
    applied = provision(inventory, [host], role_registry.ALL,
                        RunOptions(apply=ApplyOptions(reboot=reboot), fleet=fleet,
                                   command=f"bootstrap of {host.name}"))[host.name]
    if applied.status == "unreachable":
        raise NodeUnreachable(str(applied.error))
    if applied.status == "failed":
        raise GpufleetError(str(applied.error))
    run = applied.value
    if run and run.reboot_pending:
        raise GpufleetError(f"reboot required ({run.reboot_pending}); run bootstrap with "
                            "--reboot")
    check = provision(inventory, [host], role_registry.ALL, RunOptions(check=True, fleet=fleet))
    left = check[host.name]
    if left.status == "unreachable":
        raise NodeUnreachable(str(left.error))
    plan = left.value.plan if left.value else None
    if left.status == "failed" or (plan and plan.applicable):  # manual ones: certify's to judge
        items = [c.item for c in plan.applicable] if plan else [str(left.error)]
        raise GpufleetError(f"not converged after provisioning: {', '.join(items)}")
    changes = [c.item for c in (run.applied if run else [])]
    manual = [c.item for c in plan.changes if c.manual] if plan else []
    detail = f"{len(changes)} change(s) applied" + (", rebooted" if run and run.rebooted else "") \
        + (f"; left to an operator: {', '.join(manual)}" if manual else "")
    return detail, {"applied": changes}


# ---- 4. admit: the cluster's firewalls must let the new node in ---------------------------

def admit(inventory: Inventory, host: Host, peer: str | None, fleet: FleetOptions
          ) -> tuple[str, dict[str, Any]]:
    """Re-apply, on the other hosts of the group, every role that must admit a new member
    (the firewall: the rendezvous port and NCCL's range for the new node), where gpufleet
    already applied it (the peer, when it is one of them, must succeed). Hosts where the
    role was never applied are left alone: bootstrapping one node never firewalls another."""
    details: list[str] = []
    data: dict[str, Any] = {"updated": [], "unmanaged": [], "not_updated": {}}
    for role in role_registry.ALL:
        group = role.admits_members(RoleVars(host, role.defaults))
        if group is None:
            continue
        detail, found = _admit_with(role, inventory, host, group, peer, fleet=fleet)
        details.append(detail)
        data["updated"] += found["updated"]
        data["unmanaged"] += found["unmanaged"]
        data["not_updated"].update(found["not_updated"])
    if not details:
        return "no role admits new members here (the firewall is not managed)", {}
    return "; ".join(details), data


def _admit_with(role: Role, inventory: Inventory, host: Host, group: str, peer: str | None, *,
                fleet: FleetOptions) -> tuple[str, dict[str, Any]]:
    others = [inventory.hosts[h] for h in inventory.hosts
              if h in inventory.groups.get(group, set()) and h != host.name]
    looked = provision(inventory, others, [role],
                       RunOptions(check=True, apply=ApplyOptions(), fleet=fleet))
    managed = [h for h in others if _in_use(role, h, looked[h.name])]
    outcomes = provision(inventory, managed, [role],
                         RunOptions(apply=ApplyOptions(), fleet=fleet,
                                    command=f"bootstrap of {host.name} (admit)"))
    failed = {n: f"{o.status}: {o.error}" for n, o in (looked | outcomes).items()
              if o.status in ("failed", "unreachable")}
    if peer in failed:
        raise GpufleetError(f"the peer {peer} could not admit {host.name}: {failed[peer]}")
    changed = sorted(n for n, o in outcomes.items() if o.status == "changed")
    names = {h.name for h in managed}
    unmanaged = sorted(h.name for h in others if h.name not in failed and h.name not in names)
    detail = f"{len(changed)} of {len(managed)} node(s) of group {group} updated their " \
             f"{role.name}"
    if unmanaged:
        detail += f"; {len(unmanaged)} without gpufleet's {role.name} left alone"
    if failed:
        detail += f"; NOT updated: {', '.join(f'{n} ({e})' for n, e in failed.items())}"
    return detail, {"updated": changed, "unmanaged": unmanaged, "not_updated": failed}


def _in_use(role: Role, host: Host, outcome: Outcome[HostRun]) -> bool:
    """Whether gpufleet has applied ``role`` on the host before (its facts say so)."""
    facts = outcome.value.facts if outcome.value else None
    return facts is not None and role.in_use(facts, RoleVars(host, role.defaults))


# ---- 5. certify ----------------------------------------------------------------------------

Runner = Callable[[Target, ConformanceOptions], ConformanceReport]


def required_suites(host: Host, facts: Facts | None) -> list[str]:
    """The suites that must each pass at least one check: the inventory's
    ``bootstrap_required_suites``, else those the registry requires for this node (stack,
    firewall and allreduce, plus gpu where NVIDIA GPUs are on the PCI bus or ``gpu_count``
    is set, and rdma where the node has RDMA devices)."""
    return registry.required(host, facts)


@dataclass
class Certifier:
    """Runs conformance suites for bootstrap through the typed runner and judges a run."""

    inventory: Inventory
    fleet: FleetOptions
    source: str | None = None
    recertify: bool = False
    run_suites: Runner = run_suites
    reports: list[ConformanceReport] = field(default_factory=list)

    def run(self, limit: str, suites: list[Suite], only: Callable[[Suite, str], bool],
            required: list[str], *, record_baseline: bool = False
            ) -> tuple[list[Result], dict[str, int]]:
        """One conformance run that must complete, fail nothing, and pass each required
        suite at least once; ``record_baseline`` records the node's figures."""
        names = ",".join(s.name for s in suites)
        try:
            report = self.run_suites(Target.select(self.inventory, limit), ConformanceOptions(
                suites=tuple(s.name for s in suites), only=only, source=self.source,
                record_baseline=record_baseline, fleet=self.fleet))
        except RunIncomplete as exc:
            raise RunIncomplete(f"the {names} suites did not complete: {exc}") from None
        self.reports.append(report)
        if report.failed:
            raise GpufleetError("; ".join(f"{r.suite}/{r.check} on {r.host}: {r.message}"
                                          for r in report.failed))
        if not report.complete:
            raise GpufleetError(f"the {names} suites did not complete")
        silent = [s for s in required
                  if not any(r.suite == s and r.outcome == "pass" for r in report.results)]
        if silent:
            raise GpufleetError(f"required suite(s) {', '.join(silent)} passed no check (each "
                                "must pass at least one; see bootstrap_required_suites)")
        return report.results, counts(report.results)


def certify(certifier: Certifier, host: str, peer: str | None, required: list[str]
            ) -> tuple[str, dict[str, Any]]:
    """Every suite bootstrap runs, on the node alone (node-local checks; the node's
    baseline is recorded), then the suites' checks with the peer (reachability both ways
    and a two-node AllReduce)."""
    results, alone = certifier.run(host, registry.bootstrap_suites(),
                                   lambda suite, check: suite.node_local(check), required,
                                   record_baseline=True)
    summary = {"node": alone}
    if peer:
        pair, summary["pair"] = certifier.run(
            f"{peer}:{host}", registry.peer_suites(),
            lambda suite, check: check.removeprefix("test_") in suite.with_peer,
            [s.name for s in registry.peer_suites()])
        results += pair
    passed = [r.name for r in results if r.outcome == "pass"]
    with_peer = f" with peer {peer}" if peer else " (no peer in the group)"
    return f"{len(passed)} checks passed{with_peer}", {"conformance": summary,
                                                        "passed": sorted(set(passed))}


@dataclass(frozen=True)
class _Reached:
    """A host over an open connection, as the baseline store reads it."""

    host: Host
    conn: Connection

    @property
    def name(self) -> str:
        return self.host.name

    def run(self, command: str, timeout: float = 30.0, stdin: bytes | None = None) -> Any:
        return self.conn.run(command, timeout=timeout, stdin=stdin)


def _recorded_peak(host: Host, conn: Connection | None, fleet: FleetOptions
                   ) -> tuple[float | None, str]:
    """The peak power ``host``'s baseline records (W), or why there is none."""
    try:
        opened = conn or connect(host, fleet.connect, Budget(PEER_READ_TIMEOUT_S))
    except GpufleetError as exc:
        return None, f"unreachable ({exc})"
    try:
        store = BaselineStore()
        value = store.recorded(_Reached(host, opened), bmc_checks.PEAK_FIGURE)
        return value, "" if value is not None else (store.read(_Reached(host, opened)).problem
                                                   or "no peak power recorded")
    finally:
        if conn is None:
            opened.close()


def power_budget(inventory: Inventory, host: Host, rack: str, conn: Connection,
                 fleet: FleetOptions) -> tuple[str, dict[str, Any]]:
    """``rack`` with the node in it, against the rack's budget: the node's measured peak
    (recorded at certification) and the recorded peaks of the rack's other nodes. A node
    whose own peak is unknown, or that would push the rack over, is refused; so is one
    whose rack has members whose peaks cannot be read (what they draw is not 0 W), unless
    the rack's ``rack_power_allow_unknown`` is true."""
    settings = registry.suite("bmc").vars(host)
    own, why = _recorded_peak(host, conn, fleet)
    if own is None:
        raise GpufleetError(f"rack {rack}: the node's peak power is unknown ({why}); certify "
                            f"it with a BMC declared (the bmc suite) to place it in the rack")
    others = [h for name, h in inventory.hosts.items() if name != host.name
              and bmc_checks.rack_of(h.vars, h.groups) == rack]
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(others)))) as pool:
        found = list(pool.map(lambda h: _recorded_peak(h, None, fleet), others))
    peaks: dict[str, float | None] = {host.name: own}
    left_out = {}
    for other, (value, reason) in zip(others, found, strict=True):
        if value is None:
            left_out[other.name] = reason
        else:
            peaks[other.name] = value
    use = bmc_checks.RackUse(rack, float(settings.number("rack_power_w")),
                               float(settings.number("rack_power_margin")),
                               settings.string("rack_cooling"), peaks)
    problems, warnings = bmc_checks.rack_problems(use, adding=host.name)
    data = {"rack": rack, **use.to_dict(), "not_counted": left_out, "warnings": warnings}
    if left_out and not settings.boolean("rack_power_allow_unknown"):
        problems.insert(0, f"unknown: rack {rack}: no peak power readable for "
                           + ", ".join(f"{name} ({why})" for name, why in sorted(left_out.items()))
                           + " (set rack_power_allow_unknown: true to admit the node without "
                             "counting them)")
    if problems:
        raise GpufleetError("; ".join(problems))
    uncounted = f"; not counted: {', '.join(sorted(left_out))}" if left_out else ""
    return (f"rack {rack}: {use.used_w:.0f} W of its {use.budget_w:.0f} W budget with "
            f"{host.name}{uncounted}"), data


def choose_peer(inventory: Inventory, host: Host, peer: str | None) -> str | None:
    """The given peer, else the first other host of the host's smallest group."""
    if peer:
        if peer not in inventory.hosts:
            raise GpufleetError(f"--peer {peer!r} is not in the inventory")
        return peer
    groups = sorted((g for g in host.groups if g not in ("all", "ungrouped")),
                    key=lambda g: (len(inventory.groups[g]), g))
    for group in [*groups, "all"]:
        others = [h for h in inventory.hosts if h in inventory.groups.get(group, set())
                  and h != host.name]
        if others:
            return others[0]
    return None


# ---- 6. mark -------------------------------------------------------------------------------

def node_state(host: Host, inventory: Inventory, facts: Facts | None, *, ready: bool,
               reason: str | None, steps: list[StepResult], peer: str | None) -> dict[str, Any]:
    """The content of /etc/gpufleet/node.json, apart from the time it is written."""
    conformance = next((s.data.get("conformance") for s in steps if s.name == "certify"), None)
    return {"schema": NODE_SCHEMA, "host": host.name, "status": "ready" if ready else
            "not-ready", "reason": reason, "inventory": str(inventory.path),
            "inventory_digest": inventory.digest(), "gpufleet_version": __version__,
            "versions": comparable(facts, host) if facts else {}, "conformance": conformance,
            "peer": peer}


def read_state(conn: Connection) -> dict[str, Any] | None:
    result = conn.run(f"cat {STATE_FILE} 2>/dev/null", timeout=30)
    try:
        state = read_json(result.stdout.encode(), f"{conn.host.name}:{STATE_FILE}",
                          max_bytes=2**20)
    except BadJson:
        return None  # unusable: the node is certified again and the file rewritten
    return state if isinstance(state, dict) else None


def same_state(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Equal apart from the time it was written (a file without that time, from an older
    gpufleet, is written again)."""
    return old is not None and old.keys() >= STAMPS and \
        {k: v for k, v in old.items() if k not in STAMPS} == new


def render_state(state: dict[str, Any]) -> bytes:
    """The node.json document (schema gpufleet.node/1): ``state`` stamped with the opening
    every document has and ``marked_at``, the same time."""
    stamped = {**opening(NODE_SCHEMA), **state}
    stamped["marked_at"] = stamped["generated_at"]
    return (json.dumps(stamped, indent=2, sort_keys=True) + "\n").encode()


def _hook_env(host: Host, status: str, reason: str | None) -> dict[str, str]:
    return {"GPUFLEET_HOST": host.name, "GPUFLEET_ADDRESS": host.address,
            "GPUFLEET_STATUS": status, "GPUFLEET_REASON": reason or ""}


def run_hook(command: str | None, host: Host, status: str, reason: str | None) -> str:
    """Run the inventory's ready/drain command on the controller (it works while the node is
    unreachable, e.g. ``scontrol update ... state=drain``); values reach it only as
    environment variables (GPUFLEET_HOST, GPUFLEET_ADDRESS, GPUFLEET_STATUS,
    GPUFLEET_REASON), never spliced into the command line."""
    if not command:
        return "no command configured"
    env = dict(os.environ, **_hook_env(host, status, reason))
    try:
        proc = subprocess.run(["sh", "-c", str(command)], env=env, capture_output=True,
                              text=True, timeout=HOOK_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise GpufleetError(f"command did not finish within {HOOK_TIMEOUT_S:g}s") from None
    if proc.returncode != 0:
        raise GpufleetError(f"command exited with {proc.returncode}: "
                            f"{(proc.stderr or proc.stdout).strip()[-200:]}")
    return "ran"


def run_node_hook(conn: Connection, command: str | None, host: Host, status: str,
                  reason: str | None) -> str:
    """Run the inventory's node-side ready/drain command on the node itself, with the same
    environment variables (quoted, set by ``env``)."""
    if not command:
        return "no command configured"
    env = [f"{k}={v}" for k, v in _hook_env(host, status, reason).items()]
    result = conn.run(shlex.join(["env", *env, "sh", "-c", str(command)]),
                      timeout=HOOK_TIMEOUT_S)
    result.check("the node's command")
    return "ran"


# ---- the whole flow ------------------------------------------------------------------------

def bootstrap(inventory: Inventory, options: BootstrapOptions, *, source: str | None = None,
              runner: Runner = run_suites) -> Bootstrap:
    """Take one host to certified-ready; every step is reported, none is hidden. Any
    failure, an unreachable node included, marks the node not ready and drains it.
    ``source`` is the inventory as named (``slurm:...``); ``runner`` runs the suites."""
    if options.host not in inventory.hosts:
        raise GpufleetError(f"--host {options.host!r} is not in {inventory.path}")
    host = inventory.hosts[options.host]
    validate([host], role_registry.ALL)
    registry.validate([host], registry.bootstrap_suites())
    bootstrap_vars(host)
    if options.timeout is not None and not options.timeout > 0:
        raise GpufleetError(f"--timeout must be a positive number of seconds, "
                            f"got {options.timeout:g}")
    budget = Budget(options.timeout or _host_timeout(host))
    fleet = FleetOptions(connect=ConnectOptions(connect_timeout=options.connect_timeout,
                                                known_hosts_base=inventory.base))
    result = Bootstrap(host.name)
    try:
        _timed(result, "trust", lambda: trust(host, inventory.base, options))
    except StepFailure as exc:
        result.reason = str(exc)
        with contextlib.suppress(StepFailure):
            _timed(result, "mark", lambda: mark(None, host, inventory, result, None))
        return result
    conn: Connection = connect(host, fleet.connect, budget)
    peer: str | None = None
    seen: dict[str, Facts] = {}
    try:
        peer = choose_peer(inventory, host, options.peer)
        _timed(result, "preflight", lambda: preflight(conn, host, seen))
        _timed(result, "provision", lambda: provision_node(
            inventory, host, _remaining(fleet, budget), options.reboot))
        _timed(result, "admit", lambda: admit(inventory, host, peer, _remaining(fleet, budget)))
        conn.close()  # the node may have rebooted: talk to it over a new connection
        conn = conn.reopen()
        certifier = Certifier(inventory, _remaining(fleet, budget), source, options.recertify,
                              runner, result.reports)
        required = required_suites(host, seen.get("preflight"))
        _timed(result, "certify", lambda: _certify_unless_done(
            certifier, conn, inventory, result, peer, required=required))
        rack = _budgeted_rack(host)
        if rack is not None:
            _timed(result, "power", lambda: power_budget(inventory, host, rack, conn,
                                                         _remaining(fleet, budget)))
        result.ready = True
    except StepFailure as exc:
        result.reason = str(exc)
    try:
        _timed(result, "mark", lambda: mark(conn, host, inventory, result, peer))
    except StepFailure as exc:
        result.ready = False
        result.reason = result.reason or str(exc)
    finally:
        conn.close()
    return result


def _budgeted_rack(host: Host) -> str | None:
    """The host's rack when the rack declares a power budget (``rack_power_w``)."""
    rack = bmc_checks.rack_of(host.vars, host.groups)
    return rack if registry.suite("bmc").vars(host).get("rack_power_w") is not None else None


def _host_timeout(host: Host) -> float:
    return fleet_host_timeout(host, FleetOptions(default_timeout=BOOTSTRAP_TIMEOUT_S))


def _remaining(fleet: FleetOptions, budget: Budget) -> FleetOptions:
    """The fleet options of a sub-run, bounded by what is left of the bootstrap's budget."""
    left = budget.remaining()
    if left is not None and left <= 0:
        raise GpufleetError(f"bootstrap timed out after {budget.limit_s:g}s")
    return FleetOptions(forks=fleet.forks, host_timeout=left, connect=fleet.connect)


def _certify_unless_done(certifier: Certifier, conn: Connection, inventory: Inventory,
                         result: Bootstrap, peer: str | None, *, required: list[str]
                         ) -> tuple[str, dict[str, Any]]:
    """Certify, unless the node is already certified for this inventory and stack."""
    host = conn.host
    facts = gather_facts(conn, consistency_request(host))
    previous = read_state(conn)
    expected = node_state(host, inventory, facts, ready=True, reason=None,
                          steps=result.steps, peer=peer)
    if previous and previous.get("status") == "ready" and not certifier.recertify and \
            {k: previous.get(k) for k in ("inventory_digest", "versions")} == \
            {k: expected[k] for k in ("inventory_digest", "versions")}:
        raise AlreadyCertified(f"already certified ready at {previous.get('marked_at')} for "
                               "this inventory and stack (--recertify to run again)",
                               {"conformance": previous.get("conformance")})
    detail, data = certify(certifier, host.name, peer, required)
    result.passed_checks = data.pop("passed", [])
    return detail, data


def mark(conn: Connection | None, host: Host, inventory: Inventory, result: Bootstrap,
         peer: str | None) -> tuple[str, dict[str, Any]]:
    """Run the ready or drain command on the controller first (so that an unreachable node
    is drained too), then the node-side command, then write the node's state file (unless
    unchanged). Without ``conn`` (the host key was not trusted) only the controller's
    command runs. A node that cannot be reached is reported, and has been drained."""
    status = "ready" if result.ready else f"NOT READY ({result.reason})"
    facts: Facts | None = None
    previous: dict[str, Any] | None = None
    lost: str | None = "its host key is not trusted" if conn is None else None
    if conn is not None:
        try:
            facts = gather_facts(conn, consistency_request(host))
            previous = read_state(conn)
        except Unreachable as exc:
            lost = str(exc)
    was_ready = bool(previous and previous.get("status") == "ready")
    if result.ready:
        done = ["ready command: " + (run_hook(host.vars.get("bootstrap_ready_command"), host,
                                              "ready", None)
                                     if not was_ready else "not needed (already ready)")]
        # the node converged on every role and passed every check it was certified with:
        # those findings of earlier runs clear (a health check's stay until it passes)
        acted = drain.update([(host, [
            RunFindings("bootstrap", {}, [s.name for s in result.steps]),
            RunFindings("drift", {}, [*(r.name for r in role_registry.ALL), "consistency",
                                      "unreachable", "error"]),
            RunFindings("conformance", {}, result.passed_checks)])])
    else:
        done = ["drain command: " + run_hook(host.vars.get("bootstrap_drain_command"), host,
                                             "not-ready", result.reason)]
        step = next((s.name for s in result.steps if s.status == "failed"), "bootstrap")
        acted = drain.update([(host, [RunFindings("bootstrap",
                                                       {step: str(result.reason)})])])
    if host.name in acted:
        done.append(f"scheduler: {acted[host.name]}")
    if conn is None or lost is not None:
        message = f"{status}; {'; '.join(done)}; the node was not contacted: {lost}"
        if conn is None:
            return message, {}
        raise NodeUnreachable(message)
    if not (result.ready and was_ready):
        key = "bootstrap_node_ready_command" if result.ready else "bootstrap_node_drain_command"
        done.append(f"node {'ready' if result.ready else 'drain'} command: "
                    + run_node_hook(conn, host.vars.get(key), host,
                                    "ready" if result.ready else "not-ready", result.reason))
    state = node_state(host, inventory, facts, ready=result.ready, reason=result.reason,
                       steps=result.steps, peer=peer)
    if same_state(previous, state):
        written = f"{STATE_FILE} unchanged"
    else:
        conn.put(STATE_FILE, render_state(state))
        written = f"wrote {STATE_FILE}"
    return f"{status}; {written}; {'; '.join(done)}", {"state": state}
