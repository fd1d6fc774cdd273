"""Network placement verdicts on the pairs ping measured (``measure/network.py``): a
routed hop, a path MTU below the fabric's, a round trip or jitter over its bound.

A pair without any echo reply is unknown (ICMP blocked, or the node is down), never a
pass. Blame: a node every one of whose measured pairs fails a check is at fault and
named alone (one node behind a router, one node at MTU 1500 on a jumbo fabric); a pair
that fails while both ends have good pairs fails both ends, named as a pair (a link or a
switch port).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class PairResult:
    """What ping saw from one source to one target."""

    direct: bool  # an echo with TTL 1 arrived
    mtu: int  # the packet size the don't-fragment echo carried
    mtu_ok: bool
    received: int
    sent: int
    rtt_min_us: float | None = None
    jitter_us: float | None = None

    @property
    def answered(self) -> bool:
        return self.received > 0 or self.direct or self.mtu_ok


@dataclass
class Placement:
    """Every measured pair, and the sources that could not be measured."""

    results: dict[tuple[str, str], PairResult] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    mtu: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"mtu": self.mtu, "errors": self.errors, "pairs": [
            {"source": s, "target": t, "direct": r.direct, "mtu": r.mtu, "mtu_ok": r.mtu_ok,
             "sent": r.sent, "received": r.received, "rtt_min_us": r.rtt_min_us,
             "jitter_us": r.jitter_us} for (s, t), r in sorted(self.results.items())]}

    def failures(self, node: str, failing: Callable[[PairResult], str | None]
                 ) -> list[str]:
        """What fails ``node`` for one check: ``failing`` says why a pair fails (None: it
        passes); a node whose every pair fails is at fault alone, a pair that fails
        between two otherwise good nodes fails both."""
        bad = {pair: why for pair, r in self.results.items()
               if r.answered and (why := failing(r)) is not None}
        culprits = {n for n in self._nodes() if self._all_fail(n, bad)}
        if node in culprits:
            whys = sorted({why for pair, why in bad.items() if node in pair})
            return [f"every measured path to and from {node}: {'; '.join(whys)}"]
        return [f"{s} -> {t}: {why}" for (s, t), why in sorted(bad.items())
                if node in (s, t) and not ({s, t} - {node}) & culprits]

    def silent(self, node: str) -> list[str]:
        """Where not one echo came back: every path of ``node`` (named alone), else its
        pairs with nodes that do answer elsewhere."""
        quiet = {p for p, r in self.results.items() if not r.answered}
        mute = {n for n in self._nodes()
                if all(p in quiet for p in self.results if n in p)}
        if node in mute:
            return [f"every path to and from {node}"]
        return [f"{s} -> {t}" for (s, t) in sorted(quiet)
                if node in (s, t) and not ({s, t} - {node}) & mute]

    def _nodes(self) -> set[str]:
        return {n for pair in self.results for n in pair}

    def _all_fail(self, node: str, bad: dict[tuple[str, str], str]) -> bool:
        mine = [p for p, r in self.results.items() if node in p and r.answered]
        return bool(mine) and all(p in bad for p in mine)


def hop_failure(r: PairResult) -> str | None:
    return None if r.direct else "a routed hop (an echo with TTL 1 does not arrive)"


def mtu_failure(r: PairResult) -> str | None:
    return None if r.mtu_ok else (f"path MTU below {r.mtu} (a {r.mtu}-byte packet with "
                                  "don't-fragment does not arrive)")


def rtt_failure(max_rtt_us: float, max_jitter_us: float) -> Callable[[PairResult], str | None]:
    def failing(r: PairResult) -> str | None:
        if r.rtt_min_us is None:
            return None
        if r.rtt_min_us > max_rtt_us:
            return f"round trip {r.rtt_min_us:.0f} µs (net_max_rtt_us {max_rtt_us:g})"
        if r.jitter_us is not None and r.jitter_us > max_jitter_us:
            return f"jitter {r.jitter_us:.0f} µs (net_max_jitter_us {max_jitter_us:g})"
        return None

    return failing
