"""A conformance run as node_exporter textfile metrics (``conformance --prometheus``).

Per host and check a result, per host its verdict, and every gated figure a check
measured (the median of its trials, its gate and its baseline) in base units: GB/s as
bytes per second, TFLOPS as FLOPS. docs/metrics.md lists every family.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.conformance.results import ConformanceReport, Result
from gpufleet.report.prometheus import Textfile, metric_name

STATUSES = ("PASS", "FAIL", "SKIP")

UNITS: dict[str, tuple[str, float]] = {
    "GB/s": ("bytes_per_second", 1e9), "MB/s": ("bytes_per_second", 1e6),
    "TFLOPS": ("flops", 1e12), "files/s": ("files_per_second", 1.0),
    "samples/s": ("samples_per_second", 1.0), "": ("ratio", 1.0),
}
"""A figure's unit -> the metric name's unit suffix and the factor to the base unit."""


@dataclass(frozen=True)
class FigureFamily:
    """How figures whose name matches ``pattern`` are exported: the family's stem and the
    labels the pattern's groups fill."""

    pattern: re.Pattern[str]
    stem: str
    labels: tuple[str, ...] = ()


FIGURES = (
    FigureFamily(re.compile(r"allreduce\.busbw\.(\d+)"), "allreduce_busbw", ("size_bytes",)),
    FigureFamily(re.compile(r"p2p\.GPU(\d+)->GPU(\d+)"), "p2p_copy", ("src_gpu", "dst_gpu")),
    FigureFamily(re.compile(r"(h2d|d2h)\.GPU(\d+)"), "host_copy", ("direction", "gpu")),
    FigureFamily(re.compile(r"thermal\.tflops\.GPU(\d+)"), "thermal_matmul", ("gpu",)),
    FigureFamily(re.compile(r"storage\.seq_read_mbps"), "storage_seq_read"),
    FigureFamily(re.compile(r"storage\.small_files_per_s"), "storage_small_files"),
    FigureFamily(re.compile(r"ddp\.throughput_(\d+)"), "ddp_throughput", ("processes",)),
    FigureFamily(re.compile(r"ddp\.(efficiency(?:_across_nodes)?)"), "ddp", ("",)),
)
"""The figures the suites gate; any other is exported under its own name (``a.b`` ->
``gpufleet_conformance_a_b_<unit>``)."""

PLAIN = {"max_temp_c": ("thermal_max_temperature_celsius", 1.0),
         "aggregate_mbps": ("storage_aggregate_read_bytes_per_second", 1e6),
         "line_rate_fraction": ("allreduce_line_rate_ratio", 1.0),
         "line_rate_gbps": ("allreduce_line_rate_bytes_per_second", 1e9 / 8)}
"""Recorded numbers that are not gated figures, by property name."""


def outcome(result: Result) -> str:
    """pass, fail, skip, or unknown (a failure that says the check could not decide)."""
    if result.outcome == "fail" and result.message.startswith("unknown"):
        return "unknown"
    return result.outcome


def _figure(name: str) -> tuple[str, dict[str, str]]:
    """The family stem and labels of one figure (an unnamed label extends the stem)."""
    for family in FIGURES:
        match = family.pattern.fullmatch(name)
        if match:
            stem, labels = family.stem, {}
            for label, value in zip(family.labels, match.groups(), strict=True):
                if label:
                    labels[label] = value
                else:
                    stem = f"{stem}_{value}"
            return stem, labels
    return name, {}


