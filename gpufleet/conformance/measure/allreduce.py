"""AllReduce across nodes, hierarchically: every node alone (all at once), then disjoint
pairs (all at once), then all nodes together; a failing or slow run is searched with
adaptive group testing (``grouptest``) to the bad nodes and pairs, each confirmed before it
is blamed, and a bad pair's direction is read with a connect probe both ways. On NCCL, a
run whose channels use a transport below the inventory's expectation fails (NCCL's INFO
log, ``nccl_log``). A multi-node run also fails when its busbw is under
``allreduce_min_line_rate_fraction`` of the slowest node's line rate, and every node's NIC
counters are sampled before and after the pairs and the run of all nodes
(``nic_counters``), the probe's per-connection counts laying TCP retransmits on paths."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpufleet.conformance.checks.allreduce import expected_transports
from gpufleet.conformance.checks.gpudirect import (
    NodeGdr,
    gdr_settings,
    nvlink_node,
    read_log,
    required,
    run_problem,
)
from gpufleet.conformance.checks.nccl_log import Link, links, mismatches, observed, rank_hosts
from gpufleet.conformance.grouptest import Fault, Group, Search, Trial, find_faults, max_rounds
from gpufleet.conformance.launch import ProbeRun, rendezvous_port, run_probe
from gpufleet.conformance.measure.reachability import (
    Matrix,
    PortSpec,
    measure,
    probe_ports,
    source_band,
)
from gpufleet.conformance.nic_counters import (
    LineRate,
    NodeCounters,
    Sample,
    attribute,
    deltas,
    line_rate,
    owners,
    probe_paths,
    take_all,
)
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.allreduce import AllreduceSettings
from gpufleet.conformance.suites.common import Counters, Range
from gpufleet.conformance.suites.gpudirect import GpudirectSettings
from gpufleet.ports import RENDEZVOUS_PORT, parse_range

MIN_TRIAL_TIMEOUT_S = 20.0
TRIAL_TIMEOUT_FACTOR = 3.0
TOPOLOGY_PREFIXES = ("rack", "leaf")


def run_allreduce(nodes: list[Node], args: list[str], timeout_s: float,
                  port: int = RENDEZVOUS_PORT, env: Mapping[str, str] | None = None
                  ) -> ProbeRun:
    """The AllReduce probe on ``nodes`` together (``env`` over the launch's)."""
    return run_probe("allreduce", nodes, args, timeout_s, port=port, env=env)


def threshold(node: Node, nodes: int) -> float | None:
    """The minimum busbw (GB/s) at the largest size for this node's GPU model and ``nodes``.

    ``allreduce_busbw_thresholds`` maps a GPU model as nvidia-smi names it (or ``cpu``) to
    node counts and GB/s; the entry for the largest count not above ``nodes`` applies.
    """
    table = node.typed(AllreduceSettings).allreduce_busbw_thresholds or {}
    counts = {int(k): float(v) for k, v in (table.get(gpu_model(node)) or {}).items()}
    eligible = [k for k in counts if k <= nodes]
    return counts[max(eligible)] if eligible else None


def gpu_model(node: Node) -> str:
    """The node's GPU model as nvidia-smi names it, or ``cpu``."""
    gpus = node.facts.get("gpus") if node.facts else None
    return str(gpus[0].get("name")) if gpus else "cpu"


def probe_args(node: Node) -> list[str]:
    """Sizes and iterations from the inventory (``allreduce_sizes``, ``allreduce_iters``)."""
    settings = node.typed(AllreduceSettings)
    args = []
    if settings.allreduce_sizes:
        args += ["--sizes", ",".join(map(str, settings.allreduce_sizes))]
    if settings.allreduce_iters:
        args += ["--iters", str(settings.allreduce_iters)]
    return args + nccl_log_args(node.var("nccl_env") or {})


def nccl_log_args(nccl_env: Mapping[str, Any]) -> list[str]:
    """The probe's ``--nccl-log`` settings (applied on the NCCL backend only): NCCL_DEBUG
    INFO (TRACE when the inventory's ``nccl_env`` asks for it), NCCL_DEBUG_SUBSYS INIT,NET
    added to the subsystems ``nccl_env`` names, and NCCL_DEBUG_FILE empty so the log reaches
    the probe's output even where nccl.conf sends it to a file."""
    level = "TRACE" if str(nccl_env.get("NCCL_DEBUG", "")).upper() == "TRACE" else "INFO"
    named = str(nccl_env.get("NCCL_DEBUG_SUBSYS") or "")
    kept = [] if named.startswith("^") else [s.strip().upper() for s in named.split(",")]
    subsys = ",".join(dict.fromkeys([*(s for s in kept if s), "INIT", "NET"]))
    return ["--nccl-log", f"NCCL_DEBUG={level}", "--nccl-log", f"NCCL_DEBUG_SUBSYS={subsys}",
            "--nccl-log", "NCCL_DEBUG_FILE="]


def timeout_of(node: Node) -> float:
    return node.typed(AllreduceSettings).allreduce_timeout_s


def port_of(node: Node) -> int:
    return rendezvous_port(node)


def figure(value: float) -> str:
    """A measured figure with three significant digits (0.00123, 1.23, 312)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


def problem(run: ProbeRun, node: Node, count: int,
            rates: Mapping[str, LineRate] | None = None,
            peers: Mapping[str, Node] | None = None) -> str | None:
    """Why a run fails the check: its error, busbw under the threshold for ``count``, (across
    nodes, with their ``rates``) a node's port under its declared rate, busbw under its share
    of the slowest line rate, or its transports (``transport_problem``, GPUDirect RDMA judged
    on ``peers``: name -> node)."""
    error = run.error()
    if error:
        return error
    largest = run.largest
    assert largest is not None
    minimum = threshold(node, count)
    if minimum is not None and largest["world_size"] > 1 and largest["busbw"] < minimum:
        return (f"busbw {figure(float(largest['busbw']))} GB/s at {largest['size']} bytes is "
                f"under the {minimum:g} GB/s threshold for {gpu_model(node)} x{count} node(s)")
    short = trained_down(run, rates or {}) if count > 1 else None
    if short is not None:
        return short
    share = line_rate_share(run, rates or {}) if count > 1 else None
    least = node.typed(AllreduceSettings).allreduce_min_line_rate_fraction
    if share is not None and share[0] < least:
        fraction, slowest = share
        return (f"busbw {figure(float(largest['busbw']))} GB/s at {largest['size']} bytes is "
                f"{figure(fraction)} of the slowest line rate ({slowest.node}: "
                f"{slowest.nics}), under allreduce_min_line_rate_fraction {least:g}")
    return transport_problem(run, node, peers)


def trained_down(run: ProbeRun, rates: Mapping[str, LineRate]) -> str | None:
    """The run's nodes whose ports fall short of their declared rate (trained down, not
    ACTIVE, missing), named with their ports; None when every node is at its declared rate
    or declares none. Such a node fails whatever busbw the run reached: its bar stays at
    the declared rate."""
    short = [rates[n] for n in run.nodes if n in rates and rates[n].short]
    if not short:
        return None
    return "; ".join(f"{r.node}: {', '.join(r.short)}, under the declared line rate "
                     f"({r.nics})" for r in short)


def line_rate_share(run: ProbeRun, rates: Mapping[str, LineRate]
                    ) -> tuple[float, LineRate] | None:
    """The run's busbw at its largest size as a fraction of the slowest of its nodes' line
    rates, and that node's; None when a node's rate is unknown or the run moved nothing
    between ranks."""
    largest = run.largest
    known = [rates[n] for n in run.nodes if n in rates]
    if largest is None or int(largest["world_size"]) < 2 or len(known) != len(run.nodes):
        return None
    if any(r.gbps is None for r in known):
        return None
    slowest = min(known, key=lambda r: r.gbps or 0.0)
    return float(largest["busbw"]) * 8 / (slowest.gbps or 1.0), slowest


def run_links(run: ProbeRun) -> tuple[list[Link], dict[int, str]]:
    """The run's NCCL channel connections, and rank -> node (from the node whose output
    printed the rank's ``comm .. rank`` line)."""
    node_of = {rank: name for name, out in run.outputs.items()
               for rank in rank_hosts("\n".join(out.nccl_log))}
    text = "\n".join(line for out in run.outputs.values() for line in out.nccl_log)
    return links(text, node_of), node_of


