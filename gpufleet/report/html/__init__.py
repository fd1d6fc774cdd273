"""Self-contained HTML reports, rendered from gpufleet's own JSON documents: drift
(``gpufleet.drift/1`` and the runs kept in its history), conformance
(``gpufleet.conformance/1``) and the acceptance report a platform team hands over (the
conformance runs of an acceptance or a bootstrap, with ``gpufleet.bootstrap/1`` documents
and ``gpufleet.node/1`` states for the versions).

One page that opens from a file: inline CSS, plots drawn here as inline SVG, a few lines of
inline script for the filter, and a Content-Security-Policy that forbids every fetch. Hosts
are folded into sets (``node[001-998]``, ClusterShell's notation), failing hosts first, so
the page stays usable at thousands of hosts; every host still appears in the status grid
and every failure with its message. Every text comes from hosts or inventories and is
escaped by Jinja2's autoescape.

The package's modules hold what the pages show: ``page`` the building blocks,
``conformance`` the results, ``plots`` the measured figures, ``drift`` the drift page,
``verdict`` the acceptance verdict, ``versions`` the stack's versions.
"""

from __future__ import annotations

import base64
import hashlib
import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from gpufleet import __version__
from gpufleet.report.html.conformance import (
    FLEET,
    OUTCOME_CSS,
    Result,
    counter_rows,
    figure_summary,
    host_status,
    rack_rows,
    results_of,
)
from gpufleet.report.html.drift import drift_page
from gpufleet.report.html.page import (
    Card,
    Group,
    Row,
    clip,
    dicts,
    fold,
    grid_and_sets,
    header,
    natural,
)
from gpufleet.report.html.plots import allreduce_plots, storage_plots, thermal_plots
from gpufleet.report.html.verdict import (
    ACCEPTANCE,
    NOT_MEASURED,
    acceptance,
    acceptance_rows,
    judge,
    merge_conformance,
)
from gpufleet.report.html.versions import stack_versions
from gpufleet.report.outputs import local_put

__all__ = ["NOT_MEASURED", "acceptance", "render_acceptance", "render_conformance",
           "render_drift", "write_html", "write_report"]

log = logging.getLogger("gpufleet.report")

