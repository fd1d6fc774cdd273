"""Thermal probe: loads every GPU of a node with bf16 matmuls while nvidia-smi samples it.

It is copied to a node with ``probe_common.py`` and runs there on the standard library and
PyTorch >= 2.1 on Python >= 3.9 alone. torch is imported only when the probe runs, so the
controller can import ``parse_sample_line``, ``mirror_score`` and ``thermal_verdict``.

One ``sample`` line per GPU and interval, then a ``summary`` with each GPU's matmul TFLOPS
over the whole load and in ``--trials`` equal windows after ``--warmup-s`` (``tflops_trials``).
GPU numbers are nvidia-smi's indices; torch is set to the same PCI bus order. Without a CUDA
GPU it prints one ``skip`` line.

Exit status: 0 when the load ran (or was skipped), 2 when it failed on a GPU (an ``error``
line names it, and its TFLOPS are null), 3 when nvidia-smi could not sample the GPUs, 64 on a
bad command line.

    python thermal.py --seconds 300 --size 8192
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

try:
    from . import probe_common as common
except ImportError:  # run as a script, beside its copy of probe_common.py
    import probe_common as common

if TYPE_CHECKING:
    from collections.abc import Sequence

EXIT_OK = 0
EXIT_LOAD = 2
EXIT_SAMPLER = 3

QUERY = (
    "timestamp",
    "index",
    "temperature.gpu",
    "power.draw",
    "clocks.sm",
    "clocks_event_reasons.active",
    "clocks_event_reasons.hw_thermal_slowdown",
    "clocks_event_reasons.hw_power_brake_slowdown",
    "clocks_event_reasons.sw_thermal_slowdown",
)
# Bits of the reasons mask (NVML's nvmlClocksEventReason*).
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
# Drivers before the clocks_event_reasons names know the same fields by their old name.
_OLD_PREFIX = "clocks_throttle_reasons."
_NEW_PREFIX = "clocks_event_reasons."
_NONE = frozenset({"[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]"})
_ACTIVE = {"Active": True, "Not Active": False}
_TIMESTAMP = "%Y/%m/%d %H:%M:%S.%f"
_BATCH = 8  # matmuls queued between checks of the clock
_FLAGS = (
    ("hw_thermal", "hardware thermal slowdown"),
    ("hw_power_brake", "hardware power brake slowdown"),
    ("sw_thermal", "software thermal slowdown"),
)


def _number(text: str) -> float | None:
    return None if text in _NONE else float(text)


def parse_sample_line(line: str) -> dict[str, Any]:
    """One CSV line of the ``QUERY`` fields (``--format=csv,noheader,nounits``) as a dict.

    Keys: timestamp (seconds since the epoch, local time as nvidia-smi writes it), gpu,
    temp_c, power_w, sm_mhz (None where the GPU does not report them), reasons (bitmask, 0 when
    not reported) and hw_thermal, hw_power_brake, sw_thermal (from their fields, or the
    bitmask when those are not reported). Raises ValueError on a malformed line.
    """
    cells = [cell.strip() for cell in line.split(",")]
    if len(cells) != len(QUERY):
        raise ValueError(f"expected {len(QUERY)} comma-separated fields, got {line!r}")
    stamp, index, temp, power, clock, active, hw_thermal, hw_brake, sw_thermal = cells
    reasons = 0 if active in _NONE else int(active, 16)
    flags = {}
    for key, text, bit in (
        ("hw_thermal", hw_thermal, HW_THERMAL),
        ("hw_power_brake", hw_brake, HW_POWER_BRAKE),
        ("sw_thermal", sw_thermal, SW_THERMAL),
    ):
        if text in _NONE:
            flags[key] = bool(reasons & bit)
        elif text in _ACTIVE:
            flags[key] = _ACTIVE[text]
        else:
            raise ValueError(f"expected Active or Not Active, got {text!r} in {line!r}")
    return {
        "timestamp": datetime.datetime.strptime(stamp, _TIMESTAMP).timestamp(),
        "gpu": int(index),
        "temp_c": _number(temp),
        "power_w": _number(power),
        "sm_mhz": _number(clock),
        "reasons": reasons,
        **flags,
    }


def mirror_score(temps: Sequence[float], clocks: Sequence[float]) -> float:
    """Pearson correlation of temperature and SM clock; -1 when one mirrors the other.

    0.0 when either series is constant or has fewer than two samples.
    """
    if len(temps) != len(clocks):
        raise ValueError(f"{len(temps)} temperatures but {len(clocks)} clocks")
    n = len(temps)
    if n < 2:
        return 0.0
    mean_t, mean_c = sum(temps) / n, sum(clocks) / n
    dt = [t - mean_t for t in temps]
    dc = [c - mean_c for c in clocks]
    var_t = sum(d * d for d in dt)
    var_c = sum(d * d for d in dc)
    if var_t == 0 or var_c == 0:
        return 0.0
    cov = sum(dt[i] * dc[i] for i in range(n))
    return max(-1.0, min(1.0, cov / math.sqrt(var_t * var_c)))


def clock_mirror(
    samples: Sequence[dict[str, Any]],
    mirror_threshold: float = -0.8,
    min_clock_drop: float = 0.05,
    warmup_s: float = 15.0,
) -> dict[int, dict[str, Any]]:
    """Per GPU, how its SM clock followed its temperature after the first ``warmup_s``
    seconds: ``r`` (``mirror_score``), the clock's highest in the first third of that window
    and lowest in the last (``high_mhz``, ``low_mhz``), its fall between them (``drop``), the
    window (``from_s``, ``to_s``), and ``mirrored``: r at most ``mirror_threshold`` while the
    clock fell by more than ``min_clock_drop``. GPUs with too few samples are left out.
    """
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        by_gpu.setdefault(sample["gpu"], []).append(sample)
    found = {}
    for gpu in sorted(by_gpu):
        paired = [
            (s.get("t", 0.0), s["temp_c"], s["sm_mhz"])
            for s in sorted(by_gpu[gpu], key=lambda sample: sample.get("t", 0.0))
            if s.get("temp_c") is not None
            and s.get("sm_mhz") is not None
            and s.get("t", 0.0) >= warmup_s
        ]
        third = len(paired) // 3
        if third == 0:
            continue
        clocks = [clock for _, _, clock in paired]
        score = mirror_score([temp for _, temp, _ in paired], clocks)
        high, low = max(clocks[:third]), min(clocks[-third:])
        drop = (high - low) / high if high > 0 else 0.0
        found[gpu] = {
            "r": score,
            "high_mhz": high,
            "low_mhz": low,
            "drop": drop,
            "from_s": paired[0][0],
            "to_s": paired[-1][0],
            "mirrored": score <= mirror_threshold and drop > min_clock_drop,
        }
    return found


def thermal_verdict(
    samples: Sequence[dict[str, Any]],
    max_temp_c: float,
    mirror_threshold: float = -0.8,
    min_clock_drop: float = 0.05,
    warmup_s: float = 15.0,
) -> list[str]:
    """Problems seen in ``sample`` lines, one sentence each; empty when the GPUs kept cool.

    Per GPU: a temperature above ``max_temp_c``; any sample with a hardware thermal, hardware
    power brake or software thermal slowdown; and, after the first ``warmup_s`` seconds of
    load (when clocks fall from idle boost to their power-capped level as the GPU warms up),
    a clock that mirrors the temperature (``mirror_score`` at most ``mirror_threshold``)
    while falling by more than ``min_clock_drop`` from its highest in the first third of
    that window to its lowest in the last: the cooling cannot keep up (``clock_mirror``).
    """
    by_gpu: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        by_gpu.setdefault(sample["gpu"], []).append(sample)
    mirrors = clock_mirror(samples, mirror_threshold, min_clock_drop, warmup_s)
    problems = []
    for gpu in sorted(by_gpu):
        series = by_gpu[gpu]
        temps = [s["temp_c"] for s in series if s.get("temp_c") is not None]
        if temps and max(temps) > max_temp_c:
            problems.append(f"GPU{gpu} reached {max(temps):g} C, above the {max_temp_c:g} C limit")
        for key, name in _FLAGS:
            seen = sum(1 for s in series if s.get(key))
            if seen:
                problems.append(f"GPU{gpu} {name} in {seen} of {len(series)} samples")
        mirror = mirrors.get(gpu)
        if mirror and mirror["mirrored"]:
            problems.append(
                f"GPU{gpu} SM clock mirrors its temperature (r = {mirror['r']:.2f}) and fell "
                f"{mirror['drop']:.0%} from {mirror['high_mhz']:g} to {mirror['low_mhz']:g} MHz: "
                "the cooling cannot keep up"
            )
    return problems


def build_parser() -> argparse.ArgumentParser:
    """The probe's command line; errors in it exit with 64 (``EXIT_USAGE``)."""
    parser = common.ProbeParser(
        description="Load every GPU with matmuls and sample heat and clocks."
    )
    parser.add_argument("--seconds", type=common.positive_float, default=300.0, help="load time")
    parser.add_argument("--size", type=common.positive_int, default=8192, help="matrix dimension")
    parser.add_argument(
        "--interval-s", type=common.positive_float, default=1.0, help="seconds between samples"
    )
    parser.add_argument(
        "--trials", type=common.positive_int, default=1, help="windows TFLOPS are reported for"
    )
    parser.add_argument(
        "--warmup-s", type=float, default=0.0, help="load before the windows"
    )
    return parser