def transport_unchecked(run: ProbeRun) -> str | None:
    """Why the run's transports are not checked (gloo, a single rank), else None."""
    largest = run.largest
    if largest is None:
        return "not checked: the run reported no result"
    backend = largest.get("backend") or "unknown"
    if backend != "nccl":
        return f"not checked: the {backend} backend uses no NCCL transport"
    if int(largest.get("world_size", 0)) < 2:
        return "not checked: one NCCL rank, no channel between GPUs"
    return None


def transport_problem(run: ProbeRun, node: Node,
                      peers: Mapping[str, Node] | None = None) -> str | None:
    """Channels that used a transport below ``allreduce_transport_intra``/``_inter`` (the
    first node's), a log without any channel, or, with ``_inter`` ib, a channel over the
    network without GDRDMA to or from a node of ``peers`` (else ``node``) where GPUDirect
    RDMA is required; None when they match or are not checked."""
    if transport_unchecked(run) is not None:
        return None
    found, node_of = run_links(run)
    if not found:
        return ("unknown: NCCL's log shows no channel (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS="
                "INIT,NET did not reach NCCL)")
    intra, inter = expected_transports(node.host)
    problems = mismatches(found, intra, inter, node_of)
    if inter == "ib":
        text = "\n".join(line for out in run.outputs.values() for line in out.nccl_log)
        views = {name: gdr_view(n) for name, n in (peers or {node.name: node}).items()
                 if name in run.nodes}
        gdr = run_problem(read_log(text, node_of), node_of, views)
        problems += [gdr] if gdr else []
    return "; ".join(problems) or None


