"""Terminal output: progress while hosts run, plans with diffs, and the recap.

Text that hosts or inventories control (names, command output, errors) reaches the
terminal only through ``markup`` (rich markup) or ``plain`` (plain text): control
characters, ANSI escapes and bidirectional overrides are shown as ``\\xNN`` / ``\\uNNNN``
instead of acting on the terminal, and rich markup in them is printed, not interpreted.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufleet.connect.fleet import Outcome, summarize
from gpufleet.provision.plan import Change, Plan

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


STATUS_STYLE = {"ok": "green", "changed": "yellow", "failed": "red bold",
                "unreachable": "red bold", "skipped": "dim"}
ACTION_MARK = {"install": "+", "create": "+", "reboot": "!", "reload": "~"}


def console(stream: TextIO | None = None) -> Console:
    """A console that writes plain text, 160 columns wide, when not on a terminal."""
    out = stream or sys.stdout
    width = None if out.isatty() else 160
    return Console(file=out, highlight=False, soft_wrap=True, width=width, emoji=False)


class TerminalProgress:
    """A progress bar on a terminal, one plain line per finished host otherwise."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.out = console(stream or sys.stderr)
        self.total = 0
        self.done = 0
        self._bar: Progress | None = None
        self._task: Any = None

    def start(self, total: int) -> None:
        self.total = total
        if self.out.is_terminal:
            self._bar = Progress(TextColumn(f"{self.label}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self.out, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=total)

    def host_done(self, outcome: Outcome[object]) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.advance(self._task)
            if outcome.status in ("failed", "unreachable"):
                self._bar.console.print(f"[red]{markup(outcome.host)}: {outcome.status}[/red]")
            return
        self.out.print(f"[{self.done}/{self.total}] {markup(outcome.host)} {outcome.status} "
                       f"({outcome.duration:.1f}s)")

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _mark(change: Change) -> str:
    if change.pending_reboot:
        return "!"
    return ACTION_MARK.get(change.action, "~")


def change_line(change: Change) -> str:
    """One readable line: what, where, from what, to what."""
    note = "reboot required" if change.pending_reboot else change.action
    return (f"{_mark(change)} {change.role:<9} {change.resource:<44} "
            f"{change.before} -> {change.after}  ({note})")


def print_plan(out: Console, plan: Plan, diff: bool, applied: list[Change] | None = None,
               reboot_pending: bool = False) -> None:
    """A host's plan, with unified diffs when asked; with ``applied``, what was done."""
    done = {id(c) for c in applied or []}
    for change in plan.changes:
        style = "magenta" if change.pending_reboot else "yellow"
        tag = ""
        if applied is not None:
            ok = id(change) in done and not (change.pending_reboot and reboot_pending)
            tag = "done " if ok else ("PENDING " if change.pending_reboot else "NOT DONE ")
            style = "green" if ok else ("magenta" if change.pending_reboot else "red")
        out.print(f"  [{style}]{tag}{markup(change_line(change))}[/{style}]")
        if diff and change.diff:
            for line in change.diff.rstrip("\n").splitlines():
                color = "green" if line.startswith("+") else "red" if line.startswith("-") \
                    else "dim"
                out.print(f"      [{color}]{markup(line)}[/{color}]")


def print_recap(out: Console, outcomes: dict[str, Outcome[Any]],
                notes: dict[str, str] | None = None) -> None:
    """Per-host status like Ansible's recap, with errors and notes."""
    out.print("[bold]RECAP[/bold]")
    width = max((len(plain(h)) for h in outcomes), default=4)
    for name, outcome in outcomes.items():
        style = STATUS_STYLE[outcome.status]
        extra = (notes or {}).get(name, "")
        line = f"  {escape(plain(name).ljust(width))}  [{style}]{outcome.status:<11}[/{style}] " \
               f"{outcome.duration:6.1f}s"
        if extra:
            line += f"  [magenta]{markup(extra)}[/magenta]"
        out.print(line)
        if outcome.error:
            out.print(f"  {'':<{width}}  [red]{markup(outcome.error)}[/red]")
    counts = summarize(outcomes)
    out.print("  " + "  ".join(f"{k}={v}" for k, v in counts.items()))


def facts_table(outcomes: dict[str, Outcome[Any]]) -> Table:
    """The key facts of each host in one table."""
    table = Table(show_lines=False, pad_edge=False)
    for col in ("host", "status", "os", "kernel", "cpus", "mem GiB", "gpus", "driver",
                "cuda", "nccl (pkg)", "torch", "firewall"):
        table.add_column(col, overflow="fold")
    for name, outcome in outcomes.items():
        summary = outcome.value if isinstance(outcome.value, dict) else {}
        if outcome.status in ("failed", "unreachable") or not summary:
            table.add_row(markup(name), outcome.status, markup(outcome.error or ""), *[""] * 9)
            continue
        table.add_row(markup(name), outcome.status, *(markup(summary.get(k) or "-") for k in (
            "os", "kernel", "cpus", "mem_gib", "gpus", "driver", "cuda", "nccl", "torch",
            "firewall")))
    return table
