"""DDP probe: trains a small MLP with DistributedDataParallel and reports in JSON lines on stdout.

It is copied to a node with ``probe_common.py`` and runs there on the standard library and
PyTorch >= 2.1 on Python >= 3.9 alone. torch is imported only when the probe runs, so the
controller can import ``scaling_efficiency`` and ``loss_trend`` without it.

Every rank trains on its share of a synthetic regression set (``y = X @ W + noise`` from a
fixed seed) through a ``DistributedSampler``: warm-up steps, then ``--trials`` runs of
timed steps (``trials``: samples/s of each; the result is their median), after which
the ranks compare parameter checksums and losses; then steps under ``no_sync()``, without
the gradient all-reduce, whose time gives the share of a step spent communicating. The
default model (width 1024, depth 4) costs about 1.3 GFLOP a step at batch 64; ``--width
4096`` about 20 GFLOP. Every rank prints ``phase`` lines (start, rendezvous_done,
first_step_done, done); rank 0 prints one ``result`` line. A rank whose process group fails
to start prints an ``error`` line.

Exit status: 0 when every rank ends with the same parameters and the loss went down, 2 when
not (or when the process group did not start), 64 on a bad command line.

    torchrun --nnodes N --nproc-per-node G --node-rank R --master-addr HOST \\
        --master-port 29500 ddp.py --width 4096
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import TYPE_CHECKING

try:
    from . import probe_common as common
except ImportError:  # run as a script, beside its copy of probe_common.py
    import probe_common as common

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import torch

EXIT_OK = 0
EXIT_FAILED = 2

FEATURES = 256  # inputs per sample
OUTPUTS = 16  # regression targets per sample
SAMPLES = 16384  # at least this many in the data set, and two batches for every rank
NOISE = 0.01
LOSS_TAIL = 5  # steps averaged for the final loss
DEFAULT_LR = {"adam": 1e-3, "sgd": 0.1}

_MODULUS = 2**52  # checksums are kept below it, where float64 holds every integer
_WEIGHT_CYCLE = 65521  # position weights of the second checksum run 1..this, then repeat


def scaling_efficiency(throughput_n: float, n: int, throughput_1: float) -> float:
    """Throughput on ``n`` units as a fraction of ``n`` times the throughput on one."""
    if n < 1 or throughput_1 <= 0:
        raise ValueError(f"need n >= 1 and throughput_1 > 0, got {n}, {throughput_1}")
    return throughput_n / (n * throughput_1)


def loss_trend(losses: Sequence[float], tail: int = LOSS_TAIL) -> tuple[float, float]:
    """``(first, last)``: the first step's loss and the mean over the last ``tail`` steps."""
    if not losses or tail < 1:
        raise ValueError(f"need at least one loss and tail >= 1, got {len(losses)}, {tail}")
    last = losses[-tail:]
    return losses[0], sum(last) / len(last)


def build_parser() -> argparse.ArgumentParser:
    """The probe's command line; errors in it exit with 64 (``EXIT_USAGE``)."""
    parser = common.ProbeParser(description="Train a small MLP with DDP; check and time it.")
    parser.add_argument(
        "--backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="auto: nccl when CUDA is available, else gloo",
    )
    parser.add_argument(
        "--steps", type=common.positive_int, default=30, help="timed training steps"
    )
    parser.add_argument(
        "--warmup-steps",
        type=common.positive_int,
        default=5,
        help="untimed steps before them, the first step among them",
    )
    parser.add_argument(
        "--trials",
        type=common.positive_int,
        default=1,
        help="times the --steps are timed, back to back (the result is their median)",
    )
    parser.add_argument(
        "--comm-steps",
        type=common.nonnegative_int,
        default=10,
        help="steps timed under no_sync() after the check (0: skip)",
    )
    parser.add_argument(
        "--batch-size", type=common.positive_int, default=64, help="samples per rank"
    )
    parser.add_argument(
        "--width", type=common.positive_int, default=1024, help="hidden layer width"
    )
    parser.add_argument(
        "--depth", type=common.positive_int, default=4, help="hidden layers of --width units"
    )
    parser.add_argument(
        "--optimizer",
        choices=sorted(DEFAULT_LR),
        default="adam",
        help="adam (default) learns in a few dozen steps; sgd, with momentum 0.9, needs more",
    )
    parser.add_argument(
        "--lr",
        type=common.positive_float,
        help=f"learning rate (default {DEFAULT_LR['adam']} adam, {DEFAULT_LR['sgd']} sgd)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the model")
    parser.add_argument(
        "--init-timeout-s",
        type=common.positive_float,
        default=120.0,
        help="timeout of init_process_group and of each collective",
    )
    return parser


def build_model(width: int, depth: int) -> torch.nn.Module:
    """``FEATURES`` inputs, ``depth`` ReLU layers of ``width`` units, ``OUTPUTS`` outputs."""
    from torch import nn

    layers: list[nn.Module] = [nn.Linear(FEATURES, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, OUTPUTS))
    return nn.Sequential(*layers)