def gdr_view(node: Node) -> NodeGdr:
    """What the GPUDirect RDMA verdict needs of ``node``: whether it is required there, its
    ``gpudirect`` fact and the GPUDirect settings its jobs get."""
    facts = node.known
    state = facts.get("gpudirect")
    gpu_node = bool(facts.get("gpus") or facts.get("pci_gpus"))
    wanted = node.typed(GpudirectSettings).gpudirect_required
    return NodeGdr(required(gpu_node, state, wanted), state, facts.why_absent("gpudirect"),
                   gdr_settings(node.var("nccl_env"), state), nvlink_node(facts.get("nvlink")))


def transport_summary(run: ProbeRun) -> str:
    """The transports the run used, e.g. ``intra P2P/CUMEM``, or why they are unchecked."""
    unchecked = transport_unchecked(run)
    if unchecked is not None:
        return unchecked
    seen = observed(run_links(run)[0])
    return "; ".join(f"{where} {', '.join(found)}" for where, found in seen.items()
                     if found) or "no channel in NCCL's log"


def run_groups(groups: list[list[Node]], timeout_s: float, workers: int,
               args: list[str]) -> list[ProbeRun]:
    """One AllReduce per group, all at the same time (the groups share no node)."""
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(groups)))) as pool:
        return list(pool.map(lambda g: run_allreduce(g, args, timeout_s, port_of(g[0])), groups))


