"""A node's complete live ruleset, as one fact, and its analysis for the cluster.

The fact prints, in one snippet, ``nft -j list ruleset``, ``iptables-save`` and
``ip6tables-save`` (whichever backend they use: tables iptables-nft made are decoded from
them), and ``iptables-legacy-save`` where legacy rules exist beside nft's. Parsing is pure;
:func:`analyse_live` runs the whole-range analysis over whatever the node has.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from gpufleet.errors import GpufleetError, ParseError
from gpufleet.facts.catalog import Fact
from gpufleet.firewall_analysis.evaluate import analyse
from gpufleet.firewall_analysis.findings import Analysis
from gpufleet.firewall_analysis.iptables import parse_iptables
from gpufleet.firewall_analysis.model import Ruleset
from gpufleet.firewall_analysis.nft import parse_nft

PARTS = ("nft", "iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy")
_MARK = "@@gpufleet-ruleset:"
_SHELL = "; ".join([
    f"echo '{_MARK}nft'; nft -j list ruleset 2>/dev/null || echo '{_MARK}absent'",
    f"echo '{_MARK}iptables'; iptables-save 2>/dev/null || echo '{_MARK}absent'",
    f"echo '{_MARK}ip6tables'; ip6tables-save 2>/dev/null || echo '{_MARK}absent'",
    f"echo '{_MARK}iptables-legacy'; iptables-legacy-save 2>/dev/null || echo '{_MARK}absent'",
    f"echo '{_MARK}ip6tables-legacy'; ip6tables-legacy-save 2>/dev/null "
    f"|| echo '{_MARK}absent'",
])


def parse_live(text: str) -> dict[str, str | None]:
    """The parts the snippet printed: each tool's output, or None where it is missing."""
    parts: dict[str, str | None] = dict.fromkeys(PARTS)
    current: str | None = None
    lines: list[str] = []
    for line in [*text.splitlines(), f"{_MARK}end"]:
        if line.startswith(_MARK):
            name = line[len(_MARK):]
            if current is not None:
                parts[current] = "\n".join(lines) + "\n" if lines else None
            current, lines = (None, []) if name in ("absent", "end") else (name, [])
            if name not in (*PARTS, "absent", "end"):
                raise ParseError(f"live ruleset: unexpected part {name!r}")
            continue
        if current is not None:
            lines.append(line)
    if parts["nft"] is None and parts["iptables"] is None and parts["iptables-legacy"] is None:
        raise ParseError("live ruleset: neither nft nor iptables-save answered")
    return parts


LIVE_RULESET = Fact("live_ruleset", _SHELL, parse_live, "firewall")


_DROPPING_POLICY = re.compile(r"^:(INPUT|PREROUTING) DROP\b")


def _in_use(save: str | None) -> bool:
    """Whether a legacy save does anything: a rule, or a built-in chain on the input path
    with a DROP policy (which drops everything with no rule at all)."""
    return any(line.startswith("-A ") or _DROPPING_POLICY.match(line)
               for line in (save or "").splitlines())


def rulesets(live: dict[str, Any]) -> list[Ruleset]:
    """Every ruleset the node runs: nft's (iptables-nft tables decoded from the save texts)
    and iptables-legacy's where it has rules or a policy that drops."""
    found: list[Ruleset] = []
    if live.get("nft"):
        found.append(parse_nft(live["nft"], live.get("iptables"), live.get("ip6tables")))
    else:
        for key, family in (("iptables", "ipv4"), ("ip6tables", "ipv6")):
            if live.get(key) is not None:
                found.append(parse_iptables(live[key], family))  # type: ignore[arg-type]
    for key, family in (("iptables-legacy", "ipv4"), ("ip6tables-legacy", "ipv6")):
        if _in_use(live.get(key)):
            found.append(parse_iptables(live[key], family, key))  # type: ignore[arg-type]
    return found


def analyse_live(live: dict[str, Any], sources: Sequence[str],
                 ports: Sequence[tuple[int, int]], iif: str | None = None) -> Analysis:
    """What the node's live rules do to new TCP connections from ``sources`` to ``ports``.
    A family the node has no ruleset for admits everything (no firewall there)."""
    found = rulesets(live)
    families = {f for r in found for f in r.families}
    kept = [s for s in sources if ("ipv6" if ":" in s else "ipv4") in families]
    try:
        return analyse(found, kept, ports, iif=iif)
    except ParseError as exc:
        raise GpufleetError(f"the live ruleset could not be read: {exc}") from exc
