"""Whole-range firewall analysis on real captured rulesets (tests/fixtures/firewall).

Every capture was made by tests/fixtures/firewall/capture.sh: the scenario's rules loaded
into a network namespace with the real nft / iptables tools, then ``nft -j list ruleset``,
``nft -a list ruleset`` and the iptables save outputs saved. The cluster is the one of
tests/fixtures/firewall/inventory.yml, whose gpufleet rulesets roles/firewall.py rendered.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import pytest

from gpufleet.errors import GpufleetError, ParseError
from gpufleet.firewall_analysis import (
    Analysis,
    Finding,
    Ruleset,
    analyse,
    analyse_iptables,
    analyse_nft,
    parse_iptables,
    parse_nft,
)
from gpufleet.firewall_analysis.live import analyse_live, parse_live
from gpufleet.firewall_analysis.nft_text import rule_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "firewall"
SCENARIOS = sorted(p.name for p in FIXTURES.iterdir() if (p / "setup.sh").exists())
CLUSTER = ("10.0.0.11", "10.0.0.12", "10.0.0.13", "fd00::13", "192.168.100.0/24")
V4 = ("10.0.0.11", "10.0.0.12", "10.0.0.13", "192.168.100.0/24")
PORTS = [(29500, 29500), (49152, 65535)]
FIVE = "5 sources (10.0.0.11, 10.0.0.12, 10.0.0.13, ...)"
FOUR = "4 sources (10.0.0.11, 10.0.0.12, 10.0.0.13, ...)"


def capture(scenario: str, name: str) -> str | None:
    path = FIXTURES / scenario / name
    return path.read_text() if path.exists() else None


@functools.cache
def rulesets(scenario: str) -> tuple[Ruleset, ...]:
    """The scenario's nft ruleset (iptables-nft tables decoded from their save output) and
    its iptables-legacy rules."""
    found = [parse_nft(capture(scenario, "nft.json") or "",
                       capture(scenario, "iptables-nft-save.txt"),
                       capture(scenario, "ip6tables-nft-save.txt"))]
    for family, tool in (("ipv4", "iptables-legacy"), ("ipv6", "ip6tables-legacy")):
        legacy = capture(scenario, f"{tool}-save.txt")
        if legacy is not None:
            found.append(parse_iptables(legacy, family, tool))
    return tuple(found)


def analysed(scenario: str, iif: str | None = "eth0",
             sources: tuple[str, ...] = CLUSTER) -> Analysis:
    return analyse(rulesets(scenario), sources, PORTS, iif=iif)


# ----------------------------------------------------------------------- gpufleet's own rules


def test_a_clean_gpufleet_ruleset_accepts_every_cluster_source_on_every_port() -> None:
    analysis = analysed("gpufleet")
    assert analysis.clean
    assert analysis.findings == (Finding("accepted", CLUSTER, (29500, 29500)),
                                 Finding("accepted", CLUSTER, (49152, 65535)))
    assert analysis.messages() == []


def test_a_clean_gpufleet_ruleset_is_accepted_without_knowing_the_interface() -> None:
    assert analysed("gpufleet", iif=None).clean


def test_the_gpufleet_ruleset_drops_sources_outside_the_cluster() -> None:
    analysis = analysed("gpufleet", sources=("10.9.9.9", "fd00::99", "10.0.0.11"))
    rule = "table inet gpufleet chain input (priority 0) handle 16: drop"
    assert analysis.messages() == [
        f"tcp dport 29500 from 10.9.9.9, fd00::99 is dropped by {rule}",
        f"tcp dports 49152-65535 from 10.9.9.9, fd00::99 are dropped by {rule}",
    ]
    assert [f.sources for f in analysis.accepted] == [("10.0.0.11",), ("10.0.0.11",)]


def test_the_gpufleet_iptables_backend_under_iptables_legacy_accepts_the_cluster() -> None:
    legacy = capture("iptables_legacy", "iptables-legacy-save.txt") or ""
    gpufleet_only = "\n".join(line for line in legacy.splitlines()
                              if not line.startswith(("-A INPUT -s", "-A INPUT -p",
                                                      "-A PREROUTING")))
    analysis = analyse_iptables(gpufleet_only, V4, PORTS, iif="eth0")
    assert analysis.clean


# ----------------------------------------------------------------------- foreign tables


def test_a_foreign_higher_priority_table_that_drops_the_rendezvous_port() -> None:
    analysis = analysed("foreign_priority")
    assert analysis.messages() == [
        f"tcp dport 29500 from {FIVE} is dropped by table inet foreign chain input "
        "(priority -10) handle 2: tcp dport 29500 drop"]
    (finding,) = analysis.blocked
    assert finding.sources == CLUSTER
    assert finding.rule is not None and finding.rule.rule.handle == 2
    assert [f.ports for f in analysis.accepted] == [(49152, 65535)]


def test_a_100_port_hole_after_gpufleets_accept_still_drops() -> None:
    """Accept in gpufleet's chain ends only that base chain; a later one still drops."""
    analysis = analysed("hole100")
    assert analysis.messages() == [
        f"tcp dports 57000-57099 from {FIVE} are dropped by table inet ops chain input "
        "(priority 10) handle 3: tcp dport 57000-57099 counter drop"]
    assert [f.ports for f in analysis.accepted] == [(29500, 29500), (49152, 56999),
                                                    (57100, 65535)]


