"""PNG plots of a bench results file: fan-out wall time per tool, and the latency curve.

``python bench/plots.py bench/results/latest.json docs/img``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TOOL_STYLE = {"gpufleet": ("gpufleet drift", "tab:green", "o"),
              "ansible": ("ansible-playbook --check", "tab:red", "s"),
              "pyinfra": ("pyinfra --dry", "tab:blue", "^")}


def _medians(results: dict[str, Any], experiment: str, tool: str) -> list[tuple[int, float]]:
    rows = results.get("medians", {}).get(experiment, {}).get(tool, {})
    return sorted((int(n), float(v)) for n, v in rows.items())


def plot(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """The plots of a completed run; none for a run that failed (it has no medians)."""
    if "medians" not in results:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    machine = results["machine"]
    subtitle = f"{machine['cores']} cores, {machine['kernel']}; median of {results['runs']} runs"

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for tool, (label, color, marker) in TOOL_STYLE.items():
        points = _medians(results, "fanout", tool)
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker=marker, color=color, label=label)
            for x, y in points:
                ax.annotate(f"{y:.1f}s", (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=8, color=color)
    ax.set_yscale("log")
    ax.set_xlabel("lab nodes (forks / parallel = node count)")
    ax.set_ylabel("wall time, seconds (log scale)")
    ax.set_title(f"Drift check of a converged fleet\n{subtitle}", fontsize=10)
    ax.set_xticks(sorted({n for t in TOOL_STYLE for n, _ in _medians(results, "fanout", t)}))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out_dir / "fanout.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    latency = results.get("latency")
    if latency:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        rtt = latency["rtt_with_delay"]["ssh"]["rtt_ms"]
        delayed = f"added latency (SSH RTT {rtt:.0f} ms, measured)"
        for experiment, label, color in (("drift_no_delay", "no added latency", "tab:gray"),
                                         ("drift_delay", delayed, "tab:green")):
            points = _medians(results, experiment, "gpufleet")
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", color=color, label=label)
                for x, y in points:
                    ax.annotate(f"{y:.2f}s", (x, y), textcoords="offset points",
                                xytext=(4, -12), fontsize=8, color=color)
        ax.set_xticks(sorted({n for e in ("drift_no_delay", "drift_delay")
                              for n, _ in _medians(results, e, "gpufleet")}))
        ax.set_xlabel("lab nodes")
        ax.set_ylabel("invoke drift wall time, seconds")
        ax.set_ylim(bottom=0)
        ax.set_title(f"gpufleet drift vs fleet size, with and without added latency\n"
                     f"{machine['cores']} cores, {machine['kernel']}; median of "
                     f"{results.get('gpufleet_runs', results['runs'])} runs",
                     fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / "latency.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


if __name__ == "__main__":
    data = json.loads(Path(sys.argv[1]).read_text())
    if "medians" not in data:
        sys.exit(f"{sys.argv[1]}: no medians to plot, the run failed: "
                 f"{data.get('error', 'no error recorded')}")
    for p in plot(data, Path(sys.argv[2])):
        print(p)
