"""Terminal output: progress while hosts run, plans with diffs, and the recap.

Text that hosts or inventories control (names, command output, errors) reaches the
terminal only through ``markup`` (rich markup) or ``plain`` (plain text): control
characters, ANSI escapes and bidirectional overrides are shown as ``\\xNN`` / ``\\uNNNN``
instead of acting on the terminal, and rich markup in them is printed, not interpreted.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TextIO, TypeVar

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from gpufleet.connect.fleet import Outcome, summarize

_INVISIBLE = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff"
_UNPRINTABLE = re.compile(f"[{_INVISIBLE}]")
_UNPRINTABLE_OR_NEWLINE = re.compile(f"[{_INVISIBLE}\\n]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(text: object, *, newlines: bool = False) -> str:
    """Host-controlled text made safe for a terminal: control characters (ESC included),
    zero-width and bidirectional controls replaced by their visible escape; line breaks
    too unless ``newlines``."""
    pattern = _UNPRINTABLE if newlines else _UNPRINTABLE_OR_NEWLINE
    return pattern.sub(_visible, str(text))


def markup(text: object) -> str:
    """Host-controlled text for a rich print: ``plain``, then rich markup escaped."""
    return escape(plain(text))


_FOLDABLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
_K = TypeVar("_K", bound=Hashable)


def host_set(hosts: Iterable[str]) -> str:
    """Host names folded into a host set (``node[001-998]``, ClusterShell's NodeSet); names
    a host set cannot hold (brackets, commas, control characters ...) are listed as they
    are, after it."""
    names = list(hosts)
    foldable = [h for h in names if _FOLDABLE.match(h)]
    others = [h for h in names if not _FOLDABLE.match(h)]
    try:
        folded = [str(NodeSet.fromlist(foldable, resolver=RESOLVER_NOGROUP))] if foldable else []
    except NodeSetException:
        folded = foldable
    return ",".join(folded + others)


def fold(hosts: Iterable[str], key: Callable[[str], _K]) -> list[tuple[str, _K, list[str]]]:
    """Hosts with the same ``key``: (their host set, the key, the hosts), in the order each
    key first appears."""
    groups: dict[_K, list[str]] = {}
    for host in hosts:
        groups.setdefault(key(host), []).append(host)
    return [(host_set(members), k, members) for k, members in groups.items()]


STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "red bold",
                "unreachable": "red bold", "skipped": "dim"}


def console(stream: TextIO | None = None) -> Console:
    """A console that writes plain text, 160 columns wide, when not on a terminal."""
    out = stream or sys.stdout
    width = None if out.isatty() else 160
    return Console(file=out, highlight=False, soft_wrap=True, width=width, emoji=False)


class _Rate(ProgressColumn):
    """Hosts per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:.1f} hosts/s" if speed else "- hosts/s", style="dim")


class TerminalProgress:
    """On a terminal, a progress bar with the failed and unreachable counts, the rate and
    the time left. Otherwise plain lines: each host for a small fleet; for a larger one
    each failed or unreachable host, and a summary line every ``EVERY_S`` seconds."""

    SMALL = 20
    EVERY_S = 10.0

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.out = console(stream or sys.stderr)
        self.total = 0
        self.done = 0
        self.counts = {"failed": 0, "unreachable": 0}
        self.started = self.last = time.monotonic()
        self._bar: Progress | None = None
        self._task: Any = None

    def start(self, total: int) -> None:
        self.total = total
        self.started = self.last = time.monotonic()
        if self.out.is_terminal:
            self._bar = Progress(
                TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                TextColumn("[red]{task.fields[failed]} failed, {task.fields[unreachable]} "
                           "unreachable[/red]"),
                _Rate(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                console=self.out, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total, failed=0, unreachable=0)

    def host_done(self, outcome: Outcome[object]) -> None:
        self.done += 1
        bad = outcome.status in self.counts
        if bad:
            self.counts[outcome.status] += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, failed=self.counts["failed"],
                             unreachable=self.counts["unreachable"])
            if bad:
                self._bar.console.print(f"[red]{markup(outcome.host)}: {outcome.status}"
                                        f"[/red]")
            return
        now = time.monotonic()
        if self.total <= self.SMALL:
            self.out.print(f"[{self.done}/{self.total}] {markup(outcome.host)} "
                           f"{outcome.status} ({outcome.duration:.1f}s)")
            return
        if bad:
            self.out.print(f"{self.label}: {markup(outcome.host)} {outcome.status}: "
                           f"{markup(outcome.error or '')}")
        if now - self.last >= self.EVERY_S or self.done == self.total:
            self.last = now
            rate = self.done / max(now - self.started, 1e-6)
            left = (self.total - self.done) / rate if rate else 0.0
            self.out.print(f"{self.label}: {self.done}/{self.total} done, "
                           f"{self.counts['failed']} failed, {self.counts['unreachable']} "
                           f"unreachable, {rate:.1f} hosts/s, ETA {left:.0f}s")

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def print_recap(out: Console, outcomes: dict[str, Outcome[Any]],
                notes: dict[str, str] | None = None) -> None:
    """Per-host status like Ansible's recap, with errors and notes; hosts with the same
    status, error and note are one line (``node[001-998]``, the slowest one's time)."""
    out.print("[bold]RECAP[/bold]")
    order = {"failed": 0, "unreachable": 1, "skipped": 2, "changed": 3, "ok": 4}
    names = sorted(outcomes, key=lambda h: order.get(outcomes[h].status, 5))
    groups = fold(names, lambda h: (outcomes[h].status, outcomes[h].error,
                                    (notes or {}).get(h, "")))
    width = max((len(plain(h)) for h, _, _ in groups), default=4)
    for name, (status, error, extra), members in groups:
        style = STATUS_STYLE[status]
        slowest = max(outcomes[h].duration for h in members)
        line = f"  {escape(plain(name).ljust(width))}  [{style}]{status:<11}[/{style}] " \
               f"{slowest:6.1f}s"
        if extra:
            line += f"  [magenta]{markup(extra)}[/magenta]"
        out.print(line)
        if error:
            out.print(f"  {'':<{width}}  [red]{markup(error)}[/red]")
    counts = summarize(outcomes)
    out.print("  " + "  ".join(f"{k}={v}" for k, v in counts.items()))


def facts_table(outcomes: dict[str, Outcome[Any]]) -> Table:
    """The key facts of each host in one table; hosts with the same facts are one row."""
    table = Table(show_lines=False, pad_edge=False)
    for col in ("host", "status", "os", "kernel", "cpus", "mem GiB", "gpus", "driver",
                "firmware", "cuda", "nccl (pkg)", "torch", "firewall", "watch"):
        table.add_column(col, overflow="fold")
    keys = ("os", "kernel", "cpus", "mem_gib", "gpus", "driver", "firmware", "cuda", "nccl",
            "torch", "firewall", "watch")

    def row(name: str) -> tuple[str, ...]:
        outcome = outcomes[name]
        summary = outcome.value if isinstance(outcome.value, dict) else {}
        if outcome.status in ("failed", "unreachable") or not summary:
            return (outcome.status, outcome.error or "", *[""] * (len(keys) - 1))
        return (outcome.status, *(str(summary.get(k) or "-") for k in keys))

    bad = sorted(outcomes, key=lambda h: outcomes[h].status not in ("failed", "unreachable"))
    for hosts, cells, _ in fold(bad, row):
        table.add_row(markup(hosts), *(markup(c) for c in cells))
    return table