def test_a_200_port_hole_in_the_middle_of_the_range() -> None:
    analysis = analysed("hole200", sources=("10.0.0.12",))
    assert analysis.messages() == [
        "tcp dports 52000-52199 from 10.0.0.12 are dropped by table inet foreign chain input "
        "(priority -10) handle 2: tcp dport 52000-52199 drop"]


def test_a_policy_drop_chain_in_another_table_without_an_accept_for_the_range() -> None:
    analysis = analysed("policy_drop")
    policy = "table inet hardening chain input (priority 0): policy drop"
    assert analysis.messages() == [
        f"tcp dport 29500 from {FIVE} is dropped by {policy}",
        f"tcp dports 49152-65535 from {FIVE} are dropped by {policy}"]


def test_one_blocked_source() -> None:
    analysis = analysed("saddr_drop")
    rule = ("table ip blocklist chain input (priority -5) handle 2: "
            "ip saddr 10.0.0.12 counter drop")
    assert analysis.messages() == [
        f"tcp dport 29500 from 10.0.0.12 is dropped by {rule}",
        f"tcp dports 49152-65535 from 10.0.0.12 are dropped by {rule}"]
    assert {s for f in analysis.accepted for s in f.sources} == set(CLUSTER) - {"10.0.0.12"}


def test_ipv6_sources_against_an_ip6_table() -> None:
    analysis = analysed("ipv6")
    assert analysis.messages() == [
        "tcp dport 29500 from fd00::13 is rejected by table ip6 v6guard chain input "
        "(priority -5) handle 4: ip6 saddr fd00::/64 tcp dport 29500 reject with tcp reset",
        "tcp dports 49152-65535 from fd00::13 are dropped by table ip6 v6guard chain input "
        "(priority -5) handle 3: ip6 saddr @bad tcp dport 49152-65535 drop"]
    assert all("fd00::13" not in f.sources for f in analysis.accepted)


def test_named_anonymous_and_concatenated_interval_sets() -> None:
    analysis = analysed("sets")
    blocked = "10.0.0.13, 192.168.100.128/25 (of 192.168.100.0/24)"
    by_set = ("table inet sets chain input (priority -10) handle 5: "
              "ip saddr @blocked_src tcp dport @closed drop")
    anonymous = ("table inet sets chain input (priority -10) handle 8: tcp dport "
                 "{ 58000, 58100-58199 } ip saddr { 10.0.0.11, 10.0.0.12 } "
                 "reject with icmp port-unreachable")
    pairs = "table inet sets chain input (priority -10) handle 9: ip saddr . tcp dport @pairs drop"
    assert analysis.messages() == [
        f"tcp dports 50000-50099 from {blocked} are dropped by {by_set}",
        f"tcp dport 58000 from 10.0.0.11, 10.0.0.12 is rejected by {anonymous}",
        f"tcp dports 58100-58199 from 10.0.0.11, 10.0.0.12 are rejected by {anonymous}",
        f"tcp dport 59000 from 10.0.0.11 is dropped by {pairs}",
        f"tcp dports 59001-59010 from 10.0.0.12 are dropped by {pairs}",
        f"tcp dport 60000 from {blocked} is dropped by {by_set}",
        f"tcp dports 61000-61009 from {blocked} are dropped by {by_set}"]
    assert analysis.blocked[0].sources == ("10.0.0.13", "192.168.100.128/25 (of 192.168.100.0/24)")


