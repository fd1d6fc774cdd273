"""AllReduce fidelity: gpufleet's busbw per size (from a conformance JSON report) beside the
independent reference loop's (bench/allreduce_reference.py JSON lines); a Markdown table
and a PNG of busbw vs message size.

    python bench/allreduce_fidelity.py CONFORMANCE.json REFERENCE.jsonl OUT.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def gpufleet_rows(report: dict[str, Any]) -> tuple[dict[int, float], float]:
    """size -> busbw of the single-node AllReduce check, and how long the check took."""
    run = next(v for k, v in report["data"]["allreduce"].items() if k.startswith("single "))
    return {int(r["size"]): float(r["busbw"]) for r in run["results"]}, float(run["duration_s"])


def reference_rows(lines: list[str]) -> dict[int, float]:
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    return {int(r["size_bytes"]): float(r["busbw_GBps"]) for r in rows}


def table(ours: dict[int, float], reference: dict[int, float]) -> str:
    out = ["| size | gpufleet busbw (GB/s) | reference busbw (GB/s) | gpufleet / reference |",
           "|---|---|---|---|"]
    for size in sorted(ours):
        ref = reference.get(size)
        ratio = f"{ours[size] / ref:.3f}" if ref else "-"
        out.append(f"| {_size(size)} | {ours[size]:.2f} | "
                   f"{f'{ref:.2f}' if ref else '-'} | {ratio} |")
    return "\n".join(out)


def _size(size: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def plot(ours: dict[int, float], reference: dict[int, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = sorted(reference)
    ax.plot(xs, [reference[x] for x in xs], marker="o", color="tab:gray",
            label="reference loop (torch.distributed)")
    xs = sorted(ours)
    ax.plot(xs, [ours[x] for x in xs], marker="s", color="tab:green",
            label="gpufleet allreduce check")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("NCCL AllReduce, 2x NVIDIA H200 (NV18), float32 sum")
    ax.grid(alpha=0.3)
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 64
    ours, duration = gpufleet_rows(json.loads(Path(argv[0]).read_text()))
    reference = reference_rows(Path(argv[1]).read_text().splitlines())
    print(table(ours, reference))
    print(f"\nthe allreduce check took {duration:.1f} s")
    plot(ours, reference, Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
