"""AllReduce across nodes: the probe's sizes and thresholds, and bisection with node pairs
to name the culprit of a failing or slow multi-node run."""

from __future__ import annotations

from gpufleet.conformance.launch import ProbeRun, run_probe
from gpufleet.conformance.session import Node


def run_allreduce(nodes: list[Node], args: list[str], timeout_s: float,
                  port: int = 29500) -> ProbeRun:
    """The AllReduce probe on ``nodes`` together."""
    return run_probe("allreduce", nodes, args, timeout_s, port=port)


def threshold(node: Node, nodes: int) -> float | None:
    """The minimum busbw (GB/s) at the largest size for this node's GPU model and ``nodes``.

    ``allreduce_busbw_thresholds`` maps a GPU model as nvidia-smi names it (or ``cpu``) to
    node counts and GB/s; the entry for the largest count not above ``nodes`` applies.
    """
    table = node.var("allreduce_busbw_thresholds") or {}
    counts = {int(k): float(v) for k, v in (table.get(gpu_model(node)) or {}).items()}
    eligible = [k for k in counts if k <= nodes]
    return counts[max(eligible)] if eligible else None


def gpu_model(node: Node) -> str:
    """The node's GPU model as nvidia-smi names it, or ``cpu``."""
    gpus = node.facts.get("gpus") if node.facts else None
    return str(gpus[0].get("name")) if gpus else "cpu"


def probe_args(node: Node) -> list[str]:
    """Sizes and iterations from the inventory (``allreduce_sizes``, ``allreduce_iters``)."""
    args = []
    sizes = node.var("allreduce_sizes")
    if sizes:
        args += ["--sizes", ",".join(map(str, sizes)) if isinstance(sizes, list) else str(sizes)]
    iters = node.var("allreduce_iters")
    if iters:
        args += ["--iters", str(iters)]
    return args


def bisect(nodes: list[Node], args: list[str], timeout_s: float, port: int
           ) -> dict[str, str]:
    """Pair the first node with each other node to name the ones that fail or are slow.

    Returns node -> reason. When every pair fails, the first node is the suspect.
    """
    reference, others = nodes[0], nodes[1:]
    verdicts: dict[str, str] = {}
    busbw: dict[str, float] = {}
    for other in others:
        pair = run_allreduce([reference, other], args, timeout_s, port)
        problem = pair.error()
        if problem:
            verdicts[other.name] = f"pair with {reference.name} failed: {problem}"
        elif pair.largest:
            busbw[other.name] = float(pair.largest["busbw"])
    if others and len(verdicts) == len(others):
        return {reference.name: f"every pair with {reference.name} failed"}
    if busbw:
        best = max(busbw.values())
        for name, value in busbw.items():
            if value < 0.5 * best:
                verdicts[name] = (f"pair with {reference.name} reached {value:.2f} GB/s busbw, "
                                  f"under half the best pair ({best:.2f})")
    return verdicts
