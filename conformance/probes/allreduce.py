"""AllReduce probe: torchrun starts it on every node, and it reports in JSON lines on stdout.

It is copied to a node with ``probe_common.py`` and runs there on the standard library and
PyTorch >= 2.1 on Python >= 3.9 alone. torch is imported only when the probe runs, so the
controller can import ``parse_sizes`` and ``bus_bandwidth`` without it.

Every rank prints ``phase`` lines (start, rendezvous_done, first_collective_done, done) so a
hung run can be pinned to a phase; rank 0 prints a ``result`` line per message size (with
``--trials K``, busbw of every timing in ``busbw_trials`` and their median) and a
``summary``. A rank that runs out of memory prints an ``error`` line. Before it ends, every
rank prints a ``tcp`` line: its open TCP connections' segments, retransmitted and sent, per
peer address (the NIC counters lay retransmits on the path they crossed).

With ``--nccl-log NCCL_DEBUG=INFO`` (repeatable: NCCL_DEBUG, NCCL_DEBUG_SUBSYS,
NCCL_DEBUG_FILE) the settings are put in the environment before NCCL starts, on the NCCL
backend only, so NCCL's INFO log (its channels and their transports) reaches stdout.

Exit status: 0 when every element summed right, 2 when any was wrong, 3 on a memory error,
64 on a bad command line.

    torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr HOST \\
        --master-port 29500 allreduce.py --sizes 1M,1G,8G
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from typing import TYPE_CHECKING, NamedTuple

try:
    from . import probe_common as common
except ImportError:  # run as a script, beside its copy of probe_common.py
    import probe_common as common

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

EXIT_OK = 0
EXIT_WRONG = 2
EXIT_MEMORY = 3

DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_SIZES = {"gloo": "1M,16M,64M,256M", "nccl": "1M,16M,256M,1G,4G,8G"}
DEFAULT_ITERS = {"gloo": 5, "nccl": 20}
DEFAULT_WARMUP = {"gloo": 2, "nccl": 5}
# Every integer from 0 up to this bound is exact in the dtype.
EXACT_INTEGERS = {"float32": 2**24, "bfloat16": 2**8, "float16": 2**11}

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SIZE = re.compile(r"(\d+)([KMG]?)", re.IGNORECASE)
_CHECK_CHUNK = 64 * 1024**2  # elements compared at a time, to bound the mask's memory
NCCL_LOG_KEYS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")


def parse_sizes(text: str) -> list[int]:
    """Byte counts from a comma list such as ``1K,64M,8G`` (K, M and G are powers of 1024)."""
    sizes = []
    for item in text.split(","):
        found = _SIZE.fullmatch(item.strip())
        if found is None or int(found[1]) == 0:
            raise ValueError(f"bad message size {item.strip()!r} in {text!r}")
        sizes.append(int(found[1]) * _UNITS[found[2].upper()])
    return sizes


def bus_bandwidth(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1e9 bytes) of one all-reduce, as nccl-tests defines them."""
    if seconds <= 0 or world_size < 1:
        raise ValueError(f"need seconds > 0 and world_size >= 1, got {seconds}, {world_size}")
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def fill_values(world_size: int, dtype: str) -> list[int]:
    """The integer each rank fills its buffer with, indexed by rank.

    float32 uses ``rank + 1`` and 16-bit types ``(rank % 8) + 1``. The cycle shrinks when the
    sum would leave the dtype's exact integers, and past them further ranks fill zeros, so the
    sum and every partial sum of a reduction in any order stay exact.
    """
    limit = EXACT_INTEGERS[dtype]
    cycle = world_size if dtype == "float32" else 8
    while cycle > 1 and _cycle_sum(world_size, cycle) > limit:
        cycle //= 2
    return [(rank % cycle) + 1 if rank < limit else 0 for rank in range(world_size)]


def _cycle_sum(world_size: int, cycle: int) -> int:
    """Sum of ``(rank % cycle) + 1`` over all ranks."""
    full, rest = divmod(world_size, cycle)
    return full * cycle * (cycle + 1) // 2 + rest * (rest + 1) // 2


