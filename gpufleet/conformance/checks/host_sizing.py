"""Host sizing verdicts that need a fact of their own: the size of /dev/shm.

NCCL's shared-memory transport and PyTorch's DataLoader workers put their buffers in
/dev/shm; a node whose /dev/shm was mounted small (a ``size=64m`` in fstab, a container
runtime's 64 MB default) fails training with bus errors or NCCL's "unhandled system error"
rather than with a clear message.
"""

from __future__ import annotations

from gpufleet.errors import ParseError
from gpufleet.facts.catalog import Fact


def parse_shm(text: str) -> int:
    """``df -P -B1 /dev/shm`` -> the filesystem's size in bytes."""
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 6 and fields[5] == "/dev/shm" and fields[1].isdigit():
            return int(fields[1])
    raise ParseError(f"no /dev/shm in df output: {text[:80]!r}")


SHM = Fact("shm_bytes", "df -P -B1 /dev/shm", parse_shm, "df")


def shm_problem(size_bytes: int, min_gb: float) -> str | None:
    """Why /dev/shm is too small for training on the node (None when it is not)."""
    if size_bytes >= min_gb * 1e9:
        return None
    return (f"/dev/shm is {size_bytes / 1e9:.2f} GB, below host_min_shm_gb {min_gb:g}: NCCL's "
            "shared-memory transport and DataLoader workers run out of it")
