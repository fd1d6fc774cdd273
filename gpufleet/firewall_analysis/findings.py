"""What an analysis found: one finding per group of sources and port interval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpufleet.firewall_analysis.model import RuleRef

Outcome = Literal["accepted", "dropped", "rejected", "uncertain"]

_SHOWN_SOURCES = 3


@dataclass(frozen=True)
class Located:
    """A rule and the base chain whose run reached it (``reached`` describes it)."""

    rule: RuleRef
    reached: str

    def __str__(self) -> str:
        where = self.rule.where()
        return (f"{self.rule.table} chain {self.rule.chain} ({self.reached})"
                f"{' ' + where if where else ''}: {self.rule.text}")


@dataclass(frozen=True)
class Cause:
    """Why a verdict is uncertain: the rule that may or may not apply, and the reason."""

    at: Located
    reason: str


@dataclass(frozen=True)
class Finding:
    """TCP connections from ``sources`` to ``ports`` (first, last) and what happens to them.

    ``rule`` is the rule that drops, rejects or may drop them (None when accepted);
    ``cause`` says, for an uncertain verdict, which rule makes it uncertain and why.
    """

    verdict: Outcome
    sources: tuple[str, ...]
    ports: tuple[int, int]
    rule: Located | None = None
    cause: Cause | None = None

    def message(self) -> str:
        lo, hi = self.ports
        subject = (f"tcp dport {lo}" if lo == hi else f"tcp dports {lo}-{hi}") + (
            f" from {sources_text(self.sources)}")
        verb = "is" if lo == hi else "are"
        if self.verdict == "accepted" or self.rule is None:
            return f"{subject} {verb} accepted"
        if self.verdict != "uncertain":
            return f"{subject} {verb} {self.verdict} by {self.rule}"
        text = f"{subject} may be dropped by {self.rule}"
        if self.cause is None:
            return text
        if self.cause.at == self.rule:
            return f"{text} ({self.cause.reason})"
        return f"{text}, depending on {self.cause.at} ({self.cause.reason})"


def sources_text(sources: tuple[str, ...]) -> str:
    if len(sources) <= _SHOWN_SOURCES:
        return ", ".join(sources)
    shown = ", ".join(sources[:_SHOWN_SOURCES])
    return f"{len(sources)} sources ({shown}, ...)"


@dataclass(frozen=True)
class Analysis:
    """Every (sources, port interval) with its verdict, in port order; ``notes`` tell how
    the ruleset was read (iptables-nft tables, tables off the input path)."""

    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()

    @property
    def blocked(self) -> list[Finding]:
        """Connections some rule surely drops or rejects."""
        return [f for f in self.findings if f.verdict in ("dropped", "rejected")]

    @property
    def uncertain(self) -> list[Finding]:
        """Connections that may be dropped: rate limits, rules not understood, interfaces."""
        return [f for f in self.findings if f.verdict == "uncertain"]

    @property
    def accepted(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict == "accepted"]

    @property
    def clean(self) -> bool:
        """Every source reaches every port for sure."""
        return not self.blocked and not self.uncertain

    def messages(self) -> list[str]:
        """One line per finding that is not accepted."""
        return [f.message() for f in self.findings if f.verdict != "accepted"]