def test_verdict_maps_named_with_intervals_and_a_jump_and_anonymous_by_source() -> None:
    analysis = analysed("vmap")
    by_source = ("table inet vmaps chain input (priority -10) handle 8: "
                 "ip saddr vmap { 10.0.0.13 : drop }")
    assert analysis.messages() == [
        f"tcp dports 49152-54999 from 10.0.0.13 are dropped by {by_source}",
        f"tcp dports 55000-55049 from {FIVE} are dropped by table inet vmaps chain input "
        "(priority -10) handle 6: tcp dport vmap @portmap",
        f"tcp dports 55050-55999 from 10.0.0.13 are dropped by {by_source}",
        "tcp dports 56000-56009 from 4 sources (10.0.0.12, 10.0.0.13, fd00::13, ...) are "
        "dropped by table inet vmaps chain audit (reached from chain input, priority -10) "
        "handle 5: drop",
        f"tcp dports 56010-65535 from 10.0.0.13 are dropped by {by_source}"]
    assert analysis.accepted[0] == Finding("accepted", CLUSTER, (29500, 29500))


def test_jump_comes_back_and_goto_does_not() -> None:
    analysis = analysed("jumps")
    assert analysis.messages() == [
        "tcp dports 60000-60099 from 10.0.0.12, 10.0.0.13 are dropped by table inet chains "
        "chain deny (reached from chain input, priority -10) handle 6: drop",
        "tcp dports 62000-62009 from fd00::13 are rejected by table inet chains chain from_v6 "
        "(reached from chain input, priority -10) handle 9: tcp dport 62000-62009 reject",
        f"tcp dports 62000-62999 from {FOUR} are dropped by table inet chains chain input "
        "(priority -10) handle 13: tcp dport 62000-62999 drop"]
    assert analysis.blocked[2].sources == V4


# ----------------------------------------------------------------------- iptables


def test_iptables_legacy_rules_beside_an_empty_nft_ruleset() -> None:
    analysis = analysed("iptables_legacy", sources=V4)
    assert analysis.messages() == [
        "tcp dport 29500 from 10.0.0.12 is dropped by iptables-legacy table filter chain "
        "INPUT (priority 0) rule 1: -A INPUT -s 10.0.0.12/32 -p tcp -m tcp --dport 29500 "
        "-j DROP",
        "tcp dports 63000-63099 from 10.0.0.13 are dropped by iptables-legacy table raw chain "
        "PREROUTING (hook prerouting, priority -300) rule 1: -A PREROUTING -s 10.0.0.13/32 "
        "-p tcp -m tcp --dport 63000:63099 -j DROP"]


def test_iptables_accept_ends_the_chain_so_a_later_reject_does_not_apply() -> None:
    """-A INPUT -p tcp -m multiport --dports 50000:50099 -j REJECT follows the jump to
    GPUFLEET-INPUT, which accepts the cluster and drops everyone else."""
    legacy = capture("iptables_legacy", "iptables-legacy-save.txt")
    analysis = analyse_iptables(legacy, ("10.0.0.11", "10.9.9.9"), [(50000, 50099)])
    assert analysis.messages() == [
        "tcp dports 50000-50099 from 10.9.9.9 are dropped by iptables table filter chain "
        "GPUFLEET-INPUT (reached from chain INPUT, priority 0) rule 18: "
        "-A GPUFLEET-INPUT -j DROP"]


def test_ipv6_sources_need_an_ip6tables_save() -> None:
    legacy = capture("iptables_legacy", "iptables-legacy-save.txt")
    with pytest.raises(GpufleetError, match=r"no ipv6 ruleset was given for the ipv6 sources "
                                            r"\(fd00::13\)"):
        analyse_iptables(legacy, CLUSTER, PORTS)


def test_iptables_nft_tables_are_read_from_iptables_save() -> None:
    analysis = analysed("iptables_nft")
    reject = ("table ip filter chain INPUT (priority 0) handle 22: -A INPUT -p tcp -m "
              "multiport --dports 51000:51099,51500 -m conntrack --ctstate NEW -j REJECT "
              "--reject-with tcp-reset")
    assert analysis.messages() == [
        "tcp dport 29500 from fd00::13 is dropped by table ip6 filter chain INPUT "
        "(priority 0) handle 2: ip6 saddr fd00::13 tcp dport 29500 counter drop",
        f"tcp dports 51000-51099 from {FOUR} are rejected by {reject}",
        f"tcp dport 51500 from {FOUR} is rejected by {reject}"]
    assert analysis.notes == ("table ip filter was made by iptables-nft: its rules are read "
                              "from iptables-save",)
    assert not analysis.uncertain


