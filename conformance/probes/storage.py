"""Storage probe: read throughput of a dataset path, in one JSON line on stdout.

It is copied to a node with ``probe_common.py`` and runs there on the standard library on
Python >= 3.9 alone; the controller imports ``need_mbps``.

Test files live in ``PATH/.gpufleet-storage/``: one large file per reader and many small
ones, written once with fixed content (through a temporary name, renamed only when complete
and synced) and reused by later runs. Before each test the probe asks the kernel to drop them
from the page cache, then measures sequential reads (every reader thread its own file) and
reads of the small files in a shuffled order; with ``--trials K`` each test runs K times
(every time from a dropped cache) and the result carries every trial and their medians.
Sizes on the command line are binary (KiB, MiB, GiB); rates are in MB/s of 1e6 bytes.

Several nodes read at the same moment when each is first run with ``--prepare`` (write the
files, print ``prepared``) and then with ``--start-at EPOCH``: the reads begin at that wall
clock time, and the result carries when the sequential reads started and ended
(``seq_start``, ``seq_end``, epoch seconds) and how late the start was (``late_s``), from
which the controller computes the nodes' aggregate throughput.

Exit status: 0 after the result (or the cleanup), 3 when the path does not exist or is not
writable, 64 on a bad command line.

    python storage.py --path /data --file-gb 1 --readers 4
    python storage.py --path /data --prepare
    python storage.py --path /data --start-at 1767225600.0
    python storage.py --path /data --cleanup
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    from . import probe_common as common
except ImportError:  # run as a script, beside its copy of probe_common.py
    import probe_common as common

if TYPE_CHECKING:
    from collections.abc import Sequence

EXIT_OK = 0
EXIT_PATH = 3

TEST_DIR = ".gpufleet-storage"
SEED = 0
KIB, MIB, GIB = 1024, 1024**2, 1024**3
_CHUNK = MIB  # files are written a chunk at a time
_PAGE = 4 * KIB  # every page of a file is stamped with its file and offset


def need_mbps(dataset_gb: float, epoch_minutes: float, nodes: int) -> float:
    """MB/s each node must read to get through ``dataset_gb`` (1e9 bytes) in one epoch."""
    if dataset_gb < 0 or epoch_minutes <= 0 or nodes < 1:
        raise ValueError(
            f"need dataset_gb >= 0, epoch_minutes > 0 and nodes >= 1, "
            f"got {dataset_gb}, {epoch_minutes}, {nodes}"
        )
    return dataset_gb * 1e9 / (epoch_minutes * 60) / nodes / 1e6


def build_parser() -> argparse.ArgumentParser:
    """The probe's command line; errors in it exit with 64 (``EXIT_USAGE``)."""
    parser = common.ProbeParser(description="Measure read throughput of a dataset path.")
    parser.add_argument("--path", required=True, type=Path, help="directory of the dataset")
    parser.add_argument(
        "--file-gb", type=common.positive_float, default=1.0, help="GiB of the file of each reader"
    )
    parser.add_argument("--readers", type=common.positive_int, default=4, help="reader threads")
    parser.add_argument("--small-files", type=common.positive_int, default=2000, help="small files")
    parser.add_argument(
        "--small-kb", type=common.positive_int, default=64, help="KiB per small file"
    )
    parser.add_argument(
        "--block-mb", type=common.positive_int, default=16, help="MiB per read call"
    )
    parser.add_argument(
        "--trials", type=common.positive_int, default=1, help="timed reads of each kind"
    )
    parser.add_argument("--cleanup", action="store_true", help="remove the test files and exit")
    parser.add_argument("--prepare", action="store_true", help="write the test files and exit")
    parser.add_argument(
        "--start-at", type=common.positive_float, help="begin reading at this epoch time"
    )
    return parser


class _Content:
    """The fixed bytes of the test files: a random chunk with every page stamped.

    The stamps make every page of every file different, so deduplicating storage cannot
    serve the reads from one copy; the random rest defeats compression.
    """

    def __init__(self) -> None:
        self.pattern = random.Random(SEED).randbytes(_CHUNK)

    def chunk(self, name: str, offset: int, size: int) -> bytearray:
        """``size`` bytes (at most a chunk) of file ``name`` from ``offset``."""
        data = bytearray(self.pattern[:size])
        for page in range(0, size, _PAGE):
            stamp = f"{name}@{offset + page};".encode()[: min(_PAGE, size - page)]
            data[page : page + len(stamp)] = stamp
        return data


