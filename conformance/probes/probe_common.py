"""What every probe shares: JSON-line output, command-line checks, NCCL's safe environment,
and the torch.distributed plumbing of the probes that torchrun starts.

It is shipped beside each probe, so it stands alone as they do (the standard library, and
PyTorch >= 2.1 imported only inside the functions that need it, on Python >= 3.9).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Mapping

    import torch

EXIT_USAGE = 64  # sysexits' EX_USAGE, kept apart from argparse's 2, which means a failed check
# NVLink multicast stays off: on some hosts using it takes the GPUs out of service.
SAFE_ENVIRONMENT = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

_PRINTING = threading.Lock()
# struct tcp_info (linux/tcp.h) up to tcpi_segs_out (Linux 4.2): tcpi_total_retrans is the
# 32-bit field at byte 100, tcpi_segs_out the one at byte 136.
_TCP_INFO_LENGTH = 140
_TOTAL_RETRANS_AT = 100
_SEGS_OUT_AT = 136
MAX_PEERS = 256  # peer addresses one rank reports, so its line stays small
_HOST_BYTES = 256  # room for a host name (at most 253 bytes) in the gather


def emit(event: str, **fields: Any) -> None:
    """Print one JSON line in a single write, so lines of threads or of ranks sharing stdout
    don't mix."""
    line = json.dumps({"event": event, **fields}) + "\n"
    with _PRINTING:
        sys.stdout.write(line)
        sys.stdout.flush()


def tcp_counts(sock: socket.socket) -> tuple[int, int] | None:
    """(segments retransmitted, segments sent) of one TCP socket, from the kernel's
    tcp_info; None for another kind of socket or a kernel older than 4.2."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LENGTH)
    except OSError:
        return None
    if len(info) < _TCP_INFO_LENGTH:
        return None
    return (struct.unpack_from("=I", info, _TOTAL_RETRANS_AT)[0],
            struct.unpack_from("=I", info, _SEGS_OUT_AT)[0])


def tcp_peers(limit: int = MAX_PEERS) -> dict[str, list[int]]:
    """This process's TCP connections summed per peer address: ``[retransmitted, sent]``.
    Read from the sockets while they are open, because the kernel keeps no count per peer
    once a connection has closed; a node's retransmits can then be laid on the path they
    crossed rather than on the sender."""
    peers: dict[str, list[int]] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return peers
    for name in names:
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            counts = tcp_counts(sock) if sock.type == socket.SOCK_STREAM else None
            peer = str(sock.getpeername()[0]).removeprefix("::ffff:") if counts else ""
        except OSError:
            peer = ""
        finally:
            sock.close()
        if counts is None or not peer or (peer not in peers and len(peers) >= limit):
            continue
        entry = peers.setdefault(peer, [0, 0])
        entry[0] += counts[0]
        entry[1] += counts[1]
    return peers


def set_safe_environment() -> None:
    """NCCL's environment before CUDA starts; values the caller set are kept."""
    for key, value in SAFE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


def finite(value: float) -> float | None:
    """The value, or None for NaN and infinities, which JSON cannot carry."""
    return value if math.isfinite(value) else None


def is_memory_error(exc: BaseException) -> bool:
    """An allocation failure, on the host or on a GPU."""
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate" in text)
    )


def exit_now(code: int) -> NoReturn:
    """Leave without tearing down the process group, which could wait on peers mid-collective."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ---------------------------------------------------------------------------- command line


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


class ProbeParser(argparse.ArgumentParser):
    """An argument parser whose errors exit with ``EXIT_USAGE``."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# ------------------------------------------------------------------------ torch.distributed


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job: torchrun's variables, or a world of one without them."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    host: str
    launched: bool

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Placement:
        host = socket.gethostname()
        if "RANK" in environ and "WORLD_SIZE" in environ:
            return cls(
                rank=int(environ["RANK"]),
                local_rank=int(environ.get("LOCAL_RANK", "0")),
                world_size=int(environ["WORLD_SIZE"]),
                local_world_size=int(environ.get("LOCAL_WORLD_SIZE", "1")),
                host=host,
                launched=True,
            )
        return cls(0, 0, 1, 1, host, launched=False)

    def phase(self, name: str) -> None:
        """Report that this rank reached a phase."""
        emit(
            "phase",
            phase=name,
            rank=self.rank,
            local_rank=self.local_rank,
            host=self.host,
            t=time.time(),
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def init_process_group(backend: str, place: Placement, timeout_s: float) -> None:
    """torchrun's rendezvous, or a world of one on a free local port without torchrun."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if place.launched:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{_free_port()}",
            rank=0,
            world_size=1,
            timeout=timeout,
        )


def choose_device(requested: str, place: Placement) -> tuple[str, torch.device]:
    """The backend (``auto`` resolved) and this rank's device, made current for CUDA."""
    import torch

    cuda = torch.cuda.is_available()
    backend = ("nccl" if cuda else "gloo") if requested == "auto" else requested
    if backend == "gloo":
        return backend, torch.device("cpu")
    if not cuda:
        raise SystemExit("--backend nccl needs CUDA, and torch sees no GPU")
    torch.cuda.set_device(place.local_rank)
    return backend, torch.device("cuda", place.local_rank)


def synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(device: torch.device) -> None:
    import torch.distributed as dist

    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def slowest(seconds: float, device: torch.device) -> float:
    """The largest of every rank's ``seconds``."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def gather_hosts(place: Placement, device: torch.device) -> list[str]:
    """Every rank's host name, indexed by rank.

    Padded byte tensors rather than ``all_gather_object``, which needs numpy on some versions.
    """
    import torch
    import torch.distributed as dist

    name = place.host.encode()[:_HOST_BYTES].ljust(_HOST_BYTES, b"\0")
    mine = torch.tensor(list(name), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(mine) for _ in range(place.world_size)]
    dist.all_gather(gathered, mine)
    return [bytes(t.tolist()).rstrip(b"\0").decode(errors="replace") for t in gathered]