_ENV = Environment(loader=PackageLoader("gpufleet.report", "templates"), autoescape=True,
                   undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_SCRIPT = _ENV.loader.get_source(_ENV, "filter.js")[0]  # type: ignore[union-attr]
_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()


def _render(template: str, **context: Any) -> str:
    return _ENV.get_template(template).render(
        script=Markup(_SCRIPT),  # noqa: S704 - the package's own script, hashed in the CSP
        script_hash=_SCRIPT_HASH, version=__version__, **context)


def write_html(path: str, html: str) -> None:
    """Write a rendered report atomically (``-``: standard output)."""
    local_put(path, html.encode("utf-8"))


def write_report(path: str, render: Callable[[], str]) -> bool:
    """Render and write a run's page, the last of its outputs: a page that cannot be
    rendered or written is one warning (the traceback at -vvv), never the run's failure,
    so the JSON, JUnit, Prometheus outputs and drains written before it stand."""
    try:
        write_html(path, render())
    except Exception as exc:  # the page is a view of outputs already written
        log.warning("--html %s: the report could not be written (%s: %s); the run's other "
                    "outputs and its exit code stand", path, type(exc).__name__, exc)
        log.debug("the report's traceback", exc_info=True)
        return False
    return True


def _conformance_parts(doc: Mapping[str, Any], results: list[Result]) -> dict[str, Any]:
    """What the conformance and acceptance pages share: grid, host sets, failures, skips,
    fleet checks and plots."""
    status = host_status(results)
    failing: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if r.outcome == "fail" and r.host != FLEET:
            failing[r.host].append(r.name)
    groups: dict[str, Group] = {}
    anchors: dict[str, str] = {}
    for r in sorted((r for r in results if r.outcome == "fail"),
                    key=lambda r: (r.name, natural(r.host))):
        row = Row(r.host, r.name, clip(r.message))
        if r.host not in anchors:
            row.anchor = anchors[r.host] = f"f{len(anchors)}"
        groups.setdefault(r.name, Group(r.name)).rows.append(row)
    notes = {h: "failed: " + ", ".join(sorted(set(c))) for h, c in failing.items()}
    labels = {h: ", ".join(sorted(set(c))) for h, c in failing.items()}
    cells, sets = grid_and_sets(status, css=OUTCOME_CSS, order=("FAIL", "SKIP", "PASS"),
                                 notes=notes, labels=labels, anchors=anchors)
    skipped: dict[tuple[str, str], Group] = {}
    for r in results:
        if r.outcome == "skip":
            group = skipped.setdefault((r.name, r.message), Group(r.name, detail=r.message))
            group.rows.append(Row(r.host, r.name, r.message, "skip"))
    counts = Counter(r.outcome for r in results)
    hosts = len(status)
    cards = [Card("hosts", str(hosts)),
             Card("hosts failed", str(sum(s == "FAIL" for s in status.values())),
                  "fail" if "FAIL" in status.values() else "pass"),
             Card("hosts passed", str(sum(s == "PASS" for s in status.values())), "pass"),
             Card("checks failed", str(counts["fail"]), "fail" if counts["fail"] else "pass"),
             Card("checks passed", str(counts["pass"])),
             Card("checks skipped", str(counts["skip"]), "skip")]
    return {"cards": cards, "cells": cells, "sets": sets,
            "failures": sorted(groups.values(), key=lambda g: (-len(g.rows), g.name)),
            "skips": sorted(skipped.values(), key=lambda g: (g.name, -len(g.rows))),
            "fleet": [r for r in results if r.host == FLEET],
            "counters": counter_rows(results),
            "racks": rack_rows(doc, results),
            "plots": [*allreduce_plots(doc, results), *thermal_plots(doc, results),
                      *storage_plots(results)]}


def render_conformance(doc: Mapping[str, Any]) -> str:
    """The HTML page of a ``gpufleet.conformance/1`` document."""
    results = results_of(doc)
    return _render("conformance.html.j2", title="gpufleet conformance", header=header(doc),
                   complete=doc.get("complete", True) is not False,
                   **_conformance_parts(doc, results))


def render_drift(doc: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()) -> str:
    """The HTML page of a ``gpufleet.drift/1`` document; ``history``: the runs kept in the
    report directory (``History.documents()``, oldest first; the current run may be among
    them), for the items over time."""
    return _render("drift.html.j2", title="gpufleet drift", **drift_page(doc, history))


def render_acceptance(conformance: Sequence[Mapping[str, Any]], *,
                      bootstrap: Sequence[Mapping[str, Any]] = (),
                      nodes: Sequence[Mapping[str, Any]] = ()) -> str:
    """The acceptance report: its verdict (:class:`Acceptance`), per node the four acceptance
    figures (single-node and multi-node AllReduce, storage read with every node reading,
    temperature under sustained load), every other check, the performance figures and the
    stack's versions.

    ``conformance``: the ``gpufleet.conformance/1`` documents of the runs (a ``--suite all``
    run, or a bootstrap's certify runs); ``bootstrap``: ``gpufleet.bootstrap/1`` documents
    (their steps, and the versions their mark step recorded); ``nodes``:
    ``gpufleet.node/1`` states (``/etc/gpufleet/node.json``)."""
    merged = merge_conformance(conformance)
    results = results_of(merged)
    parts = _conformance_parts(merged, results)
    hosts = set(host_status(results)) | {str(b.get("host")) for b in bootstrap
                                          if b.get("host")}
    rows = acceptance_rows(conformance, results, sorted(hosts, key=natural))
    steps = [(str(b.get("host")), b.get("ready") is True, clip(b.get("reason") or ""),
              [Row(str(s.get("step")), str(s.get("status")), clip(s.get("detail")),
                   "pass" if s.get("status") == "ok" else "fail" if s.get("status") == "failed"
                   else "skip") for s in dicts(b.get("steps"))]) for b in bootstrap]
    verdict = judge(rows, bool(parts["failures"]), (r for _, r, _, _ in steps))
    passed: dict[str, list[str]] = defaultdict(list)
    for r in results:
        if r.outcome == "pass":
            passed[r.name].append(r.host)
    return _render("acceptance.html.j2", title="gpufleet acceptance report",
                   header=header(merged), verdict=verdict, columns=ACCEPTANCE, rows=rows,
                   versions=stack_versions(merged, bootstrap, nodes), steps=steps,
                   figures=figure_summary(results),
                   passed=[(name, fold(h), len(h)) for name, h in sorted(passed.items())],
                   **parts)