def test_iptables_nft_tables_without_their_save_output_are_not_understood() -> None:
    analysis = analyse_nft(capture("iptables_nft", "nft.json") or "", V4, PORTS, iif="eth0")
    assert analysis.notes == ("table ip filter was made by iptables-nft: without its "
                              "iptables-save output, its xt matches and targets are not "
                              "understood",)
    rule = ('table ip filter chain INPUT (priority 0) handle 22: meta l4proto tcp xt match '
            '"multiport" xt match "conntrack" counter xt target "REJECT" (not understood: xt '
            'match "multiport" (made by iptables-nft; its iptables-save output decodes it))')
    assert analysis.messages() == [
        f"tcp dport 29500 from {FOUR} may be dropped by {rule}",
        f"tcp dports 49152-65535 from {FOUR} may be dropped by {rule}"]
    assert not analysis.blocked


def test_an_iptables_save_that_does_not_match_the_nft_tables_is_refused() -> None:
    other = capture("iptables_legacy", "iptables-legacy-save.txt")
    with pytest.raises(ParseError, match=r"iptables-save: table filter chain INPUT does not "
                                         r"match table ip filter of the nft ruleset \(2 rules "
                                         r"there, 3 rules in iptables-save\)"):
        parse_nft(capture("iptables_nft", "nft.json") or "", other)


# ----------------------------------------------------------------------- packet state


def test_ct_state_rules_for_a_new_connection() -> None:
    """established,related accept admits nothing new, invalid drop drops no valid SYN."""
    analysis = analysed("ctstate")
    assert analysis.messages() == [
        f"tcp dports 60000-65535 from {FIVE} are dropped by table inet states chain input "
        "(priority -10): policy drop"]
    assert [f.ports for f in analysis.accepted] == [(29500, 29500), (49152, 59999)]


# ------------------------------------------------------------- conntrack's view, as the kernel
# Each scenario below was also probed with real TCP connects in a network namespace (the
# outcome is in its docstring); tests/lab/test_firewall_kernel.py does so for generated ones.


def test_ct_state_invalid_drop_before_conntrack_drops_every_syn() -> None:
    """Kernel: 29500 dropped (no conntrack entry yet at priority raw: the state is invalid);
    the same line at priority mangle, after conntrack, drops nothing."""
    assert analysed("early_invalid").messages() == [
        f"tcp dport 29500 from {FIVE} is dropped by table inet hardening chain raw (hook "
        "prerouting, priority -300) handle 3: tcp dport 29500 ct state invalid drop"]


def test_ct_state_new_accept_before_conntrack_never_matches() -> None:
    """Kernel: 60000-60099 dropped by the rule after the accept that never matched."""
    assert analysed("early_new").messages() == [
        f"tcp dports 60000-60099 from {FIVE} are dropped by table inet early chain raw (hook "
        "prerouting, priority -250) handle 3: tcp dport 60000-60099 drop"]


def test_an_untracked_range_meets_no_stateful_accept() -> None:
    """Kernel: the whole range dropped by the input chain's policy; 29500 admitted."""
    assert analysed("notrack_range").messages() == [
        f"tcp dports 49152-65535 from {FIVE} are dropped by table inet raw_range chain input "
        "(priority 0): policy drop"]


def test_ct_state_new_drop_before_conntrack_drops_nothing_new() -> None:
    """Kernel: 29500 admitted (the drop never matched); 55000 dropped as invalid."""
    assert analysed("early_new_drop").messages() == [
        f"tcp dport 55000 from {FOUR} is dropped by table ip early chain raw (hook "
        "prerouting, priority -300) handle 4: ct state { invalid, new } tcp dport 55000 drop"]


def test_of_equal_priority_the_chain_registered_last_runs_first() -> None:
    """Kernel: 29500 dropped silently by the second table's chain, no reset from the
    first's."""
    assert analysed("equal_priority").messages() == [
        f"tcp dport 29500 from {FIVE} is dropped by table inet second chain input "
        "(priority -5) handle 2: tcp dport 29500 drop"]


@pytest.mark.parametrize("scenario", ["raw_iptables_nft", "raw_iptables_legacy"])
def test_iptables_raw_table_runs_before_conntrack(scenario: str) -> None:
    """Kernel, both backends: 29500 dropped by the raw table's INVALID line, 49152-49999
    (untracked there) dropped in INPUT, which accepts only NEW; the rest admitted."""
    messages = analysed(scenario).messages()
    assert len(messages) == 2
    assert messages[0].startswith(f"tcp dport 29500 from {FOUR} is dropped by ")
    assert " raw chain PREROUTING (hook prerouting, priority -300) " in messages[0]
    assert "--dport 29500 -m " in messages[0] and "INVALID -j DROP" in messages[0]
    assert messages[1].startswith(f"tcp dports 49152-49999 from {FOUR} are dropped by ")
    assert messages[1].endswith("-A INPUT -p tcp -m tcp --dport 49152:65535 -j DROP")