def disjoint_pairs(nodes: list[Node]) -> list[list[Node]]:
    """Neighbours paired up; an odd last node is paired with the first."""
    pairs = [nodes[i:i + 2] for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2 and len(nodes) > 2:
        pairs.append([nodes[-1], nodes[0]])
    return pairs


def domain(node: Node) -> str:
    """The node's rack or leaf: ``topology_domain``, else its first group named rack* or
    leaf* (``topology_group_prefixes``), else none."""
    settings = node.typed(AllreduceSettings)
    if settings.topology_domain:
        return settings.topology_domain
    prefixes = tuple(settings.topology_group_prefixes or TOPOLOGY_PREFIXES)
    return next((g for g in sorted(node.host.groups) if g.startswith(prefixes)), "")


@dataclass
class Verdict:
    """A bad node or a bad pair, with what failed and where."""

    fault: Fault
    direction: str | None = None
    blocked: dict[str, list[int]] = field(default_factory=dict)

    def message(self) -> str:
        f = self.fault
        names = " and ".join(f.nodes)
        if f.kind == "node":
            text = f"node {names}: fails with every partner ({f.problem})"
        else:
            where = f" ({self.direction})" if self.direction else ""
            text = f"pair {names}{where}: fails together, passes with others ({f.problem})"
        if not f.confirmed:
            text += " [not confirmed: " + (f.note or "re-test passed") + "]"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.fault.kind, "nodes": list(self.fault.nodes),
                "confirmed": self.fault.confirmed, "problem": self.fault.problem,
                "note": self.fault.note, "direction": self.direction, "blocked": self.blocked,
                "evidence": [trial_dict(t) for t in self.fault.evidence]}


def trial_dict(trial: Trial) -> dict[str, Any]:
    return {"group": list(trial.group), "ok": trial.ok, "problem": trial.problem,
            "round": trial.round}


def direction(a: Node, b: Node) -> tuple[str, dict[str, list[int]]]:
    """Which way a pair's traffic is dropped, from connects both ways on the rendezvous port
    and the range (leaving from a source port outside the range)."""
    low, high = parse_range(a.typed(Range).firewall_port_range, a.name, "firewall_port_range")
    rendezvous = port_of(a)
    spec = PortSpec(probe_ports(rendezvous, low, high, 3), low, high, 64, 0,
                    source_band(low, high, rendezvous))
    return describe_direction(a.name, b.name, measure(
        {a.name: a, b.name: b}, [(a.name, b.name), (b.name, a.name)], spec))


def describe_direction(a: str, b: str, matrix: Matrix) -> tuple[str, dict[str, list[int]]]:
    """The direction line of a pair's verdict, and the dropped ports each way."""
    blocked = {f"{a}->{b}": matrix.blocked(a, b), f"{b}->{a}": matrix.blocked(b, a)}
    ab, ba = blocked.values()

    def ports(source: str, target: str) -> str:
        probed = sorted(p for (s, t, p) in matrix.results if (s, t) == (source, target))
        found = matrix.blocked(source, target)
        opened = [p for p in probed if p not in found]
        return (f"{len(found)} of {len(probed)} probed ports dropped, e.g. "
                f"{', '.join(map(str, found[:4]))}"
                + (f"; open: {', '.join(map(str, opened[:4]))}" if opened else ""))

    if ab and not ba:
        return f"{b} drops {a}'s connections, {a} -> {b}: {ports(a, b)}", blocked
    if ba and not ab:
        return f"{a} drops {b}'s connections, {b} -> {a}: {ports(b, a)}", blocked
    if ab and ba:
        return (f"dropped both ways: {a} -> {b}: {ports(a, b)}; {b} -> {a}: "
                f"{ports(b, a)}"), blocked
    return "every probed port open both ways: the pair fails inside the collective", blocked


@dataclass
class Hierarchy:
    """Each level's runs, the search and the verdicts."""

    pairs: list[ProbeRun] = field(default_factory=list)
    together: ProbeRun | None = None
    line_rates: dict[str, LineRate] = field(default_factory=dict)
    counters: dict[str, dict[str, NodeCounters]] = field(default_factory=dict)
    search: Search | None = None
    verdicts: list[Verdict] = field(default_factory=list)
    trial_timeout_s: float = 0.0
    budget_s: float = 0.0
    search_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        search = self.search
        return {"pairs": [r.to_dict() for r in self.pairs],
                "all": self.together.to_dict() if self.together else None,
                "bisection": None if search is None else {
                    "rounds": search.rounds, "max_rounds": search.max_rounds,
                    "exhausted": search.exhausted, "trial_timeout_s": self.trial_timeout_s,
                    "budget_s": round(self.budget_s, 1), "seconds": round(self.search_s, 1),
                    "trials": [trial_dict(t) for t in search.trials]},
                "verdicts": [v.to_dict() for v in self.verdicts],
                "line_rates": {n: r.to_dict() for n, r in sorted(self.line_rates.items())},
                "counters": {phase: {n: c.to_dict() for n, c in sorted(by_node.items())}
                             for phase, by_node in self.counters.items()}}