def _ensure(path: Path, size: int, content: _Content) -> bool:
    """Make ``path`` a complete test file of ``size`` bytes; True when it had to be written.

    A file of the right size is complete, as files are renamed into place only when whole.
    """
    if path.is_file() and path.stat().st_size == size:
        return False
    temporary = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as out:
            for offset in range(0, size, _CHUNK):
                out.write(content.chunk(path.name, offset, min(_CHUNK, size - offset)))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return True


def _drop_cache(paths: Sequence[Path]) -> str:
    """Ask the kernel to evict the files' cached pages; "" when it took the request, else why
    it could not."""
    if not hasattr(os, "posix_fadvise"):
        return "posix_fadvise is unavailable: reads may have come from the page cache"
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            return f"posix_fadvise failed ({exc}): reads may have come from the page cache"
        finally:
            os.close(fd)
    return ""


def _read_whole(path: Path, block: int) -> int:
    """Read ``path`` to its end in ``block``-byte calls; the bytes read."""
    view = memoryview(bytearray(block))
    total = 0
    with open(path, "rb", buffering=0) as source:
        while True:
            count = source.readinto(view)
            if not count:
                return total
            total += count


def _read_small(paths: Sequence[Path]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as source:
            total += len(source.read())
    return total


def _timed_reads(readers: int, jobs: list[tuple[Any, ...]]) -> tuple[int, float]:
    """Run ``(function, *args)`` jobs on ``readers`` threads; total bytes and wall seconds."""
    with ThreadPoolExecutor(max_workers=readers) as pool:
        start = time.perf_counter()
        futures = [pool.submit(*job) for job in jobs]
        total = sum(future.result() for future in futures)
        return total, time.perf_counter() - start


def _wait_until(epoch: float | None) -> float:
    """Sleep until ``epoch`` (wall clock); how many seconds late it already was (0 if on
    time, or when there is no start time)."""
    if epoch is None:
        return 0.0
    left = epoch - time.time()
    if left > 0:
        time.sleep(left)
        return 0.0
    return -left


def _cleanup(root: Path) -> int:
    removed = root.is_dir()
    if removed:
        shutil.rmtree(root)
    common.emit("cleanup", path=str(root), removed=removed)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Prepare the test files and read them; returns the exit code."""
    base = args.path.resolve()
    if not base.is_dir():
        common.emit(
            "error", path=str(base), message="the path does not exist or is not a directory"
        )
        return EXIT_PATH
    root = base / TEST_DIR
    if args.cleanup:
        return _cleanup(root)
    if not os.access(base, os.W_OK):
        common.emit("error", path=str(base), message="the path is not writable")
        return EXIT_PATH

    large = [root / f"seq-{i}.bin" for i in range(args.readers)]
    small = [root / "small" / f"{i:06d}.bin" for i in range(args.small_files)]
    content = _Content()
    try:
        (root / "small").mkdir(parents=True, exist_ok=True)
        created = sum(_ensure(path, int(args.file_gb * GIB), content) for path in large)
        created += sum(_ensure(path, args.small_kb * KIB, content) for path in small)
    except OSError as exc:
        common.emit("error", path=str(base), message=f"cannot write the test files: {exc}")
        return EXIT_PATH
    if args.prepare:
        common.emit("prepared", path=str(base), created_files=created)
        return EXIT_OK

    block = args.block_mb * MIB
    late = _wait_until(args.start_at)
    seq_start = time.time()
    seq: list[float] = []
    seq_bytes, problem = 0, ""
    for _ in range(args.trials):
        problem = problem or _drop_cache(large)
        count, seconds = _timed_reads(args.readers, [(_read_whole, p, block) for p in large])
        seq_bytes += count
        seq.append(count / seconds / 1e6)
    seq_end = time.time()

    files, mbps = [], []
    for trial in range(args.trials):
        problem = problem or _drop_cache(small)
        order = list(small)
        random.Random(SEED + trial).shuffle(order)
        shares = [(_read_small, order[k :: args.readers]) for k in range(args.readers)]
        small_bytes, small_s = _timed_reads(args.readers, shares)
        files.append(len(small) / small_s)
        mbps.append(small_bytes / small_s / 1e6)

    fields: dict[str, Any] = {"note": problem} if problem else {}
    if args.start_at is not None:
        fields.update(seq_start=seq_start, seq_end=seq_end, late_s=late)
    common.emit(
        "result",
        path=str(base),
        seq_read_mbps=statistics.median(seq),
        seq_trials=seq,
        readers=args.readers,
        bytes_read=seq_bytes,
        small_files_per_s=statistics.median(files),
        small_trials=files,
        small_read_mbps=statistics.median(mbps),
        small_files=len(small),
        created_files=created,
        cache_dropped=not problem,
        trials=args.trials,
        **fields,
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
