"""The DDP probe as a job: its arguments from the inventory (``ddp_steps``,
``ddp_batch_size``, ``ddp_width``, ``ddp_depth``), its launch under ``ddp_timeout_s``, and
its result line; for the ddp suite and for ``gpufleet tune``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.conformance.launch import ProbeRun, rendezvous_port, run_probe
from gpufleet.conformance.session import Node
from gpufleet.conformance.suites.ddp import DdpSettings


def probe_args(node: Node) -> list[str]:
    settings = node.typed(DdpSettings)
    args = ["--steps", str(settings.ddp_steps), "--batch-size", str(settings.ddp_batch_size)]
    for value, flag in ((settings.ddp_width, "--width"), (settings.ddp_depth, "--depth")):
        if value is not None:
            args += [flag, str(value)]
    return args


def run_job(nodes: list[Node], trials: int, nproc: int | None = None,
            env: Mapping[str, str] | None = None) -> ProbeRun:
    """The job on ``nodes`` together, ``nproc`` processes each (default: one per GPU)."""
    first = nodes[0]
    return run_probe("ddp", nodes, [*probe_args(first), "--trials", str(trials)],
                     first.typed(DdpSettings).ddp_timeout_s, port=rendezvous_port(first),
                     nproc=nproc, env=env)


def result_line(run: ProbeRun) -> dict[str, Any] | None:
    """The job's result line (rank 0's), or None."""
    return next((e for o in run.outputs.values() for e in o.events
                 if e.get("event") == "result"), None)
