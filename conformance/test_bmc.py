"""bmc: power and cooling out of band. Each node's BMC is read over Redfish (or IPMI,
``bmc_protocol: ipmi``) from the controller, never from the node, so a node that is down
is still read: its PSUs' health and rating against the node's measured peak
(``psu_min_headroom``, 1.3x) and declared redundancy, its inlet temperature
(``bmc_max_inlet_c``) and fans, and the critical entries of its event logs newer than
``bmc_sel_window_h``; then each rack's measured peaks against its supply (``rack_power_w``
x ``rack_power_margin``). A node with no BMC declared is "not checked: no BMC", never
passed. The measured peak is recorded in the node's baseline (``power.peak_w``) with
``--record-baseline``.

Variables: bmc_address, bmc_user, bmc_password (a secret), bmc_ca_file, bmc_protocol
(redfish), bmc_ipmi_cipher_suite (17), psu_rating_w (IPMI reports no rating),
psu_min_headroom (1.3), psu_redundancy (none: N, N+M or 2N), bmc_max_inlet_c (35),
bmc_sel_window_h (24), bmc_read_budget_s (120: seconds for the whole reading of one BMC),
rack (default: the node's first group named rack*), rack_power_w, rack_cooling (air or
liquid), rack_power_margin (0.8).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpufleet.bmc import ipmi, redfish
from gpufleet.bmc.reading import BmcReading, ipmi_reading, reading
from gpufleet.bmc.target import target_of
from gpufleet.conformance.baseline import BaselineStore
from gpufleet.conformance.checks.bmc import (
    PEAK_FIGURE,
    RackUse,
    cooling_problems,
    measured_peak,
    new_critical_events,
    psu_problems,
    rack_of,
    rack_problems,
)
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.bmc import BmcSettings
from gpufleet.errors import GpufleetError
from gpufleet.inventory.secrets import redact

NO_BMC = "not checked: no BMC (declare bmc_address, bmc_user and bmc_password)"
Readings = dict[str, "BmcReading | str | None"]


def _read_one(node: Node) -> BmcReading | str | None:
    """One node's BMC reading, or why it is unknown. Whatever one BMC sends costs that
    node's reading only: any failure while reading or parsing it is caught here."""
    target = target_of(node.host)
    if target is None:
        return None
    settings = node.typed(BmcSettings)
    rating, budget = settings.psu_rating_w, settings.bmc_read_budget_s
    try:
        if target.protocol == "ipmi":
            out = ipmi.read(target, budget)
            return ipmi_reading(out.sdr, out.sel, out.dcmi, rating)
        docs = redfish.read(target, budget)
        found = reading(docs.power, docs.thermal, docs.log_entries, docs.logs_cut,
                        docs.parts)
    except GpufleetError as exc:
        return str(exc)
    except Exception as exc:  # a hostile document must not end the run: this node only
        return f"{target.where}: could not be read ({type(exc).__name__}: " \
               f"{redact(str(exc))[:200]})"
    found.psus = [p if p.capacity_w or rating is None else replace(p, capacity_w=rating)
                  for p in found.psus]
    return found


@pytest.fixture(scope="session")
def bmcs(conformance: ConformanceSession) -> Readings:
    """Every selected node's BMC reading (None: no BMC; a string: why it could not be
    read), all BMCs at once."""
    def compute() -> Readings:
        nodes = list(conformance.nodes.values())
        with ThreadPoolExecutor(max_workers=max(1, min(64, conformance.forks,
                                                       len(nodes)))) as pool:
            return dict(zip([n.name for n in nodes], pool.map(_read_one, nodes), strict=True))
    return conformance.once("bmc.readings", compute)


def _reading(node: Node, bmcs: Readings) -> BmcReading:
    found = bmcs.get(node.name)
    if found is None:
        pytest.skip(NO_BMC)
    if isinstance(found, str):
        pytest.fail(f"unknown: {found}")
    return found


def _soak_peak(conformance: ConformanceSession, name: str) -> float | None:
    entry: dict[str, Any] = conformance.report.get("thermal", {}).get(name) or {}
    value = entry.get("gpu_peak_power_w")
    return float(value) if value else None


def _recorded(conformance: ConformanceSession, node: Node) -> float | None:
    """The peak the node's baseline recorded, read whether the run compares or not."""
    if node.facts is None:
        return None
    store = conformance.options.baseline or conformance.once("bmc.baselines", BaselineStore)
    return store.recorded(node, PEAK_FIGURE)


def peak_of(conformance: ConformanceSession, node: Node, bmc: BmcReading | None
            ) -> tuple[float | None, str]:
    """The node's measured peak power (W) and its source."""
    return measured_peak(bmc, _soak_peak(conformance, node.name),
                         _recorded(conformance, node))


