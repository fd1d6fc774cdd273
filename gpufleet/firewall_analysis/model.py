"""The firewall model both parsers produce and the evaluator reads.

A ruleset is a list of tables; a table holds chains; a chain holds rules. A rule is a
conjunction of conditions and one action. Conditions that do not depend on the packet
class (``meta l4proto``, ``tcp flags``, ...) are decided when parsing: a condition that
always holds is left out, one that never holds becomes ``Never``, one that cannot be
decided becomes ``Unsure`` with the reason. Left to the evaluator are ports, source
addresses, the address family, the input interface, and conntrack's view of the packet
(``CtState``, ``Tracked``), which depends on where the chain runs: before conntrack
(ingress, prerouting below priority -200) a packet has no conntrack entry and its state is
``invalid``; after a ``notrack`` there it is ``untracked``; after conntrack a SYN is ``new``.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from gpufleet.errors import ParseError

Family = Literal["ipv4", "ipv6"]
FAMILIES: tuple[Family, ...] = ("ipv4", "ipv6")

HOOK_ORDER = {"ingress": 0, "prerouting": 1, "input": 2}
"""Hooks a packet to a local TCP port passes, in the order it passes them."""

CONNTRACK_PRIORITY = -200
"""Where conntrack runs in prerouting (NF_IP_PRI_CONNTRACK, the same for IPv6)."""

LOOPBACK = {"ipv4": (int(ipaddress.IPv4Address("127.0.0.0")),
                     int(ipaddress.IPv4Address("127.255.255.255"))),
            "ipv6": (1, 1)}


@dataclass(frozen=True)
class Intervals:
    """A union of closed integer intervals, sorted and merged."""

    spans: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, spans: Iterable[tuple[int, int]]) -> Intervals:
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(spans):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return cls(tuple(merged))

    def __contains__(self, value: int) -> bool:
        i = bisect.bisect_right(self.spans, (value, 1 << 130)) - 1
        return i >= 0 and self.spans[i][1] >= value

    def bounds(self) -> Iterator[int]:
        """Where membership can change: each interval's start and one past its end."""
        for lo, hi in self.spans:
            yield lo
            yield hi + 1

    def within(self, lo: int, hi: int) -> bool:
        """Whether every value of ``lo..hi`` is in the union."""
        i = bisect.bisect_right(self.spans, (lo, 1 << 130)) - 1
        return i >= 0 and self.spans[i][0] <= lo and self.spans[i][1] >= hi


def address_span(text: str, family: Family | None = None) -> tuple[Family, int, int]:
    """``10.0.0.1``, ``10.0.0.0/24`` or ``fd00::/64`` as (family, first, last) integers."""
    try:
        if "/" in text:
            net = ipaddress.ip_network(text.strip(), strict=False)
            version, lo, hi = net.version, int(net.network_address), int(net.broadcast_address)
        else:
            address = ipaddress.ip_address(text.strip())
            version, lo, hi = address.version, int(address), int(address)
    except ValueError:
        raise ParseError(f"{text!r} is not an IP address or network") from None
    fam: Family = "ipv4" if version == 4 else "ipv6"
    if family is not None and fam != family:
        raise ParseError(f"{text!r} is not an {family} address")
    return fam, lo, hi


def address_text(family: Family, lo: int, hi: int) -> str:
    """The shortest text for an address interval: an address, a prefix or a range."""
    cls = ipaddress.IPv4Address if family == "ipv4" else ipaddress.IPv6Address
    if lo == hi:
        return str(cls(lo))
    nets = list(ipaddress.summarize_address_range(cls(lo), cls(hi)))
    if len(nets) == 1:
        return str(nets[0])
    return f"{cls(lo)}-{cls(hi)}"


# ----------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class Ports:
    """The TCP destination port is (or, negated, is not) in ``values``."""

    values: Intervals
    negate: bool = False


@dataclass(frozen=True)
class Addrs:
    """The packet is of ``family`` and its source is (or, negated, is not) in ``values``."""

    family: Family
    values: Intervals
    negate: bool = False


@dataclass(frozen=True)
class Pairs:
    """The packet is of ``family`` and its (source, destination port) is in one of the
    ``pairs`` of (sources, ports): ``ip saddr . tcp dport { 10.0.0.1 . 29500 }``."""

    family: Family
    pairs: tuple[tuple[Intervals, Intervals], ...]
    negate: bool = False


@dataclass(frozen=True)
class OnlyFamily:
    """The packet is of ``family`` (``meta nfproto``, or the dependency of ``ip saddr``)."""

    family: Family