def _with_ingress_device(scenario: str, device: str) -> str:
    """The capture with the ingress chain's device put back (nft 1.0.6 leaves it out)."""
    doc = json.loads(capture(scenario, "nft.json") or "")
    for item in doc["nftables"]:
        if item.get("chain", {}).get("hook") == "ingress":
            item["chain"]["dev"] = device
    return json.dumps(doc)


def test_an_ingress_chain_runs_before_conntrack() -> None:
    """Kernel: 29500 dropped (invalid there), 50000 dropped (its != invalid accept never
    matches)."""
    analysis = analyse_nft(_with_ingress_device("ingress_invalid", "eth0"), CLUSTER, PORTS,
                           iif="eth0")
    assert verdict_at(analysis, 29500) == verdict_at(analysis, 50000) == {"dropped"}
    assert verdict_at(analysis, 49999) == verdict_at(analysis, 50001) == {"accepted"}


def _at_priority(scenario: str, chain: str, priority: int) -> str:
    doc = json.loads(capture(scenario, "nft.json") or "")
    for item in doc["nftables"]:
        if item.get("chain", {}).get("name") == chain:
            item["chain"]["prio"] = priority
    return json.dumps(doc)


@pytest.mark.parametrize(("priority", "verdict"), [
    (-201, "dropped"), (-200, "uncertain"), (-199, "accepted")])
def test_conntrack_runs_at_priority_minus_200(priority: int, verdict: str) -> None:
    """At -200 itself the chain runs before or after conntrack, whichever hook was
    registered last."""
    analysis = analyse_nft(_at_priority("early_invalid", "raw", priority), CLUSTER, PORTS)
    assert verdict_at(analysis, 29500) == {verdict}
    if verdict == "uncertain":
        assert "the chain runs at conntrack's priority -200, before or after it" in (
            analysis.messages()[0])


def test_conntrack_tests_other_than_the_state_never_match_without_an_entry() -> None:
    """ct status and ct direction end the rule when the packet has no conntrack entry
    (NFT_BREAK, whatever the operator); after conntrack they read the new connection."""
    def rule(*exprs: object) -> dict[str, object]:
        return {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 9,
                         "expr": [*exprs, {"drop": None}]}}

    def ct(key: str, op: str, right: object) -> dict[str, object]:
        return {"match": {"op": op, "left": {"ct": {"key": key}}, "right": right}}

    for prio, dropped in ((-300, False), (0, True)):
        doc = {"nftables": [
            {"table": {"family": "inet", "name": "t", "handle": 1}},
            {"chain": {"family": "inet", "table": "t", "name": "c", "handle": 1,
                       "type": "filter", "hook": "prerouting" if prio < 0 else "input",
                       "prio": prio, "policy": "accept"}},
            rule(ct("status", "!=", "dnat")), rule(ct("direction", "==", "original"))]}
        analysis = analyse_nft(json.dumps(doc), CLUSTER, PORTS)
        assert bool(analysis.blocked) == dropped


def _live(scenario: str) -> Analysis:
    """The scenario as the firewall check reads it (live.txt, the check's own snippet)."""
    return analyse_live(parse_live(capture(scenario, "live.txt") or ""), CLUSTER, PORTS,
                        "eth0")


def test_a_legacy_drop_policy_without_a_rule_drops_everything() -> None:
    """Kernel: every new connection dropped. iptables-legacy's save with no rule but a DROP
    policy used to be passed over as empty."""
    assert _live("legacy_policy_drop").messages() == [
        f"tcp dport{p} from {FOUR} {v} dropped by iptables-legacy table filter chain INPUT "
        "(priority 0): policy drop" for p, v in ((" 29500", "is"), ("s 49152-65535", "are"))]


def test_equal_priority_between_legacy_and_nft_is_uncertain() -> None:
    """Which of two base chains of one priority runs first is their registration order,
    which neither listing shows: where the order decides, the verdict is uncertain
    (the kernel admitted 50000 here: its nft chain was registered last, so it ran first,
    before the legacy notrack)."""
    [finding] = _live("legacy_nft_tie").uncertain
    assert (finding.ports, finding.verdict) == ((50000, 50000), "uncertain")
    assert finding.cause is not None
    assert finding.cause.reason == ("base chains of equal priority from nft and iptables run "
                                    "in the order they were registered, which no listing shows")
    assert str(finding.cause.at) == (
        "iptables-legacy table raw chain PREROUTING (hook prerouting, priority -300): its "
        "order against table inet early chain raw")
    assert not _live("legacy_nft_tie").blocked