def test_power_supplies(node: Node, conformance: ConformanceSession, bmcs: Readings,
                        record_property: RecordProperty) -> None:
    bmc = _reading(node, bmcs)
    conformance.add_report("bmc", node.name, bmc.to_dict())
    peak, source = peak_of(conformance, node, bmc)
    record_property("psus", [p.describe() for p in bmc.psus])
    record_property("peak_w", peak)
    record_property("peak_source", source)
    if not bmc.psus:
        pytest.fail("unknown: the BMC lists no power supply")
    if peak is None:
        pytest.fail(f"unknown: {source}: the BMC reports no chassis power reading "
                    f"(PowerControl PowerConsumedWatts)")
    if conformance.options.baseline is not None:
        conformance.options.baseline.add_reading(node.name, PEAK_FIGURE, peak, "W")
    settings = node.typed(BmcSettings)
    problems = psu_problems(bmc.psus, peak, settings.psu_min_headroom,
                            settings.psu_redundancy)
    unknown = [p for p in problems if p.startswith("unknown:")]
    if unknown and len(unknown) == len(problems):
        pytest.fail("; ".join(unknown))
    assert not problems, "; ".join(problems) + f" (measured peak from {source})"


def test_inlet_temperature_and_fans(node: Node, bmcs: Readings,
                                    record_property: RecordProperty) -> None:
    bmc = _reading(node, bmcs)
    record_property("inlet_c", [t.celsius for t in bmc.inlets()])
    record_property("exhaust_c", [t.celsius for t in bmc.temperatures if t.exhaust])
    problems = cooling_problems(bmc, node.typed(BmcSettings).bmc_max_inlet_c)
    unknown = [p for p in problems if p.startswith("unknown:")]
    if unknown and len(unknown) == len(problems):
        pytest.fail(unknown[0])
    assert not problems, "; ".join(problems)


def test_no_new_critical_events(node: Node, bmcs: Readings,
                                record_property: RecordProperty) -> None:
    bmc = _reading(node, bmcs)
    window = node.typed(BmcSettings).bmc_sel_window_h
    since = datetime.now(timezone.utc) - timedelta(hours=window)
    found = new_critical_events(bmc.events, since)
    record_property("entries", len(bmc.events))
    record_property("since", since.strftime("%Y-%m-%dT%H:%M:%SZ"))
    record_property("log_unknown", bmc.events_unknown)
    if not found and bmc.events_unknown:
        pytest.fail(f"unknown: {bmc.events_unknown}")
    assert not found, f"{len(found)} critical event(s) in the BMC's logs in the last " \
        f"{window:g} h: " + "; ".join(e.describe() for e in found[:5])


def rack_uses(conformance: ConformanceSession, bmcs: Readings) -> list[RackUse]:
    """Every rack with a declared supply among the inventory's hosts, with the measured
    peaks of its nodes (None where unknown: not selected, or nothing measured)."""
    members: dict[str, list[str]] = {}
    budget: dict[str, tuple[float, float, str]] = {}
    for name, host in conformance.inventory.hosts.items():
        node = conformance.nodes.get(name) or Node(host, conformance.options.fleet.connect)
        rack = rack_of(host.vars, host.groups)
        settings = node.typed(BmcSettings)
        if rack is None or settings.rack_power_w is None:
            continue
        members.setdefault(rack, []).append(name)
        budget.setdefault(rack, (settings.rack_power_w, settings.rack_power_margin,
                                 settings.rack_cooling))

    def peak(name: str) -> float | None:
        selected = conformance.nodes.get(name)
        found = bmcs.get(name)
        bmc = found if isinstance(found, BmcReading) else None
        return peak_of(conformance, selected, bmc)[0] if selected else None

    names = [name for rack in members.values() for name in rack]
    with ThreadPoolExecutor(max_workers=max(1, min(64, conformance.forks, len(names)))) as pool:
        peaks = dict(zip(names, pool.map(peak, names), strict=True))
    return [RackUse(rack, *budget[rack], {name: peaks[name] for name in rack_names})
            for rack, rack_names in sorted(members.items())]


def test_rack_power_budget(conformance: ConformanceSession, bmcs: Readings,
                           record_property: RecordProperty) -> None:
    uses = rack_uses(conformance, bmcs)
    if not uses:
        pytest.skip("not checked: no rack declares rack_power_w")
    conformance.add_report("racks", "budgets", {u.rack: u.to_dict() for u in uses})
    record_property("racks", {u.rack: u.to_dict() for u in uses})
    problems: list[str] = []
    warnings: list[str] = []
    for use in uses:
        found, warned = rack_problems(use)
        problems += found
        warnings += warned
    record_property("warnings", warnings)
    assert not problems, "; ".join(problems)
