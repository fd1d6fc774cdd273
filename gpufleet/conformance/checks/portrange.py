"""The TCP ports a gpufleet ruleset opens (nftables or iptables, as roles/firewall.py renders
them), compared with the node's ephemeral port range: every port the kernel may hand NCCL
must be open, over the whole range, not only at the ports a live probe happens to try."""

from __future__ import annotations

import re

from gpufleet.errors import ParseError

_NFT_RULE = re.compile(r"^\s*tcp dport (\{[^}]*\}|\S+) .*\baccept\s*$")
_IPT_RULE = re.compile(r"^-A \S+ .*--dport (\d+(?::\d+)?) .*-j ACCEPT\s*$")
Interval = tuple[int, int]


def _interval(text: str, line: str) -> Interval:
    parts = re.split(r"[-:]", text.strip())
    try:
        low, high = (int(parts[0]), int(parts[-1]))
    except ValueError:
        raise ParseError(f"not a port or port range {text!r} in {line.strip()!r}") from None
    if not 0 < low <= high <= 65535 or len(parts) > 2:
        raise ParseError(f"not a port or port range {text!r} in {line.strip()!r}")
    return low, high


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, with overlapping and adjacent intervals joined."""
    joined: list[Interval] = []
    for low, high in sorted(intervals):
        if joined and low <= joined[-1][1] + 1:
            joined[-1] = (joined[-1][0], max(high, joined[-1][1]))
        else:
            joined.append((low, high))
    return joined


def opened_ports(ruleset: str) -> list[Interval]:
    """TCP destination ports the ruleset accepts, merged (from ``tcp dport ... accept`` and
    ``--dport ... -j ACCEPT`` rules)."""
    found: list[Interval] = []
    for line in ruleset.splitlines():
        nft = _NFT_RULE.match(line)
        if nft:
            spec = nft.group(1).strip("{} ")
            found += [_interval(item, line) for item in spec.split(",") if item.strip()]
            continue
        ipt = _IPT_RULE.match(line.strip())
        if ipt:
            found.append(_interval(ipt.group(1), line))
    return merge(found)


def closed_within(opened: list[Interval], low: int, high: int) -> list[Interval]:
    """The stretches of ``low``-``high`` that no opened interval covers."""
    closed: list[Interval] = []
    cursor = low
    for first, last in merge(opened):
        if last < cursor:
            continue
        if first > high:
            break
        if first > cursor:
            closed.append((cursor, first - 1))
        cursor = max(cursor, last + 1)
    if cursor <= high:
        closed.append((cursor, high))
    return closed


def describe(intervals: list[Interval]) -> str:
    """``29500, 49152-65535``."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in intervals) or "none"
