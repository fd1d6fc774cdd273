"""Plots as inline SVG, drawn in Python: lines, dots, gates and shaded spans on linear or
log2 axes. A report that embeds them needs no script library and fetches nothing; every
text (labels, tooltips) is escaped, since host names and figures' names end up in them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from markupsafe import Markup, escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f", "#393b79")  # no red: red marks what failed
FAIL = "#c62828"
MUTED = "#9aa5b1"
MAX_LEGEND = 10
LEFT, RIGHT, TOP, BOTTOM = 58, 16, 26, 38
LEGEND_ROW = 16


@dataclass(frozen=True)
class Line:
    """A series joined point to point; ``label`` None keeps it out of the legend."""

    points: Sequence[tuple[float, float]]
    colour: str
    label: str | None = None
    width: float = 1.5
    dash: bool = False
    opacity: float = 1.0
    dots: bool = False
    title: str | None = None


@dataclass(frozen=True)
class Dot:
    """One marked value: a dot, or a short horizontal ``gate`` tick, with its tooltip."""

    x: float
    y: float
    colour: str
    title: str
    shape: str = "dot"  # dot | gate | ring


@dataclass(frozen=True)
class Rule:
    """A horizontal line across the plot (a limit, a need)."""

    y: float
    colour: str
    label: str


@dataclass(frozen=True)
class Span:
    """A shaded stretch of the x axis (the warm-up, a window the verdict judged)."""

    x0: float
    x1: float
    colour: str
    label: str
    hatch: bool = False


@dataclass(frozen=True)
class Whisker:
    """A vertical range at one x (the trials of a median)."""

    x: float
    low: float
    high: float
    colour: str


@dataclass
class Chart:
    """One plot. ``x_ticks`` replaces the computed x ticks (sizes, run dates)."""

    title: str
    x_label: str
    y_label: str
    lines: list[Line] = field(default_factory=list)
    dots: list[Dot] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    whiskers: list[Whisker] = field(default_factory=list)
    log_x: bool = False
    x_ticks: list[tuple[float, str]] | None = None
    x_range: tuple[float, float] | None = None
    y_zero: bool = True
    width: int = 640
    height: int = 240

    def empty(self) -> bool:
        """Nothing to place: no line has a point (a legend entry alone is no point), no
        dot, no whisker."""
        return not (any(line.points for line in self.lines) or self.dots or self.whiskers)

    def svg(self) -> Markup:
        """The chart as an ``<svg>`` element."""
        legend = [(line.label, line.colour, line.dash) for line in self.lines if line.label]
        legend += [(r.label, r.colour, True) for r in self.rules]
        legend += [(s.label, s.colour, False) for s in self.spans if s.label]
        legend = list(dict.fromkeys(legend))
        more = len(legend) - MAX_LEGEND
        if more > 0:
            legend = legend[:MAX_LEGEND - 1]
        columns = 2 if any(len(label) > 24 for label, _, _ in legend) or self.width < 480 else 3
        rows = math.ceil((len(legend) + (more > 0)) / columns) if legend else 0
        height = self.height + rows * LEGEND_ROW
        plot_w = self.width - LEFT - RIGHT
        plot_h = self.height - TOP - BOTTOM
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{self.width}" '
               f'height="{height}" viewBox="0 0 {self.width} {height}" role="img" '
               f'aria-label="{escape(self.title)}">',
               f'<text class="t" x="{LEFT}" y="16">{escape(self.title)}</text>']
        if self.empty():
            out.append(f'<text class="n" x="{LEFT}" y="{TOP + plot_h / 2:.0f}">nothing '
                       "measured</text></svg>")
            return Markup("".join(out))  # noqa: S704 - every text in it is escaped
        fx, fy, xt, yt = self._scales(plot_w, plot_h)
        out.append(f'<defs><pattern id="hatch" width="6" height="6" '
                   f'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
                   f'<line x1="0" y1="0" x2="0" y2="6" stroke="{FAIL}" stroke-width="2" '
                   f'opacity="0.45"/></pattern></defs>')
        for span in self.spans:
            x0, x1 = fx(span.x0), fx(span.x1)
            fill = "url(#hatch)" if span.hatch else span.colour
            out.append(f'<rect x="{x0:.1f}" y="{TOP}" width="{max(1.0, x1 - x0):.1f}" '
                       f'height="{plot_h}" fill="{fill}" opacity="{1 if span.hatch else 0.18}">'
                       f"<title>{escape(span.label)}</title></rect>")
        for value, text in yt:
            y = fy(value)
            out.append(f'<line class="g" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" '
                       f'y2="{y:.1f}"/><text class="yl" x="{LEFT - 4}" y="{y + 3:.1f}">'
                       f"{escape(text)}</text>")
        for value, text in xt:
            x = fx(value)
            out.append(f'<line class="g" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" '
                       f'y2="{TOP + plot_h}"/><text class="xl" x="{x:.1f}" '
                       f'y="{TOP + plot_h + 13}">{escape(text)}</text>')
        out.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" '
                   f'height="{plot_h}"/>')
        for rule in self.rules:
            y = fy(rule.y)
            out.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                       f'stroke="{rule.colour}" stroke-width="1.5" stroke-dasharray="6 3">'
                       f"<title>{escape(rule.label)}</title></line>")
        for w in self.whiskers:
            x = fx(w.x)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{fy(w.low):.1f}" '
                       f'y2="{fy(w.high):.1f}" stroke="{w.colour}" stroke-width="3" '
                       'opacity="0.35"/>')
        for line in self.lines:
            out.append(self._line(line, fx, fy))
        for dot in self.dots:
            out.append(_dot(dot, fx(dot.x), fy(dot.y)))
        out.append(f'<text class="al" x="{LEFT + plot_w / 2:.0f}" y="{TOP + plot_h + 29}">'
                   f"{escape(self.x_label)}</text>"
                   f'<text class="al" transform="translate(13 {TOP + plot_h / 2:.0f}) '
                   f'rotate(-90)">{escape(self.y_label)}</text>')
        out += _legend(legend, more, self.height - 4, plot_w, columns)
        out.append("</svg>")
        return Markup("".join(out))  # noqa: S704 - every text in it is escaped

    def _line(self, line: Line, fx: Callable[[float], float],
              fy: Callable[[float], float]) -> str:
        points = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in line.points)
        dash = ' stroke-dasharray="5 3"' if line.dash else ""
        title = f"<title>{escape(line.title)}</title>" if line.title else ""
        text = (f'<polyline points="{points}" fill="none" stroke="{line.colour}" '
                f'stroke-width="{line.width}" opacity="{line.opacity}"{dash}>{title}'
                "</polyline>")
        if line.dots:
            text += "".join(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="2.5" '
                            f'fill="{line.colour}" opacity="{line.opacity}"/>'
                            for x, y in line.points)
        return text

    def _scales(self, plot_w: float, plot_h: float) -> tuple[
            Callable[[float], float], Callable[[float], float],
            list[tuple[float, str]], list[tuple[float, str]]]:
        xs = [x for line in self.lines for x, _ in line.points] + [d.x for d in self.dots] \
            + [w.x for w in self.whiskers]
        ys = [y for line in self.lines for _, y in line.points] + [d.y for d in self.dots] \
            + [r.y for r in self.rules] + [w.high for w in self.whiskers] \
            + [w.low for w in self.whiskers]
        if self.x_range:
            xs += list(self.x_range)
        xs += [s.x0 for s in self.spans] + [s.x1 for s in self.spans]

        def tx(x: float) -> float:
            return math.log2(x) if self.log_x and x > 0 else x

        lo_x, hi_x = min(map(tx, xs)), max(map(tx, xs))
        if hi_x == lo_x:
            lo_x, hi_x = lo_x - 1, hi_x + 1
        lo_y = min([0.0, *ys]) if self.y_zero else min(ys)
        hi_y = max(ys)
        if hi_y == lo_y:
            hi_y = lo_y + (abs(lo_y) or 1.0)
        y_ticks = ticks(lo_y, hi_y)
        lo_y, hi_y = min(lo_y, y_ticks[0]), max(hi_y, y_ticks[-1])
        pad = (hi_x - lo_x) * 0.03

        def fx(x: float) -> float:
            return LEFT + (tx(x) - lo_x + pad) / (hi_x - lo_x + 2 * pad) * plot_w

        def fy(y: float) -> float:
            return TOP + plot_h - (y - lo_y) / (hi_y - lo_y) * plot_h

        if self.x_ticks is not None:
            x_ticks = self.x_ticks
        elif self.log_x:
            every = max(1, math.ceil((hi_x - lo_x) / 8))
            x_ticks = [(2.0 ** k, number(2.0 ** k))
                       for k in range(math.ceil(lo_x), math.floor(hi_x) + 1, every)]
        else:
            x_ticks = [(v, number(v)) for v in ticks(lo_x, hi_x) if lo_x <= v <= hi_x]
        return fx, fy, x_ticks, [(v, number(v)) for v in y_ticks]


def _dot(dot: Dot, x: float, y: float) -> str:
    title = f"<title>{escape(dot.title)}</title>"
    if dot.shape == "gate":
        return (f'<line x1="{x - 7:.1f}" x2="{x + 7:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                f'stroke="{dot.colour}" stroke-width="3">{title}</line>')
    if dot.shape == "ring":
        return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="none" stroke="{dot.colour}" '
                f'stroke-width="1.5">{title}</circle>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{dot.colour}">{title}</circle>'


def _legend(entries: list[tuple[str, str, bool]], more: int, top: float,
            plot_w: float, columns: int) -> list[str]:
    out = []
    column = plot_w / columns
    width = int(column / 6) - 3
    for i, (label, colour, dash) in enumerate(entries):
        x = LEFT + (i % columns) * column
        y = top + (i // columns + 1) * LEGEND_ROW
        dashed = ' stroke-dasharray="4 2"' if dash else ""
        out.append(f'<line x1="{x:.0f}" x2="{x + 16:.0f}" y1="{y - 4:.0f}" y2="{y - 4:.0f}" '
                   f'stroke="{colour}" stroke-width="3"{dashed}/><text class="lg" '
                   f'x="{x + 20:.0f}" y="{y:.0f}">{escape(_clip(label, width))}</text>')
    if more > 0:
        i = len(entries)
        out.append(f'<text class="lg" x="{LEFT + (i % columns) * column:.0f}" '
                   f'y="{top + (i // columns + 1) * LEGEND_ROW:.0f}">and {more + 1} more</text>')
    return out


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten apart) covering low..high."""
    span = high - low
    raw = span / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step + 1e-9) * step
    out = []
    value = first
    while value < high + step - 1e-9 * step:
        out.append(round(value, 12))
        value += step
    return out


def number(value: float) -> str:
    """A tick or figure in at most four significant digits (0.005, 12.5, 1980, 1.2e+04)."""
    return f"{value:.4g}"


def size_label(size: float) -> str:
    """A message size in bytes as nccl-tests' sizes are written: 64K, 1M, 8G."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return f"{size:g}"