def test_ct_state_not_of_two_states_without_braces_matches_every_state() -> None:
    """Kernel: 50000-50099 dropped. Without braces the two states are one value (their
    bits OR'ed), which no packet's state equals."""
    assert analysed("ct_state_or").messages() == [
        f"tcp dports 50000-50099 from {FIVE} are dropped by table inet orbits chain input "
        "(priority -10) handle 2: tcp dport 50000-50099 ct state != established | related drop"]


def test_rate_limits_are_possible_drops() -> None:
    analysis = analysed("ratelimit")
    assert not analysis.blocked
    assert analysis.messages() == [
        f"tcp dport 29500 from {FIVE} may be dropped by table inet rl chain input "
        "(priority -10) handle 2: tcp dport 29500 ct state new limit rate over 50/second "
        "burst 100 packets drop (rate limited: limit rate over 50/second burst 100 packets)",
        f"tcp dports 49152-65535 from {FIVE} may be dropped by table inet rl chain input "
        "(priority -10) handle 4: tcp dport 49152-65535 drop, depending on table inet rl "
        "chain input (priority -10) handle 3: tcp dport 49152-65535 limit rate 1000/second "
        "accept (rate limited: limit rate 1000/second)"]


def test_expressions_not_understood_are_uncertain_never_accepted() -> None:
    analysis = analysed("unknown")
    assert not analysis.blocked
    assert analysis.messages() == [
        f"tcp dport 29500 from {FIVE} may be dropped by table inet odd chain input "
        '(priority -10) handle 2: meta hour "01:00"-"03:00" tcp dport 29500 drop '
        '(not understood: meta hour "01:00"-"03:00")',
        f"tcp dports 60000-60009 from {FOUR} may be dropped by table inet odd chain input "
        "(priority -10) handle 3: tcp dport 60000-60009 ip dscp cs1 drop "
        "(not understood: ip dscp cs1)"]


def test_what_a_new_connection_is_known_to_carry_decides_without_doubt() -> None:
    """Reverse path, local destination, unicast, no NAT, TCP and a SYN are known; the
    quota, the destination rewrite and the source port are not."""
    analysis = analysed("packet_facts")
    assert analysis.messages() == [
        "tcp dports 60000-60009 from fd00::13 are dropped by table inet facts chain input "
        "(priority -10) handle 13: meta nfproto ipv6 tcp dport 60000-60009 drop",
        f"tcp dport 61000 from {FIVE} may be dropped by table inet facts chain input "
        "(priority -10) handle 15: quota over 1000 mbytes tcp dport 61000 drop "
        "(quota: quota over 1000 mbytes)",
        f"tcp dport 62000 from {FIVE} may be dropped by table inet facts chain nat "
        "(hook prerouting, priority -100) handle 7: tcp dport 62000 dnat ip to "
        "10.0.0.99:80 (the packet is queued or rewritten: dnat ip to 10.0.0.99:80)",
        f"tcp dport 63000 from {FIVE} may be dropped by table inet facts chain input "
        "(priority -10) handle 16: tcp sport 1024-65535 tcp dport 63000 drop "
        "(depends on the source port: tcp sport 1024-65535)"]


