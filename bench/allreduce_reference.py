"""Reference AllReduce timing, independent of gpufleet: plain torch.distributed, nccl-tests'
definitions, one JSON line per size (rank 0). Used to check the fidelity of gpufleet's
AllReduce conformance numbers.

    torchrun --standalone --nproc-per-node 2 bench/allreduce_reference.py        # 2 GPUs, NCCL
    torchrun --standalone --nproc-per-node 2 bench/allreduce_reference.py \\
        --backend gloo -b 64K -e 8M                                            # CPU check

Definitions (as nccl-tests' all_reduce_perf): sizes from -b to -e, multiplied by -f
(K/M/G are powers of 1024); float32 elements; for each size ``--warmup`` untimed
operations, then ``--iters`` back-to-back in-place all_reduce(SUM) timed as one block
(device synchronised before and after); time = block / iters, averaged over ranks;
algbw = bytes / time / 1e9 (GB/s); busbw = algbw * 2 * (n - 1) / n.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from ``64K``, ``1M``, ``8G`` or a plain number (K/M/G = 1024-based)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64K, 1M, 8G)")
    return int(match.group(1)) * UNITS[match.group(2)]


def sizes(begin: int, end: int, factor: int) -> list[int]:
    out, size = [], begin
    while size <= end:
        out.append(size)
        size *= factor
    return out


def bus_factor(world: int) -> float:
    """nccl-tests' AllReduce bus bandwidth factor."""
    return 2 * (world - 1) / world


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1M"))
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("8G"))
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20)
    p.add_argument("-w", "--warmup", type=int, default=5)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto",
                   help="auto: nccl when CUDA is available, else gloo")
    p.add_argument("--timeout-s", type=int, default=600)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    nccl = None
    if backend == "nccl":
        nccl = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    elem = torch.tensor([], dtype=torch.float32).element_size()
    for size in sizes(args.minbytes, args.maxbytes, args.stepfactor):
        count = size // elem
        tensor = torch.ones(count, dtype=torch.float32, device=device)
        dist.all_reduce(tensor)  # correctness: every element is now the world size
        sync()
        correct = bool(torch.all(tensor == float(world)).item())
        for _ in range(args.warmup):
            dist.all_reduce(tensor)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(tensor)
        sync()
        elapsed = (time.perf_counter() - start) / args.iters
        mean = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(mean)
        seconds = mean.item() / world
        algbw = count * elem / seconds / 1e9
        if rank == 0:
            print(json.dumps({
                "size_bytes": count * elem, "count": count, "type": "float",
                "redop": "sum", "inplace": True, "iters": args.iters,
                "time_us": round(seconds * 1e6, 2), "algbw_GBps": round(algbw, 3),
                "busbw_GBps": round(algbw * bus_factor(world), 3), "correct": correct,
                "backend": backend, "world_size": world, "device": str(device.type),
                "torch": torch.__version__, "nccl": nccl,
            }), flush=True)
        del tensor
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