@dataclass(frozen=True)
class Iface:
    """The input interface is (or, negated, is not) one of ``names`` (``eth*`` wildcards)."""

    names: tuple[str, ...]
    negate: bool = False
    text: str = ""


CT_STATES = frozenset({"new", "established", "related", "invalid", "untracked"})


@dataclass(frozen=True)
class CtState:
    """conntrack's state of the packet is (or, negated, is not) one of ``states``."""

    states: frozenset[str]
    negate: bool = False
    text: str = ""


@dataclass(frozen=True)
class Tracked:
    """A conntrack test other than the state (``ct status``, ``ct direction``,
    ``--ctproto``): ``holds`` for the SYN of a new, tracked connection; ``without_entry``
    for a packet that has no conntrack entry (before conntrack, or untracked)."""

    holds: bool
    without_entry: bool = False
    text: str = ""


@dataclass(frozen=True)
class Unsure:
    """A condition that may or may not hold for the packet; ``reason`` says why."""

    reason: str


@dataclass(frozen=True)
class Never:
    """A condition no new TCP connection from a cluster member meets (``udp dport 53``)."""

    reason: str


Cond = Ports | Addrs | Pairs | OnlyFamily | Iface | CtState | Tracked | Unsure | Never


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Verdict:
    """accept, drop, reject, return, or continue (no verdict: the next rule runs)."""

    kind: Literal["accept", "drop", "reject", "return", "continue"]


@dataclass(frozen=True)
class Jump:
    """Jump to (``goto=False``: come back after) or go to another chain of the table."""

    target: str
    goto: bool = False


@dataclass(frozen=True)
class Unknown:
    """An action whose outcome cannot be known here (a queue, a rewrite, an unknown target)."""

    reason: str


@dataclass(frozen=True)
class VerdictMap:
    """A verdict map: the first entry whose conditions hold decides; none: no verdict."""

    entries: tuple[tuple[tuple[Cond, ...], Verdict | Jump | Unknown], ...]


Action = Verdict | Jump | Unknown | VerdictMap

CONTINUE = Verdict("continue")


# ----------------------------------------------------------------------------- structure


@dataclass(frozen=True)
class RuleRef:
    """Where a rule is and how it reads: ``text`` as ``nft list ruleset`` or iptables-save
    shows it; ``handle`` for nft rules, ``position`` (1-based) for iptables rules."""

    table: str
    chain: str
    text: str
    handle: int | None = None
    position: int | None = None

    def where(self) -> str:
        if self.handle is not None:
            return f"handle {self.handle}"
        if self.position is not None:
            return f"rule {self.position}"
        return ""


@dataclass(frozen=True)
class Rule:
    """``notrack_after``: the rule untracks the packets that meet its first that many
    conditions (``notrack``, ``-j CT --notrack``); None: it does not."""

    ref: RuleRef
    conds: tuple[Cond, ...]
    action: Action
    notrack_after: int | None = None


@dataclass(frozen=True)
class Hook:
    """What makes a chain a base chain: its hook, priority and policy.

    ``device`` is the interface of an ingress chain; ``device_known`` is False when the
    ruleset does not say it (``nft -j`` before 1.0.7 leaves it out).
    """

    name: str
    priority: int
    policy: Literal["accept", "drop"]
    device: tuple[str, ...] = ()
    device_known: bool = True


@dataclass(frozen=True)
class Chain:
    name: str
    rules: tuple[Rule, ...]
    hook: Hook | None = None


@dataclass(frozen=True)
class Table:
    """``label`` names the table in findings: ``table inet foreign``,
    ``iptables-legacy table filter``. ``families`` are the packets its base chains see."""

    label: str
    families: tuple[Family, ...]
    chains: dict[str, Chain] = field(default_factory=dict)


@dataclass(frozen=True)
class Ruleset:
    """Tables of one source (nft, iptables-legacy ...); ``families`` it describes fully."""

    tables: tuple[Table, ...]
    families: tuple[Family, ...]
    notes: tuple[str, ...] = ()


def check_jumps(ruleset: Ruleset, what: str) -> None:
    """Every jump and goto names a chain of its own table."""
    for table in ruleset.tables:
        for chain in table.chains.values():
            for rule in chain.rules:
                actions: list[Action] = [rule.action]
                if isinstance(rule.action, VerdictMap):
                    actions = [a for _, a in rule.action.entries]
                for action in actions:
                    if isinstance(action, Jump) and action.target not in table.chains:
                        raise ParseError(
                            f"{what}: {table.label} chain {chain.name} {rule.ref.where()} "
                            f"jumps to chain {action.target}, which the table does not have")
