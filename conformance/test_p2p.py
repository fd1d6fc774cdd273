"""p2p: GPU-to-GPU copy bandwidth for every GPU pair, and host-to-device / device-to-host,
through PyTorch, against thresholds per GPU model (and, with --compare-baseline, the node's
own baseline); every copy is timed ``perf_trials`` times after a warm-up, gated on the
median, and a median just under its gate is re-measured with more trials; the slow pair is
named. With a training image (``--image``, ``container_image``) the probe runs in it.

Variables: p2p_min_gbps ({model: GB/s}), h2d_min_gbps ({model: GB/s}, also for d2h),
p2p_size_mb (1024), p2p_timeout_s (600), perf_trials and the other verdict variables.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpufleet.conformance.baseline import judge_node
from gpufleet.conformance.launch import NodeOutput, run_script
from gpufleet.conformance.measure.allreduce import gpu_model
from gpufleet.conformance.session import ConformanceSession, Node, RecordProperty
from gpufleet.conformance.suites.p2p import P2pSettings
from gpufleet.conformance.verdict import Figure, failures, properties, settings
from gpufleet.suites.probes.p2p import trials_by_figure


def _threshold(node: Node, floors: dict[str, Any] | None) -> float | None:
    value = (floors or {}).get(gpu_model(node))
    return None if value is None else float(value)


def _run(node: Node, trials: int) -> NodeOutput:
    settings = node.typed(P2pSettings)
    output = run_script(node, "p2p", ["--size-mb", str(settings.p2p_size_mb),
                                      "--trials", str(trials)],
                        settings.p2p_timeout_s, in_image=True)
    if output.rc != 0:
        pytest.fail(f"unknown: the p2p probe failed (exit {output.rc}): {output.stderr_tail}")
    return output


def test_p2p_bandwidth(node: Node, conformance: ConformanceSession,
                       record_property: RecordProperty) -> None:
    if not node.known.get("gpus"):
        pytest.skip(f"no NVIDIA GPU: {node.known.why_absent('gpus')}")
    start = time.monotonic()
    output = _run(node, settings(node.host).trials)
    cost = time.monotonic() - start
    pairs = [e for e in output.events if e.get("event") == "pair"]
    h2d = [e for e in output.events if e.get("event") in ("h2d", "d2h")]
    conformance.add_report("p2p", node.name, {"pairs": pairs, "host": h2d})
    record_property("pairs", {f"{p['src']}->{p['dst']}": round(p["gbps"], 1) for p in pairs})
    record_property("host", {f"{e['event']}{e['gpu']}": round(e["gbps"], 1) for e in h2d})
    first = trials_by_figure(pairs + h2d)
    typed = node.typed(P2pSettings)
    pair_floor = _threshold(node, typed.p2p_min_gbps)
    host_floor = _threshold(node, typed.h2d_min_gbps)
    figures = [Figure(name, "GB/s", pair_floor if name.startswith("p2p.") else host_floor)
               for name in first]
    verdicts = judge_node(
        node, conformance.options.baseline, figures,
        lambda trials: trials_by_figure(_run(node, trials).events), first=first, cost_s=cost)
    record_property("verdicts", properties(verdicts))
    problems = failures(verdicts)
    assert not problems, "; ".join(problems)