def window_tflops(
    marks: Sequence[tuple[float, int]], size: int, warmup_s: float, trials: int
) -> list[float]:
    """TFLOPS in each of ``trials`` equal windows from ``warmup_s`` to the last mark, from
    ``(seconds since the start, matmuls completed)`` marks (interpolated between them)."""
    warmup_s = max(0.0, warmup_s)
    if len(marks) < 2 or marks[-1][0] <= warmup_s:
        return []

    def done_at(t: float) -> float:
        if t <= marks[0][0]:
            return float(marks[0][1]) * t / marks[0][0] if marks[0][0] > 0 else 0.0
        for k in range(1, len(marks)):
            (t0, n0), (t1, n1) = marks[k - 1], marks[k]
            if t <= t1:
                return n0 + (n1 - n0) * ((t - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return float(marks[-1][1])

    width = (marks[-1][0] - warmup_s) / trials
    edges = [warmup_s + i * width for i in range(trials + 1)]
    return [
        2 * size**3 * (done_at(edges[i + 1]) - done_at(edges[i])) / width / 1e12
        for i in range(trials)
    ]


def _query(fields: Sequence[str]) -> list[str]:
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def _working_query() -> tuple[list[str] | None, str]:
    """The query nvidia-smi accepts, with the new field names or else the old, and "";
    or None and why neither works."""
    if shutil.which("nvidia-smi") is None:
        return None, "nvidia-smi is not on PATH"
    message = ""
    for fields in (QUERY, tuple(f.replace(_NEW_PREFIX, _OLD_PREFIX) for f in QUERY)):
        done = subprocess.run(
            _query(fields), check=False, capture_output=True, text=True, timeout=60
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            message = (done.stderr or done.stdout).strip()
            continue
        try:
            parse_sample_line(lines[0])
        except ValueError as exc:
            message = str(exc)
            continue
        return _query(fields), ""
    return None, f"nvidia-smi cannot report the fields: {message}"


class _Sampler(threading.Thread):
    """Runs nvidia-smi in a loop and prints each line as a ``sample``."""

    def __init__(self, command: list[str], interval_s: float, start: float) -> None:
        super().__init__(daemon=True)
        interval_ms = max(1, round(interval_s * 1000))
        self.process = subprocess.Popen(
            [*command, "-lms", str(interval_ms)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.began = start
        self.count = 0

    def run(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if not line.strip():
                continue
            try:
                sample = parse_sample_line(line)
            except ValueError:
                continue
            stamp = sample.pop("timestamp")
            common.emit("sample", t=round(stamp - self.began, 3), **sample)
            self.count += 1

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.join(timeout=30)


def _load(
    index: int, size: int, seconds: float, tflops: list[float | None], marks: list[Any]
) -> None:
    """Back-to-back bf16 matmuls on GPU ``index`` for ``seconds``; TFLOPS into ``tflops``,
    ``(seconds, matmuls completed)`` at every completed batch into ``marks``."""
    import torch

    device = torch.device("cuda", index)
    with torch.cuda.device(device):
        a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
        out = torch.empty(size, size, device=device, dtype=torch.bfloat16)
        torch.cuda.synchronize(device)
        queued: list[torch.cuda.Event] = []  # at most two batches wait on the GPU
        done = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(_BATCH):
                torch.matmul(a, b, out=out)
            event = torch.cuda.Event()
            event.record()
            queued.append(event)
            done += _BATCH
            if len(queued) > 2:
                queued.pop(0).synchronize()
                marks.append((time.perf_counter() - start, done - _BATCH * len(queued)))
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
    marks.append((elapsed, done))
    tflops[index] = 2 * size**3 * done / elapsed / 1e12


def _guarded_load(
    index: int,
    size: int,
    seconds: float,
    results: tuple[list[float | None], list[Any]],
    errors: list[str],
) -> None:
    """``_load``, reporting a failure of the GPU as an ``error`` line."""
    try:
        _load(index, size, seconds, results[0], results[1][index])
    except Exception as exc:
        common.emit("error", gpu=index, message=str(exc))
        errors.append(str(exc))


def run(args: argparse.Namespace) -> int:
    """Sample and load the GPUs; returns the exit code."""
    import torch

    if not torch.cuda.is_available():
        common.emit("skip", reason="no CUDA GPU")
        return EXIT_OK
    command, problem = _working_query()
    if command is None:
        common.emit("error", message=problem)
        return EXIT_SAMPLER
    gpus = torch.cuda.device_count()
    tflops: list[float | None] = [None] * gpus
    marks: list[list[tuple[float, int]]] = [[] for _ in range(gpus)]
    errors: list[str] = []
    sampler = _Sampler(command, args.interval_s, time.time())
    sampler.start()
    start = time.perf_counter()
    workers = [
        threading.Thread(
            target=_guarded_load, args=(i, args.size, args.seconds, (tflops, marks), errors)
        )
        for i in range(gpus)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - start
    sampler.stop()
    if sampler.count == 0:
        common.emit("error", message="nvidia-smi printed no samples")
        return EXIT_SAMPLER
    windows = [window_tflops(m, args.size, args.warmup_s, args.trials) for m in marks]
    common.emit(
        "summary", seconds=seconds, gpus=gpus, tflops_per_gpu=tflops, tflops_trials=windows
    )
    return EXIT_LOAD if errors else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, set the environment before CUDA starts, and run."""
    args = build_parser().parse_args(argv)
    common.set_safe_environment()
    # torch numbers the GPUs as nvidia-smi does, so samples and loads name the same GPU.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
