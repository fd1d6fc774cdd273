"""Whole-range firewall analysis: does any rule of a node's live ruleset drop new TCP
connections from cluster members to the rendezvous port or to any port of a range?

Pure functions over captured text (no I/O)::

    analysis = analyse_nft(nft_json, sources=["10.0.0.11", "fd00::13"],
                           ports=[(29500, 29500), (49152, 65535)], iif="eth0")
    analysis.clean          # every source reaches every port for sure
    analysis.blocked        # [Finding]: surely dropped or rejected
    analysis.uncertain      # [Finding]: may be dropped (rate limit, rule not understood ...)
    analysis.messages()     # one line per finding that is not accepted, e.g.
    # "tcp dports 52000-52199 from 10.0.0.12 are dropped by table inet foreign chain input
    #  (priority -10) handle 2: tcp dport 52000-52199 drop"

- ``analyse_nft(ruleset_json, sources, ports, *, iif=None, iptables_save=None,
  ip6tables_save=None)``: the output of ``nft -j list ruleset``. Tables made by
  iptables-nft hold ``xt`` expressions nft cannot decode; give the ``iptables-save`` /
  ``ip6tables-save`` output taken at the same time and those tables are read from it.
- ``analyse_iptables(iptables_save, sources, ports, *, iif=None, ip6tables_save=None)``:
  the output of ``iptables-save`` (IPv4 sources) and ``ip6tables-save`` (IPv6 sources),
  legacy or nft; a family whose save text is None cannot be analysed (error).
- ``analyse(rulesets, sources, ports, *, iif=None)`` over ``parse_nft(...)`` and
  ``parse_iptables(text, family, label)`` results together: a node running nft tables
  and iptables-legacy rules side by side.

``sources`` are addresses or networks; ``ports`` are (first, last) ranges; ``iif`` is the
interface cluster traffic arrives on (None: unknown, then rules that test another
interface than ``lo`` make the verdict uncertain).

Each ``Finding`` has ``verdict`` (accepted / dropped / rejected / uncertain), ``sources``,
``ports`` (first, last), ``rule`` (the deciding rule with its table, chain, base chain
priority, handle or position and text) and, when uncertain, ``cause`` (the rule that may
or may not apply, and why); ``message()`` is the line above. Malformed input raises
``ParseError``; bad sources or ports raise ``GpufleetError``. See docs/firewall-analysis.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufleet.firewall_analysis.evaluate import analyse
from gpufleet.firewall_analysis.findings import Analysis, Cause, Finding, Located, Outcome
from gpufleet.firewall_analysis.iptables import parse_iptables
from gpufleet.firewall_analysis.model import RuleRef, Ruleset
from gpufleet.firewall_analysis.nft import parse_nft

__all__ = [
    "Analysis",
    "Cause",
    "Finding",
    "Located",
    "Outcome",
    "RuleRef",
    "Ruleset",
    "analyse",
    "analyse_iptables",
    "analyse_nft",
    "parse_iptables",
    "parse_nft",
]


def analyse_nft(ruleset_json: str, sources: Sequence[str], ports: Sequence[tuple[int, int]],
                *, iif: str | None = None, iptables_save: str | None = None,
                ip6tables_save: str | None = None) -> Analysis:
    """Analyse ``nft -j list ruleset`` output (iptables-nft tables from the save texts)."""
    return analyse([parse_nft(ruleset_json, iptables_save, ip6tables_save)], sources, ports,
                   iif=iif)


def analyse_iptables(iptables_save: str | None, sources: Sequence[str],
                     ports: Sequence[tuple[int, int]], *, iif: str | None = None,
                     ip6tables_save: str | None = None) -> Analysis:
    """Analyse ``iptables-save`` (IPv4) and ``ip6tables-save`` (IPv6) output."""
    rulesets = []
    if iptables_save is not None:
        rulesets.append(parse_iptables(iptables_save, "ipv4"))
    if ip6tables_save is not None:
        rulesets.append(parse_iptables(ip6tables_save, "ipv6"))
    return analyse(rulesets, sources, ports, iif=iif)