def make_dataset(samples: int, seed: int) -> torch.utils.data.TensorDataset:
    """The same regression set on every rank: ``y = X @ W / sqrt(FEATURES) + noise``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    w = torch.randn(FEATURES, OUTPUTS, generator=generator) / math.sqrt(FEATURES)
    y = x @ w + NOISE * torch.randn(samples, OUTPUTS, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def param_checksums(model: torch.nn.Module) -> torch.Tensor:
    """Two exact checksums per float32 parameter, as float64 on the parameters' device.

    They are sums of the raw bit patterns, plain and weighted by position. Integer sums wrap
    modulo 2**64 in any order of addition, so equal parameters give equal checksums on any
    device; reduced below 2**52 they stay exact in float64.
    """
    import torch

    sums = []
    for param in model.parameters():
        bits = param.detach().reshape(-1).view(torch.int32).to(torch.int64)
        weights = torch.arange(bits.numel(), device=bits.device) % _WEIGHT_CYCLE + 1
        sums += [bits.sum(), (bits * weights).sum()]
    return (torch.stack(sums) % _MODULUS).to(torch.float64)


def _checksum_spread(model: torch.nn.Module) -> float:
    """The largest difference between ranks in any parameter checksum; 0.0 when all agree."""
    import torch.distributed as dist

    high = param_checksums(model)
    low = high.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return float((high - low).max().item())


def _batches(
    loader: torch.utils.data.DataLoader, sampler: torch.utils.data.DistributedSampler
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches without end, reshuffled by the sampler every epoch."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


class _Trainer:
    """One rank's model, optimizer and data."""

    def __init__(
        self, args: argparse.Namespace, place: common.Placement, device: torch.device
    ) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler

        torch.manual_seed(args.seed)
        local = build_model(args.width, args.depth).to(device)
        self.model = DistributedDataParallel(
            local, device_ids=[device.index] if device.type == "cuda" else None
        )
        lr = args.lr if args.lr is not None else DEFAULT_LR[args.optimizer]
        params = self.model.parameters()
        self.optimizer: torch.optim.Optimizer = (
            torch.optim.Adam(params, lr=lr)
            if args.optimizer == "adam"
            else torch.optim.SGD(params, lr=lr, momentum=0.9)
        )
        data = make_dataset(max(SAMPLES, 2 * place.world_size * args.batch_size), args.seed)
        sampler = DistributedSampler(
            data, num_replicas=place.world_size, rank=place.rank, shuffle=True, seed=args.seed
        )
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)
        self.batches = _batches(loader, sampler)
        self.device = device

    def step(self) -> torch.Tensor:
        """One training step; the loss, left on the device so that nothing waits for it."""
        import torch

        x, y = next(self.batches)
        x = x.to(self.device, non_blocking=True)
        y = y.to(self.device, non_blocking=True)
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def timed(self, steps: int, losses: list[torch.Tensor]) -> float:
        """Seconds this rank took for ``steps`` steps, started together with the other ranks."""
        common.barrier(self.device)
        common.synchronize(self.device)
        start = time.perf_counter()
        for _ in range(steps):
            losses.append(self.step())
        common.synchronize(self.device)
        return time.perf_counter() - start

    def timed_no_sync(self, steps: int) -> float:
        """Like ``timed`` under ``no_sync()``, after one untimed step in that mode."""
        with self.model.no_sync():
            self.step()
            return self.timed(steps, [])


def _mean_losses(losses: list[torch.Tensor], world_size: int) -> list[float]:
    """Each step's loss averaged over the ranks."""
    import torch
    import torch.distributed as dist

    total = torch.stack(losses).to(torch.float64)
    dist.all_reduce(total)
    return [value / world_size for value in total.tolist()]


def run(args: argparse.Namespace, place: common.Placement) -> int:
    """The probe on one rank, from the process group's start to its end; returns the exit code."""
    import torch
    import torch.distributed as dist

    backend, device = common.choose_device(args.backend, place)
    try:
        common.init_process_group(backend, place, args.init_timeout_s)
    except Exception as exc:
        common.emit("error", phase="rendezvous", rank=place.rank, message=str(exc))
        return EXIT_FAILED
    place.phase("rendezvous_done")

    trainer = _Trainer(args, place, device)
    losses = [trainer.step()]
    common.synchronize(device)
    place.phase("first_step_done")
    for _ in range(args.warmup_steps - 1):
        losses.append(trainer.step())
    step_s = [
        common.slowest(trainer.timed(args.steps, losses), device) / args.steps
        for _ in range(args.trials)
    ]
    sync_s = statistics.median(step_s)
    spread = _checksum_spread(trainer.model)
    loss_first, loss_last = loss_trend(_mean_losses(losses, place.world_size))
    nosync_s = None
    if args.comm_steps:
        nosync_s = common.slowest(trainer.timed_no_sync(args.comm_steps), device) / args.comm_steps
    hosts = common.gather_hosts(place, device)

    identical = spread == 0.0
    went_down = loss_last < loss_first
    if place.rank == 0:
        common.emit(
            "result",
            world_size=place.world_size,
            nodes=len(set(hosts)),
            backend=backend,
            steps=args.steps,
            samples_per_s=place.world_size * args.batch_size / sync_s,
            trials=[place.world_size * args.batch_size / t for t in step_s],
            step_time_s=sync_s,
            nosync_step_time_s=nosync_s,
            comm_share=None if nosync_s is None else max(0.0, 1 - nosync_s / sync_s),
            loss_first=common.finite(loss_first),
            loss_last=common.finite(loss_last),
            params_identical=identical,
            param_checksum_spread=spread,
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        )
    place.phase("done")
    dist.destroy_process_group()
    return EXIT_OK if identical and went_down else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, report the start, set NCCL's environment and run."""
    args = build_parser().parse_args(argv)
    place = common.Placement.from_environ(os.environ)
    place.phase("start")
    common.set_safe_environment()
    return run(args, place)


if __name__ == "__main__":
    sys.exit(main())