def test_iptables_options_for_a_new_connection() -> None:
    """-i lo, --state INVALID, -p udp, ! --syn, ! --dst-type LOCAL and -i eth1 never
    apply; LOG has no verdict; -g SLOW then RETURN ends INPUT, so the DROP after the goto
    does not apply to 10.0.0.11; hashlimit is not understood."""
    analysis = analysed("iptables_options")
    assert analysis.messages() == [
        "tcp dports 51000-51009 from 10.0.0.12, 10.0.0.13 are dropped by iptables-legacy "
        "table filter chain INPUT (priority 0) rule 7: -A INPUT -p tcp -m iprange "
        "--src-range 10.0.0.12-10.0.0.13 -m multiport --dports 51000:51009 -j DROP",
        f"tcp dport 53000 from {FOUR} may be dropped by iptables-legacy table filter chain "
        "INPUT (priority 0) rule 9: -A INPUT -p tcp -m tcp --dport 53000 -m hashlimit "
        "--hashlimit-above 10/sec --hashlimit-burst 5 --hashlimit-name probe -j DROP "
        "(not understood: -m hashlimit --hashlimit-above 10/sec)",
        f"tcp dport 55000 from {FOUR} is rejected by iptables-legacy table filter chain "
        "INPUT (priority 0) rule 10: -A INPUT -p tcp -m conntrack --ctstate NEW -m tcp "
        '--dport 55000 -m comment --comment "closed for maintenance" -j REJECT '
        "--reject-with tcp-reset",
        "tcp dports 56000-56099 from 10.0.0.12, 10.0.0.13, 192.168.100.0/24 are dropped by "
        "iptables-legacy table filter chain SLOW (reached from chain INPUT, priority 0) "
        "rule 2: -A SLOW -j DROP",
        "tcp dport 57000 from fd00::13 is dropped by ip6tables-legacy table filter chain "
        "INPUT (priority 0) rule 1: -A INPUT -s fd00::13/128 -p tcp -m tcp --dport 57000 "
        "-j DROP"]


def verdict_at(analysis: Analysis, port: int) -> set[str]:
    return {f.verdict for f in analysis.findings if f.ports[0] <= port <= f.ports[1]}


@pytest.mark.parametrize(("iif", "rendezvous", "range_hole"), [
    ("eth0", "accepted", "accepted"),
    ("eth1", "dropped", "dropped"),
    (None, "uncertain", "uncertain"),
])
def test_interface_matches_follow_the_input_interface(iif: str | None, rendezvous: str,
                                                      range_hole: str) -> None:
    """iifname "eth1" ... 29500 drop; iifname != "eth0" ... 50000-50099 drop; iif "lo" ...
    drop never applies to cluster traffic, whatever the interface."""
    analysis = analysed("interfaces", iif=iif)
    assert verdict_at(analysis, 29500) == {rendezvous}
    assert verdict_at(analysis, 50000) == verdict_at(analysis, 50099) == {range_hole}
    assert verdict_at(analysis, 49999) == verdict_at(analysis, 50100) == {"accepted"}
    assert all(f.rule is None or "iif \"lo\"" not in f.rule.rule.text
               for f in analysis.findings)


def test_an_ingress_chain_whose_device_nft_does_not_show_is_uncertain() -> None:
    (finding,) = [f for f in analysed("interfaces").findings if f.ports == (64000, 64099)]
    assert finding.verdict == "uncertain"
    assert finding.message().endswith(
        "depending on table netdev edge chain ingress (hook ingress, priority 0): device not "
        "shown by nft -j (the chain sees only packets that arrive on its device)")


@pytest.mark.parametrize(("iif", "verdict"), [("eth1", "dropped"), ("eth0", "accepted"),
                                              (None, "uncertain")])
def test_an_ingress_chain_that_names_its_device(iif: str | None, verdict: str) -> None:
    """libnftables-json(5) gives a netdev chain a "dev" property; nft 1.0.6 leaves it out
    of the capture, so it is put back here as the schema describes it."""
    doc = json.loads(capture("interfaces", "nft.json") or "")
    for item in doc["nftables"]:
        if item.get("chain", {}).get("hook") == "ingress":
            item["chain"]["dev"] = "eth1"
    analysis = analyse_nft(json.dumps(doc), CLUSTER, [(64000, 64099)], iif=iif)
    assert [f.verdict for f in analysis.findings] == [verdict]


# ----------------------------------------------------------------------- rendering and input


