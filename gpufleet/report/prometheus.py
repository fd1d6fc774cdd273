"""Prometheus node_exporter textfile: metrics as text, written atomically."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.report.outputs import local_put


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@dataclass
class Metric:
    """One metric family: name, help, type and its samples (labels -> value)."""

    name: str
    help: str
    kind: str = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


def _number(value: float) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def render(metrics: list[Metric]) -> str:
    """The exposition text of every metric family."""
    lines: list[str] = []
    for metric in metrics:
        lines.append(f"# HELP {metric.name} {_escape(metric.help)}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        for labels, value in metric.samples:
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            suffix = f"{{{label_text}}}" if label_text else ""
            lines.append(f"{metric.name}{suffix} {_number(value)}")
    return "\n".join(lines) + "\n"


def write(path: str | Path, metrics: list[Metric]) -> None:
    """Write the textfile atomically: node_exporter never reads half a file (its temporary
    name does not end in .prom, so the collector ignores it)."""
    local_put(str(path), render(metrics).encode())
