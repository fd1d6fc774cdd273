"""P2P probe: copy bandwidth between every pair of a node's GPUs and to and from the host.

It is copied to a node with ``probe_common.py`` and runs there on the standard library and
PyTorch >= 2.1 on Python >= 3.9 alone. torch is imported only when the probe runs, so the
controller can import ``trials_by_figure`` without it.

For every ordered pair of GPUs it times ``dst.copy_(src, non_blocking=True)`` with CUDA
events after a warm-up, and likewise host-to-device and device-to-host copies from pinned
memory; GB/s are 1e9 bytes per second. With ``--trials K`` every copy is timed K times
(``trials``) and ``gbps`` is their median. It prints a ``pair`` line per pair, an ``h2d`` and a
``d2h`` line per GPU and a ``summary``. Without a CUDA GPU it prints one ``skip`` line.

Exit status: 0 when every copy was timed (or skipped), 3 when a buffer did not fit in
memory, 64 on a bad command line.

    python p2p.py --size-mb 1024 --iters 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import TYPE_CHECKING, Any

try:
    from . import probe_common as common
except ImportError:  # run as a script, beside its copy of probe_common.py
    import probe_common as common

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

EXIT_OK = 0
EXIT_MEMORY = 3

MIB = 1024**2
WARMUP = 2  # untimed copies before each timing


def figure_name(line: dict[str, Any]) -> str:
    """The name a ``pair``, ``h2d`` or ``d2h`` line's figure is gated and recorded under:
    ``p2p.GPU0->GPU1``, ``h2d.GPU0``, ``d2h.GPU0``."""
    if line.get("event", "pair") == "pair":
        return f"p2p.GPU{line['src']}->GPU{line['dst']}"
    return f"{line['event']}.GPU{line['gpu']}"


def trials_by_figure(lines: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Every copy's timings (``trials``, or its one ``gbps``) by figure name; other events
    are passed over."""
    return {
        figure_name(line): [float(x) for x in line.get("trials") or [line["gbps"]]]
        for line in lines
        if line.get("event", "pair") in ("pair", "h2d", "d2h")
    }


def build_parser() -> argparse.ArgumentParser:
    """The probe's command line; errors in it exit with 64 (``EXIT_USAGE``)."""
    parser = common.ProbeParser(description="Time copies between GPUs and between host and GPU.")
    parser.add_argument(
        "--size-mb", type=common.positive_int, default=1024, help="MiB per copy (default 1024)"
    )
    parser.add_argument("--iters", type=common.positive_int, default=10, help="timed copies")
    parser.add_argument(
        "--trials", type=common.positive_int, default=1, help="timings of every copy (median)"
    )
    return parser


def _gbps(dst: torch.Tensor, src: torch.Tensor, timer: int, iters: int) -> float:
    """GB/s of ``dst.copy_(src)``, timed with events on GPU ``timer``'s current stream.

    PyTorch runs a copy between GPUs on the source GPU's current stream, ordered after and
    before work on the destination's, so events there bracket it whole.
    """
    import torch

    with torch.cuda.device(timer):
        for _ in range(WARMUP):
            dst.copy_(src, non_blocking=True)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    return src.numel() * src.element_size() * iters / seconds / 1e9


def _trials(dst: torch.Tensor, src: torch.Tensor, timer: int, args: argparse.Namespace
            ) -> dict[str, Any]:
    """``gbps`` (the median) and ``trials`` (every timing) of ``args.trials`` timings."""
    trials = [_gbps(dst, src, timer, args.iters) for _ in range(args.trials)]
    return {"gbps": statistics.median(trials), "trials": trials}


def _buffers(size: int, gpus: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """A source and a destination buffer of ``size`` bytes on every GPU, and one pinned."""
    import torch

    sources = [torch.ones(size, dtype=torch.uint8, device=f"cuda:{i}") for i in range(gpus)]
    targets = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}") for i in range(gpus)]
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(1)
    return sources, targets, host


def run(args: argparse.Namespace) -> int:
    """Time every copy; returns the exit code."""
    import torch

    if not torch.cuda.is_available():
        common.emit("skip", reason="no CUDA GPU")
        return EXIT_OK
    gpus = torch.cuda.device_count()
    size = args.size_mb * MIB
    try:
        sources, targets, host = _buffers(size, gpus)
    except Exception as exc:
        if not common.is_memory_error(exc):
            raise
        common.emit("error", size=size, message=str(exc))
        return EXIT_MEMORY

    for i in range(gpus):
        for j in range(gpus):
            if i != j:
                common.emit(
                    "pair",
                    src=i,
                    dst=j,
                    **_trials(targets[j], sources[i], i, args),
                    peer_access=torch.cuda.can_device_access_peer(i, j),
                )
    for i in range(gpus):
        common.emit("h2d", gpu=i, **_trials(targets[i], host, i, args))
        common.emit("d2h", gpu=i, **_trials(host, sources[i], i, args))
    common.emit("summary", gpus=gpus, devices=[torch.cuda.get_device_name(i) for i in range(gpus)])
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, set the environment before CUDA starts, and run."""
    args = build_parser().parse_args(argv)
    common.set_safe_environment()
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