class Measurement(NamedTuple):
    """One message size, agreed by all ranks."""

    seconds: float  # the slowest rank's time per all-reduce (median of the trials)
    wrong: int  # elements off the expected sum, over all ranks
    iters: int  # timed all-reduces per trial
    trials: list[float]  # the slowest rank's time per all-reduce in each trial


def _sizes(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _nccl_log_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or key not in NCCL_LOG_KEYS:
        raise argparse.ArgumentTypeError(
            f"bad --nccl-log {text!r}: want KEY=VALUE, KEY one of {', '.join(NCCL_LOG_KEYS)}"
        )
    return key, value


def nccl_log_environment(backend: str, settings: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The ``--nccl-log`` settings to put in the environment: on the NCCL backend only
    (gloo has no NCCL to log)."""
    return dict(settings) if backend == "nccl" else {}


def build_parser() -> argparse.ArgumentParser:
    """The probe's command line; errors in it exit with 64 (``EXIT_USAGE``)."""
    parser = common.ProbeParser(description="Time and check torch.distributed all_reduce.")
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="auto: nccl when CUDA is available, else gloo",
    )
    parser.add_argument(
        "--sizes",
        type=_sizes,
        help="message sizes in bytes, K/M/G = 1024 multiples "
        f"(default {DEFAULT_SIZES['gloo']} for gloo, {DEFAULT_SIZES['nccl']} for nccl)",
    )
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument(
        "--iters", type=common.positive_int, help="timed all-reduces (20 nccl, 5 gloo)"
    )
    parser.add_argument(
        "--warmup", type=common.nonnegative_int, help="untimed first (5 nccl, 2 gloo)"
    )
    parser.add_argument(
        "--init-timeout-s",
        type=common.positive_float,
        default=120.0,
        help="timeout of init_process_group and of each collective",
    )
    parser.add_argument(
        "--trials",
        type=common.positive_int,
        default=1,
        help="timings of --iters all-reduces per size (busbw is their median)",
    )
    parser.add_argument(
        "--max-seconds-per-size",
        type=common.positive_float,
        help="time single all-reduces first, then cut warmup and iterations to fit these seconds",
    )
    parser.add_argument(
        "--nccl-log",
        type=_nccl_log_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="NCCL_DEBUG, NCCL_DEBUG_SUBSYS or NCCL_DEBUG_FILE for the run (NCCL backend only)",
    )
    return parser


def _timed(view: torch.Tensor, iters: int) -> float:
    """Seconds per all-reduce on this rank, over ``iters`` back-to-back operations."""
    import torch.distributed as dist

    common.synchronize(view.device)
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(view)
    common.synchronize(view.device)
    return (time.perf_counter() - start) / iters


def _count_wrong(view: torch.Tensor, expected: int) -> torch.Tensor:
    """Elements of ``view`` unequal to ``expected``, counted on its device."""
    import torch

    wrong = torch.zeros(1, dtype=torch.int64, device=view.device)
    for chunk in view.split(_CHECK_CHUNK):
        wrong += (chunk != expected).sum()
    return wrong


def measure(
    view: torch.Tensor,
    fill: int,
    expected: int,
    *,
    iters: int,
    warmup: int,
    max_seconds: float | None,
    trials: int = 1,
) -> Measurement:
    """Check one all-reduce of ``view`` filled with ``fill``, then time ``iters`` more."""
    import torch.distributed as dist

    view.fill_(fill)
    dist.all_reduce(view)
    wrong = _count_wrong(view, expected)
    if max_seconds is not None:
        # The faster of two single operations, as the first may carry one-off set-up costs.
        one = common.slowest(min(_timed(view, 1), _timed(view, 1)), view.device)
        fit = max(1, int(max_seconds / one))
        iters, warmup = min(iters, fit), min(warmup, fit)
    for _ in range(warmup):
        dist.all_reduce(view)
    times = []
    for _ in range(trials):
        common.barrier(view.device)
        times.append(common.slowest(_timed(view, iters), view.device))
    dist.all_reduce(wrong)
    return Measurement(statistics.median(times), int(wrong.item()), iters, times)


def _allocate(count: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, str]:
    """A buffer of ``count`` elements and "", or an empty one and the memory error's message."""
    import torch

    try:
        return torch.empty(count, dtype=dtype, device=device), ""
    except Exception as exc:
        if not common.is_memory_error(exc):
            raise
        return torch.empty(0, dtype=dtype, device=device), str(exc)


def _nccl_version() -> str | None:
    import torch
    import torch.distributed as dist

    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    major, minor, patch, *suffix = torch.cuda.nccl.version()
    return f"{major}.{minor}.{patch}" + "".join(str(part) for part in suffix)


def _report_summary(
    place: common.Placement, backend: str, device: torch.device, sizes: int
) -> None:
    """Rank 0 prints the job's shape and software; every rank takes part in gathering hosts."""
    import torch

    hosts = common.gather_hosts(place, device)
    if place.rank != 0:
        return
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    common.emit(
        "summary",
        world_size=place.world_size,
        nodes=len(set(hosts)),
        local_world_size=place.local_world_size,
        backend=backend,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=_nccl_version(),
        devices=[torch.cuda.get_device_name(i) for i in range(gpus)],
        sizes=sizes,
    )


def run(args: argparse.Namespace, place: common.Placement) -> int:
    """The probe on one rank, from the process group's start to its end; returns the exit code."""
    import torch
    import torch.distributed as dist

    backend, device = common.choose_device(args.backend, place)
    os.environ.update(nccl_log_environment(backend, args.nccl_log))
    sizes = args.sizes or parse_sizes(DEFAULT_SIZES[backend])
    iters = args.iters if args.iters is not None else DEFAULT_ITERS[backend]
    warmup = args.warmup if args.warmup is not None else DEFAULT_WARMUP[backend]
    dtype = getattr(torch, args.dtype)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if min(sizes) < itemsize:
        sys.stderr.write(f"message size {min(sizes)} is below one {args.dtype} element\n")
        return common.EXIT_USAGE
    counts = [size // itemsize for size in sizes]

    common.init_process_group(backend, place, args.init_timeout_s)
    place.phase("rendezvous_done")
    dist.all_reduce(torch.ones(1, device=device))
    common.synchronize(device)
    place.phase("first_collective_done")

    buf, failure = _allocate(max(counts), dtype, device)
    failed = torch.tensor([1 if failure else 0], device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item():
        if failure:
            common.emit("error", size=max(counts) * itemsize, rank=place.rank, message=failure)
        dist.destroy_process_group()
        return EXIT_MEMORY

    values = fill_values(place.world_size, args.dtype)
    wrong_total = 0
    for count in counts:
        size = count * itemsize
        try:
            got = measure(
                buf[:count],
                values[place.rank],
                sum(values),
                iters=iters,
                warmup=warmup,
                max_seconds=args.max_seconds_per_size,
                trials=args.trials,
            )
        except Exception as exc:
            if not common.is_memory_error(exc):
                raise
            common.emit("error", size=size, rank=place.rank, message=str(exc))
            common.exit_now(EXIT_MEMORY)
        wrong_total += got.wrong
        if place.rank == 0:
            algbw, busbw = bus_bandwidth(size, got.seconds, place.world_size)
            common.emit(
                "result",
                size=size,
                count=count,
                dtype=args.dtype,
                time_us=got.seconds * 1e6,
                algbw=algbw,
                busbw=busbw,
                wrong=got.wrong,
                world_size=place.world_size,
                backend=backend,
                iters=got.iters,
                busbw_trials=[bus_bandwidth(size, t, place.world_size)[1] for t in got.trials],
            )

    _report_summary(place, backend, device, len(counts))
    common.emit("tcp", rank=place.rank, peers=common.tcp_peers())
    place.phase("done")
    dist.destroy_process_group()
    return EXIT_WRONG if wrong_total else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, report the start, set NCCL's environment and run."""
    args = build_parser().parse_args(argv)
    place = common.Placement.from_environ(os.environ)
    place.phase("start")
    common.set_safe_environment()
    return run(args, place)


if __name__ == "__main__":
    sys.exit(main())
