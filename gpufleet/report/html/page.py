"""The building blocks of every page: hosts in natural order and folded into sets, the
status grid's cells, rows and groups of rows, plots and summary cards, the header, and
the readers that take a document's values defensively (a node's bad figure is left out,
never a broken page)."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup

from gpufleet.report.terminal import host_set

MAX_MESSAGE = 4000


def natural(name: str) -> tuple[Any, ...]:
    """Sort key that orders node2 before node10."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", name))


def fold(hosts: Iterable[str]) -> str:
    """Hosts in ClusterShell's folded notation (``node[001-998],gpu7``); a name that is not
    a plain host name (brackets, commas, spaces, markup) is listed as it is."""
    return _fold(tuple(sorted(set(hosts), key=natural)))


@functools.lru_cache(maxsize=512)
def _fold(names: tuple[str, ...]) -> str:
    return host_set(names)


@dataclass
class Cell:
    """One host in the status grid."""

    host: str
    css: str
    status: str
    note: str = ""
    anchor: str = ""

    @property
    def search(self) -> str:
        return f"{self.host} {self.status} {self.note}".lower()


@dataclass
class HostSet:
    """Hosts that ended the same way, folded."""

    hosts: list[str]
    css: str
    status: str
    label: str = ""

    @property
    def folded(self) -> str:
        return fold(self.hosts)

    @property
    def search(self) -> str:
        return " ".join([*self.hosts, self.status, self.label]).lower()


@dataclass
class Row:
    """One failure (or finding) of one host, with its message."""

    host: str
    name: str
    message: str
    css: str = "fail"
    anchor: str = ""

    @property
    def search(self) -> str:
        return f"{self.host} {self.name} {self.message}".lower()


@dataclass
class Group:
    """Rows under one heading (a failing check, a drift item), with the hosts folded."""

    name: str
    rows: list[Row] = field(default_factory=list)
    detail: str = ""

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.rows}, key=natural)

    @property
    def folded(self) -> str:
        return fold(self.hosts)


@dataclass
class Plot:
    """A figure of the report: its charts, side by side, and what they show."""

    title: str
    charts: list[Markup]
    note: str = ""


@dataclass
class Card:
    """A figure of the summary."""

    label: str
    value: str
    css: str = ""


def grid_and_sets(status: Mapping[str, str], *, css: Mapping[str, str], order: Sequence[str],
                   notes: Mapping[str, str], labels: Mapping[str, str],
                   anchors: Mapping[str, str]) -> tuple[list[Cell], list[HostSet]]:
    """Cells ordered by status (``order``: worst first), then name; hosts of one status and
    one label folded into a set."""
    rank = {s: i for i, s in enumerate(order)}
    hosts = sorted(status, key=lambda h: (rank.get(status[h], len(order)), natural(h)))
    cells = [Cell(h, css.get(status[h], "skip"), status[h], notes.get(h, ""),
                  anchors.get(h, "")) for h in hosts]
    grouped: dict[tuple[str, str], list[str]] = {}
    for h in hosts:
        grouped.setdefault((status[h], labels.get(h, "")), []).append(h)
    sets = [HostSet(names, css.get(s, "skip"), s, label) for (s, label), names in
            sorted(grouped.items(), key=lambda kv: (rank.get(kv[0][0], len(order)),
                                                   -len(kv[1]), kv[0][1]))]
    return cells, sets


def clip(value: Any) -> str:
    """A message as text, cut at ``MAX_MESSAGE`` characters (the JSON keeps it whole)."""
    text = "" if value is None else str(value)
    if len(text) <= MAX_MESSAGE:
        return text
    return f"{text[:MAX_MESSAGE]}... ({len(text) - MAX_MESSAGE} more characters in the JSON)"


def real(value: Any) -> float | None:
    """A number from a node's figures as a text shows it: NaN and the infinities kept (they
    read ``nan``, ``inf``); anything but a number (a string, a list, a bool) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past float's range: a JSON 1 followed by 400 zeros
        return math.inf if value > 0 else -math.inf


def finite(value: Any) -> float | None:
    """A number a plot can place: finite; NaN, the infinities and non-numbers are None, so
    one node's bad figure is left out of the plots rather than breaking the page."""
    found = real(value)
    return found if found is not None and math.isfinite(found) else None


def list_of(value: Any) -> list[Any]:
    """A list a node sent, or none: a number or a mapping where a list belongs is none."""
    return value if isinstance(value, list) else []


def dicts(value: Any) -> list[dict[str, Any]]:
    """The mappings of a list a node sent; anything else in it is left out."""
    return [v for v in list_of(value) if isinstance(v, dict)]


def mapping(value: Any) -> dict[str, Any]:
    """A mapping a node sent, or an empty one."""
    return value if isinstance(value, dict) else {}


def header(doc: Mapping[str, Any]) -> dict[str, str]:
    """The page header's fields of a document, as text."""
    return {k: str(doc.get(k) or "") for k in (
        "inventory", "inventory_digest", "generated_at", "started_at", "finished_at",
        "duration_s", "gpufleet_version")}
