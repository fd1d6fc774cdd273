"""The TCP ports a gpufleet ruleset opens (nftables or iptables, as the firewall role renders
them), to compare with the node's ephemeral port range: every port the kernel may hand NCCL
must be open, over the whole range, not only at the ports a live probe happens to try."""

from __future__ import annotations

import re

from gpufleet.errors import ParseError
from gpufleet.ports import Interval, merge

_NFT_RULE = re.compile(r"^\s*tcp dport (\{[^}]*\}|\S+) .*\baccept\s*$")
_IPT_RULE = re.compile(r"^-A \S+ .*--dport (\d+(?::\d+)?) .*-j ACCEPT\s*$")


def _interval(text: str, line: str) -> Interval:
    parts = re.split(r"[-:]", text.strip())
    try:
        low, high = (int(parts[0]), int(parts[-1]))
    except ValueError:
        raise ParseError(f"not a port or port range {text!r} in {line.strip()!r}") from None
    if not 0 < low <= high <= 65535 or len(parts) > 2:
        raise ParseError(f"not a port or port range {text!r} in {line.strip()!r}")
    return low, high


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