def to_metrics(report: ConformanceReport, textfile: Textfile,
               previous: str | None = None) -> Textfile:
    """The run's metrics; ``previous`` (the file they replace, for a run over part of the
    fleet) gives the other hosts' series, which are kept."""
    tf = textfile
    tf.gauge("gpufleet_conformance_check_result", "1 when the check passed on the host in its "
             "last run, else 0; outcome is pass, fail, unknown (could not decide) or skip.",
             ["host", "suite", "check", "outcome"])
    tf.gauge("gpufleet_conformance_host_status", "1 for the host's verdict in its last run "
             "(PASS, FAIL, or SKIP when every check skipped), 0 for the others.",
             ["host", "status"])
    tf.gauge("gpufleet_conformance_host_last_run_timestamp_seconds", "Unix time at which the "
             "host's last conformance run finished.", ["host"])
    finished = report.started + report.duration
    for r in report.results:
        tf.set("gpufleet_conformance_check_result", float(r.outcome == "pass"), host=r.host,
               suite=r.suite, check=r.check.removeprefix("test_"), outcome=outcome(r))
    for host, entry in report.hosts().items():
        for status in STATUSES:
            tf.set("gpufleet_conformance_host_status", float(entry["status"] == status),
                   host=host, status=status)
        tf.set("gpufleet_conformance_host_last_run_timestamp_seconds", finished, host=host)
    _figures(tf, report.results)
    _counters(tf, report.results)
    if previous is not None:
        tf.keep_others(previous, {r.host for r in report.results})
    tf.gauge("gpufleet_conformance_hosts", "Hosts per verdict (each host as of its last "
             "run).", ["status"])
    counts = dict.fromkeys(STATUSES, 0)
    for labels, value in tf.samples("gpufleet_conformance_host_status"):
        if labels["host"] != "fleet":
            counts[labels["status"]] += int(value)
    for status, count in counts.items():
        tf.set("gpufleet_conformance_hosts", count, status=status)
    tf.gauge("gpufleet_conformance_last_run_timestamp_seconds", "Unix time at which the last "
             "conformance run finished.")
    tf.set("gpufleet_conformance_last_run_timestamp_seconds", finished)
    tf.gauge("gpufleet_conformance_last_run_duration_seconds", "Wall time of the last "
             "conformance run.")
    tf.set("gpufleet_conformance_last_run_duration_seconds", round(report.duration, 3))
    tf.gauge("gpufleet_conformance_last_run_complete", "1 when every selected check of the "
             "last run had an outcome.")
    tf.set("gpufleet_conformance_last_run_complete", float(report.complete))
    return tf


def _figures(tf: Textfile, results: list[Result]) -> None:
    """Median, gate and baseline of every gated figure, and the plain numbers of PLAIN."""
    made: set[str] = set()
    for r in results:
        check = r.check.removeprefix("test_")
        verdicts: Mapping[str, Any] = r.properties.get("verdicts") or {}
        for name, verdict in verdicts.items():
            if not isinstance(verdict, Mapping) or not isinstance(verdict.get("median"),
                                                                   int | float):
                continue
            stem, labels = _figure(name)
            suffix, factor = UNITS.get(str(verdict.get("unit", "")), ("", 1.0))
            for kind, key, what in (("", "median", "median of its trials"),
                                    ("gate", "gate", "gate (the minimum to pass)"),
                                    ("baseline", "baseline", "the node's recorded baseline")):
                value = verdict.get(key)
                if not isinstance(value, int | float) or isinstance(value, bool):
                    continue
                family = metric_name("conformance", stem, kind, suffix)
                if family not in made:
                    tf.gauge(family, f"Conformance figure {stem}: {what}, in base units.",
                             ["host", "check", *labels])
                    made.add(family)
                tf.set(family, float(value) * factor, host=r.host, check=check, **labels)
        for prop, (stem, factor) in PLAIN.items():
            value = r.properties.get(prop)
            if isinstance(value, int | float) and not isinstance(value, bool):
                family = metric_name("conformance", stem)
                if family not in made:
                    tf.gauge(family, f"Conformance: the recorded {prop}, in base units.",
                             ["host", "check"])
                    made.add(family)
                tf.set(family, float(value) * factor, host=r.host, check=check)


def _counters(tf: Textfile, results: list[Result]) -> None:
    """The NIC counters that moved during each measurement across nodes, and the TCP
    retransmits (``nic_counters_during_*`` checks; a counter that did not move has no
    series)."""
    moved = "gpufleet_conformance_nic_statistic_delta"
    retransmits = "gpufleet_conformance_tcp_retransmitted_segments"
    tf.gauge(moved, "How much a NIC counter that means trouble (drops, errors, pause, ecn, "
             "retransmits) moved during one measurement.",
             ["host", "check", "phase", "port", "counter", "kind"])
    tf.gauge(retransmits, "TCP segments the host retransmitted during one measurement.",
             ["host", "check", "phase"])
    for r in results:
        check = r.check.removeprefix("test_")
        phases = r.properties.get("counters")
        if not check.startswith("nic_counters_during_") or not isinstance(phases, Mapping):
            continue
        for phase, entry in phases.items():
            if not isinstance(entry, Mapping):
                continue
            for d in entry.get("deltas") or []:
                tf.set(moved, float(d["value"]), host=r.host, check=check, phase=str(phase),
                       port=str(d["port"]), counter=str(d["counter"]), kind=str(d["kind"]))
            if isinstance(entry.get("tcp_retransmits"), int):
                tf.set(retransmits, float(entry["tcp_retransmits"]), host=r.host, check=check,
                       phase=str(phase))