def _listed_rules(text: str) -> dict[tuple[str, str, str, int], str]:
    """Rules of ``nft -a list ruleset`` by (family, table, chain, handle)."""
    rules: dict[tuple[str, str, str, int], str] = {}
    table = ("", "")
    chain = ""
    for line in text.splitlines():
        if m := re.match(r"^table (\S+) (\S+) \{", line):
            table = (m[1], m[2])
        elif m := re.match(r"^\tchain (\S+) \{", line):
            chain = m[1]
        elif m := re.match(r"^\t\t(.+) # handle (\d+)$", line):
            rules[(*table, chain, int(m[2]))] = m[1]
    return rules


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_rules_read_as_nft_lists_them(scenario: str) -> None:
    """Every rule of every capture renders as nft -a list ruleset printed it (counters
    without their values), except iptables-nft's xt expressions, which nft -j does not
    decode and whose text the analysis takes from iptables-save."""
    listed = _listed_rules(capture(scenario, "nft.txt") or "")
    rules = [item["rule"] for item in json.loads(capture(scenario, "nft.json") or "")["nftables"]
             if "rule" in item]
    skipped = 0
    for rule in rules:
        if any("xt" in expr for expr in rule["expr"]):
            skipped += 1
            continue
        key = (rule["family"], rule["table"], rule["chain"], rule["handle"])
        want = re.sub(r"counter packets \d+ bytes \d+", "counter", listed[key])
        assert rule_text(rule["expr"], rule["family"]) == want
    assert len(listed) == len(rules)
    assert skipped == {"iptables_nft": 3, "raw_iptables_nft": 4}.get(scenario, 0)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_whole_range_verdicts_agree_with_single_port_analyses(scenario: str) -> None:
    """At every interval edge, each source analysed alone on one port gets the verdict
    the whole-range analysis gave it there."""
    whole = analysed(scenario, sources=CLUSTER if scenario != "iptables_legacy" else V4)
    for finding in whole.findings:
        for port in sorted({finding.ports[0], finding.ports[1]}):
            for source in finding.sources:
                alone = source.split(" (of ")[0]
                single = analyse(rulesets(scenario), [alone], [(port, port)], iif="eth0")
                assert [(f.verdict, f.rule) for f in single.findings] == [
                    (finding.verdict, finding.rule)], (scenario, source, port)


def test_a_source_network_is_split_only_where_rules_split_it() -> None:
    nft_json = capture("sets", "nft.json") or ""
    closed = [(f.verdict, f.sources, str(f.rule)) for f in
              analyse_nft(nft_json, ["10.0.0.0/24"], [(50000, 50099)]).findings]
    of = " (of 10.0.0.0/24)"
    assert closed == [
        ("dropped", (f"10.0.0.0-10.0.0.10{of}", f"10.0.0.14-10.0.0.199{of}",
                     f"10.0.0.251-10.0.0.255{of}"),
         "table inet gpufleet chain input (priority 0) handle 16: drop"),
        ("dropped", (f"10.0.0.13{of}", f"10.0.0.200-10.0.0.250{of}"),
         "table inet sets chain input (priority -10) handle 5: ip saddr @blocked_src "
         "tcp dport @closed drop"),
        ("accepted", (f"10.0.0.11-10.0.0.12{of}",), "None")]
    rendezvous = [(f.verdict, f.sources) for f in
                  analyse_nft(nft_json, ["10.0.0.0/24"], [(29500, 29500)]).findings]
    assert rendezvous == [
        ("dropped", (f"10.0.0.0-10.0.0.10{of}", f"10.0.0.14-10.0.0.255{of}")),
        ("accepted", (f"10.0.0.11-10.0.0.13{of}",))]


def test_malformed_nft_json_names_the_place() -> None:
    with pytest.raises(ParseError, match=r"nft -j list ruleset: not JSON \(line 1 column 15"):
        parse_nft('{"nftables": [')
    with pytest.raises(ParseError, match=r'no "nftables" list'):
        parse_nft("[]")
    broken = (capture("sets", "nft.json") or "").replace('"@closed"', '"@missing"')
    with pytest.raises(ParseError, match=r"table inet sets refers to set @missing"):
        parse_nft(broken)


def test_malformed_iptables_save_names_the_line() -> None:
    text = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 29x -j DROP\nCOMMIT\n"
    with pytest.raises(ParseError, match=r"iptables-save line 3: port '29x' is not a number"):
        parse_iptables(text)
    with pytest.raises(ParseError, match=r"ip6tables-save line 2: rule for chain FOO, which "
                                         "the table does not declare"):
        parse_iptables("*filter\n-A FOO -j DROP\nCOMMIT\n", "ipv6")
    with pytest.raises(ParseError, match=r"iptables-save: table filter has no COMMIT line"):
        parse_iptables("*filter\n:INPUT ACCEPT [0:0]\n")


@pytest.mark.parametrize(("sources", "ports", "message"), [
    (["gpu01"], PORTS, "source 'gpu01' is not an IP address or network"),
    (["10.0.0.1"], [(0, 10)], "port range 0-10 is not within 1-65535"),
    (["10.0.0.1"], [(20, 10)], "port range 20-10 is not within 1-65535"),
])
def test_bad_sources_and_ports_are_one_line_errors(sources: list[str],
                                                   ports: list[tuple[int, int]],
                                                   message: str) -> None:
    with pytest.raises(GpufleetError, match=re.escape(f"firewall analysis: {message}")):
        analyse_nft(capture("gpufleet", "nft.json") or "", sources, ports)