def counted(nodes: Mapping[str, Node], before: Mapping[str, Sample | str],
            after: Mapping[str, Sample | str], runs: list[ProbeRun]
            ) -> dict[str, NodeCounters]:
    """The nodes' counters over ``runs``, with the paths their ranks' ``tcp`` lines
    counted (a node whose line could not be read has a note instead)."""
    events = {name: o.events for run in runs for name, o in run.outputs.items()}
    paths, bad = probe_paths(events, owners(nodes.values()))
    counters = deltas(nodes, before, after, paths)
    for name, why in bad.items():
        counters[name].notes.append(f"per-connection counts unknown: {why}")
    return counters


def trial_timeout(first: Node, passing: list[ProbeRun]) -> float:
    """How long one bisection run may take: ``allreduce_bisect_timeout_s``, else a few times
    the slowest passing run so far (a failing run hangs until it is stopped)."""
    configured = first.typed(AllreduceSettings).allreduce_bisect_timeout_s
    if configured is not None:
        return configured
    slowest = max((r.duration for r in passing), default=timeout_of(first) / TRIAL_TIMEOUT_FACTOR)
    return min(timeout_of(first), max(MIN_TRIAL_TIMEOUT_S, TRIAL_TIMEOUT_FACTOR * slowest))


def hierarchical(nodes: list[Node], workers: int, alone: list[ProbeRun]) -> Hierarchy:
    """Pairs, then all, then (on a failure) the search, for nodes that each passed alone
    (``alone``: those runs, which set how long a pair or a search run may take)."""
    first = nodes[0]
    args = probe_args(first)
    by_name = {n.name: n for n in nodes}
    out = Hierarchy(trial_timeout_s=trial_timeout(first, alone))
    out.budget_s = max_rounds(len(nodes)) * out.trial_timeout_s
    before = take_all(nodes, workers)
    out.line_rates = {n.name: line_rate(n, before[n.name]) for n in nodes}
    rates = out.line_rates
    known: list[Trial] = []
    if len(nodes) > 2:
        pair_groups = disjoint_pairs(nodes)
        out.pairs = run_groups(pair_groups, out.trial_timeout_s, workers, args)
        after = take_all(nodes, workers)
        out.counters["pairs"] = counted(by_name, before, after, out.pairs)
        before = after
        known += [Trial(tuple(n.name for n in g), problem(r, g[0], 2, rates, by_name) is None,
                        problem(r, g[0], 2, rates, by_name))
                  for g, r in zip(pair_groups, out.pairs, strict=True)]
    out.together = run_allreduce(nodes, args, timeout_of(first), port_of(first))
    out.counters["all"] = counted(by_name, before, take_all(nodes, workers), [out.together])
    attribute(out.counters.values(), {n.name: n.typed(Counters).net_max_retransmit_ratio
                                      for n in nodes})
    failed = problem(out.together, first, len(nodes), rates, by_name)
    known.append(Trial(tuple(by_name), failed is None, failed))
    if failed is None and all(t.ok for t in known):
        return out

    def test(groups: list[Group]) -> list[Trial]:
        runs = run_groups([[by_name[n] for n in g] for g in groups], out.trial_timeout_s,
                          workers, args)
        return [Trial(g, problem(r, by_name[g[0]], len(g), rates, by_name) is None,
                      problem(r, by_name[g[0]], len(g), rates, by_name))
                for g, r in zip(groups, runs, strict=True)]

    start = time.monotonic()
    out.search = find_faults(list(by_name), test, domains={n.name: domain(n) for n in nodes},
                             known=known)
    for fault in out.search.faults:
        verdict = Verdict(fault)
        if fault.kind == "pair":
            verdict.direction, verdict.blocked = direction(by_name[fault.nodes[0]],
                                                           by_name[fault.nodes[1]])
        out.verdicts.append(verdict)
    out.search_s = time.monotonic() - start
    return out
