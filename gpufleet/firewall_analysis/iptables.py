"""``iptables-save`` / ``ip6tables-save`` output -> the firewall model.

iptables-legacy and iptables-nft print the same format. Built-in chains on the input path
become base chains at the priorities the kernel gives their tables (raw -300, mangle
-150, nat -100 and 100, filter 0, security 50); user chains are reached by ``-j`` and
``-g``. Rules are compiled for the SYN of a new TCP connection, as in the nft parser:
``-m conntrack --ctstate`` and ``-m state --state`` are left to the evaluator (a raw table
rule runs before conntrack, where the state is INVALID), ``-j CT --notrack`` and
``-j NOTRACK`` untrack, ``-m limit`` may match.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from gpufleet.errors import ParseError
from gpufleet.firewall_analysis.model import (
    CONTINUE,
    CT_STATES,
    LOOPBACK,
    Action,
    Addrs,
    Chain,
    Cond,
    CtState,
    Family,
    Hook,
    Iface,
    Intervals,
    Jump,
    Never,
    OnlyFamily,
    Ports,
    Rule,
    RuleRef,
    Ruleset,
    Table,
    Tracked,
    Unknown,
    Unsure,
    Verdict,
    address_span,
    check_jumps,
)

BUILTIN_HOOKS: dict[tuple[str, str], tuple[str, int]] = {
    ("raw", "PREROUTING"): ("prerouting", -300),
    ("mangle", "PREROUTING"): ("prerouting", -150),
    ("nat", "PREROUTING"): ("prerouting", -100),
    ("mangle", "INPUT"): ("input", -150),
    ("filter", "INPUT"): ("input", 0),
    ("security", "INPUT"): ("input", 50),
    ("nat", "INPUT"): ("input", 100),
}
"""Built-in chains that a packet to a local port passes: (table, chain) -> (hook, priority)."""

_NO_VERDICT_TARGETS = frozenset({"LOG", "NFLOG", "ULOG", "MARK", "CONNMARK", "CT", "NOTRACK",
                                 "TRACE", "CLASSIFY", "DSCP", "TOS", "TCPMSS", "AUDIT",
                                 "SECMARK", "CONNSECMARK", "SET", "IDLETIMER", "LED"})
_REWRITE_TARGETS = frozenset({"NFQUEUE", "QUEUE", "DNAT", "SNAT", "REDIRECT", "MASQUERADE",
                              "NETMAP", "TPROXY", "SYNPROXY", "TEE"})
_OTHER_PROTOCOL_MODULES = frozenset({"udp", "udplite", "sctp", "dccp", "icmp", "icmp6",
                                     "esp", "ah", "gre"})
_FLAG_BITS = {"FIN": 1, "SYN": 2, "RST": 4, "PSH": 8, "ACK": 16, "URG": 32, "ECE": 64,
              "CWR": 128}
_SYNS = (2, 2 | 64 | 128)
"""A SYN without and with ECN negotiation: a flag test must agree on both."""
_TCP_PROTOCOLS = frozenset({"tcp", "6"})
_ANY_PROTOCOL = frozenset({"all", "0"})


@dataclass(frozen=True)
class SaveChain:
    name: str
    policy: str
    rules: tuple[Rule, ...]


@dataclass
class SaveTable:
    name: str
    chains: dict[str, SaveChain] = field(default_factory=dict)


def parse_iptables(text: str, family: Family = "ipv4", label: str | None = None) -> Ruleset:
    """The ruleset of one ``iptables-save`` (ipv4) or ``ip6tables-save`` (ipv6) output.

    ``label`` names the tool in findings (default ``iptables``/``ip6tables``), for example
    ``iptables-legacy``.
    """
    tool = label or ("iptables" if family == "ipv4" else "ip6tables")
    tables = []
    for saved in parse_save(text, family, f"{tool}-save"):
        table_label = f"{tool} table {saved.name}"
        chains = {}
        for chain in saved.chains.values():
            hook = None
            if (saved.name, chain.name) in BUILTIN_HOOKS:
                hook_name, priority = BUILTIN_HOOKS[(saved.name, chain.name)]
                policy: Literal["accept", "drop"] = (
                    "drop" if chain.policy == "DROP" else "accept")
                hook = Hook(hook_name, priority, policy)
            rules = tuple(replace(r, ref=RuleRef(table_label, r.ref.chain, r.ref.text,
                                                 position=r.ref.position))
                          for r in chain.rules)
            chains[chain.name] = Chain(chain.name, rules, hook)
        tables.append(Table(table_label, (family,), chains))
    ruleset = Ruleset(tuple(tables), (family,))
    check_jumps(ruleset, f"{tool}-save")
    return ruleset


def parse_save(text: str, family: Family, what: str) -> list[SaveTable]:
    """The tables of a save output, each chain with its policy and compiled rules."""
    reader = _SaveReader(family, what)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            reader.line(line, f"{what} line {number}")
    if reader.table is not None:
        raise ParseError(f"{what}: table {reader.table.name} has no COMMIT line")
    return reader.tables


class _SaveReader:
    """Reads save output line by line: ``*table``, ``:CHAIN POLICY``, ``-A``, ``COMMIT``."""

    def __init__(self, family: Family, what: str) -> None:
        self.family = family
        self.what = what
        self.tables: list[SaveTable] = []
        self.table: SaveTable | None = None
        self.policies: dict[str, str] = {}
        self.pending: list[tuple[str, str, list[str]]] = []

    def line(self, line: str, where: str) -> None:
        if line.startswith("*"):
            self.table = SaveTable(line[1:].strip())
            self.tables.append(self.table)
            self.policies, self.pending = {}, []
        elif self.table is None:
            raise ParseError(f"{where}: {line[:40]!r} comes before any *table line")
        elif line.startswith(":"):
            parts = line[1:].split()
            if len(parts) < 2:
                raise ParseError(f"{where}: chain line {line!r} has no policy")
            self.policies[parts[0]] = parts[1]
        elif line == "COMMIT":
            self._commit(self.table)
            self.table = None
        else:
            self._rule(line, where)

    def _rule(self, line: str, where: str) -> None:
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise ParseError(f"{where}: {exc}") from None
        if words and words[0].startswith("[") and words[0].endswith("]"):
            words, line = words[1:], line.split("]", 1)[1].strip()
        if len(words) < 2 or words[0] not in ("-A", "--append"):
            raise ParseError(f"{where}: expected -A CHAIN ..., got {line[:40]!r}")
        if words[1] not in self.policies:
            raise ParseError(f"{where}: rule for chain {words[1]}, which the table does not "
                             "declare")
        self.pending.append((where, line, words))

    def _commit(self, table: SaveTable) -> None:
        rules: dict[str, list[Rule]] = {name: [] for name in self.policies}
        for where, line, words in self.pending:
            chain = words[1]
            ref = RuleRef(table.name, chain, line, position=len(rules[chain]) + 1)
            compiler = _RuleCompiler(words[2:], self.family, set(self.policies), where)
            conds, action = compiler.compile()
            rules[chain].append(Rule(ref, tuple(conds), action, compiler.notrack_after))
        for name, policy in self.policies.items():
            table.chains[name] = SaveChain(name, policy, tuple(rules[name]))


class _RuleCompiler:
    """Walks the words of one ``-A`` line after the chain name."""

    def __init__(self, words: list[str], family: Family, chains: set[str], where: str) -> None:
        self.words = words
        self.i = 0
        self.family = family
        self.chains = chains
        self.where = where
        self.conds: list[Cond] = []
        self.module = ""
        self.notrack_after: int | None = None
        self.module_start = 0  # where the conditions of the current -m begin
        self.module_state = False  # the current -m conntrack tests --ctstate

    def next(self, option: str) -> str:
        if self.i >= len(self.words):
            raise ParseError(f"{self.where}: {option} needs a value")
        word = self.words[self.i]
        self.i += 1
        return word

    def compile(self) -> tuple[list[Cond], Action]:
        action: Action = CONTINUE
        while self.i < len(self.words):
            negate = self.words[self.i] == "!"
            self.i += negate
            option = self.next("!")
            if option in ("-j", "--jump"):
                action = self._target(self.next(option))
            elif option in ("-g", "--goto"):
                action = Jump(self.next(option), goto=True)
            elif option in ("-m", "--match"):
                self._end_module()
                self.module = self.next(option)
                self.module_start, self.module_state = len(self.conds), False
                if self.module in _OTHER_PROTOCOL_MODULES:
                    self.conds.append(Never(f"-m {self.module}"))
            elif option in ("-f", "--fragment"):
                self.static(negate, "a fragment")
            elif option in _BASIC:
                _BASIC[option](self, self.next(option), negate, option)
            elif (self.module, option) in _OPTIONS:
                _OPTIONS[(self.module, option)](self, option, negate)
            elif option.startswith("--"):
                self.unsure(option, self.values(), negate, "not understood")
            else:
                raise ParseError(f"{self.where}: option {option!r} is not understood")
        self._end_module()
        return self.conds, action

    def _end_module(self) -> None:
        """xt_conntrack with a state test matches a packet without a conntrack entry on the
        state alone: its other tests then hold."""
        if self.module == "conntrack" and self.module_state:
            self.conds[self.module_start:] = [
                Tracked(c.holds, True, c.text) if isinstance(c, Tracked) else c
                for c in self.conds[self.module_start:]]

    def values(self) -> list[str]:
        """The words of an option this module does not know, up to the next option."""
        values = []
        while self.i < len(self.words) and self.words[self.i][:1] != "-" and (
                self.words[self.i] != "!"):
            values.append(self.words[self.i])
            self.i += 1
        return values

    def unsure(self, option: str, values: list[str], negate: bool, why: str) -> None:
        words = ([f"-m {self.module}"] if self.module else []) + (["!"] if negate else [])
        self.conds.append(Unsure(f"{why}: {' '.join([*words, option, *values])}"))

    def static(self, holds: bool, why: str) -> None:
        if not holds:
            self.conds.append(Never(why))

    def addrs(self, value: str) -> Intervals:
        spans = []
        for part in value.split(","):
            try:
                spans.append(address_span(part, self.family)[1:])
            except ParseError as exc:
                raise ParseError(f"{self.where}: {exc}") from None
        return Intervals.of(spans)

    def _target(self, target: str) -> Action:
        text = " ".join(["-j", target, *self.words[self.i:]])
        self.i = len(self.words)
        if target in ("ACCEPT", "DROP", "RETURN"):
            return Verdict(target.lower())  # type: ignore[arg-type]
        if target == "REJECT":
            return Verdict("reject")
        if target in self.chains:
            return Jump(target)
        if target in _NO_VERDICT_TARGETS:
            if target == "NOTRACK" or (target == "CT" and "--notrack" in text.split()):
                self.notrack_after = len(self.conds)
            return CONTINUE
        if target in _REWRITE_TARGETS:
            return Unknown(f"the packet is queued or rewritten: {text}")
        return Unknown(f"not understood: {text}")


def _protocol(rc: _RuleCompiler, value: str, negate: bool, option: str) -> None:
    """``-p tcp`` also loads the tcp match, as iptables does for ``--dport`` after it."""
    name = value.lower()
    holds = name in _ANY_PROTOCOL or name in _TCP_PROTOCOLS
    rc.static(holds != negate, f"not TCP: {option} {value}")
    if name in _TCP_PROTOCOLS and not negate:
        rc.module = rc.module or "tcp"


def _source(rc: _RuleCompiler, value: str, negate: bool, option: str) -> None:
    try:
        values = rc.addrs(value)
    except ParseError:
        if "." not in value.rpartition("/")[2]:
            raise
        rc.conds += [OnlyFamily(rc.family),
                     Unsure(f"not understood: {option} {value} (a non-contiguous mask)")]
        return
    rc.conds += [OnlyFamily(rc.family), Addrs(rc.family, values, negate)]


def _destination(rc: _RuleCompiler, value: str, negate: bool, option: str) -> None:
    spans = rc.addrs(value).spans
    lo, hi = LOOPBACK[rc.family]
    if spans and Intervals(((lo, hi),)).within(spans[0][0], spans[-1][1]):
        rc.static(negate, f"loopback: {option} {value}")
    else:
        rc.conds.append(Unsure(f"depends on the destination address: "
                               f"{'! ' if negate else ''}{option} {value}"))


def _in_interface(rc: _RuleCompiler, value: str, negate: bool, option: str) -> None:
    name = value[:-1] + "*" if value.endswith("+") else value
    rc.conds.append(Iface((name,), negate, f"{'! ' if negate else ''}{option} {value}"))


def _out_interface(rc: _RuleCompiler, value: str, negate: bool, option: str) -> None:
    rc.conds.append(Unsure(f"not understood: {'! ' if negate else ''}{option} {value}"))


_BASIC: dict[str, Callable[[_RuleCompiler, str, bool, str], None]] = {
    "-p": _protocol, "--protocol": _protocol, "-s": _source, "--source": _source,
    "-d": _destination, "--destination": _destination, "-i": _in_interface,
    "--in-interface": _in_interface, "-o": _out_interface, "--out-interface": _out_interface}
"""Options before the first ``-m``, each with one value."""


def _dports(rc: _RuleCompiler, option: str, negate: bool) -> None:
    rc.conds.append(Ports(_ports(rc.next(option), rc.where), negate))


def _sports(rc: _RuleCompiler, option: str, negate: bool) -> None:
    rc.unsure(option, [rc.next(option)], negate, "depends on the source port")


def _syn(rc: _RuleCompiler, option: str, negate: bool) -> None:
    rc.static(not negate, "not a SYN")


def _tcp_flags(rc: _RuleCompiler, option: str, negate: bool) -> None:
    mask, comp = rc.next(option), rc.next(option)
    results = {((syn & _flags(mask)) == _flags(comp)) != negate for syn in _SYNS}
    if len(results) == 2:
        rc.conds.append(Unsure(f"depends on the TCP flags of the SYN: {option} {mask} {comp}"))
    else:
        rc.static(results.pop(), f"{option} {mask} {comp}")


def _ctstate(rc: _RuleCompiler, option: str, negate: bool) -> None:
    value = rc.next(option)
    # SNAT and DNAT are conntrack's flags for a NATed connection: a new one has neither
    states = {s.lower() for s in value.split(",")} - {"snat", "dnat"}
    text = f"-m {rc.module} {'! ' if negate else ''}{option} {value}"
    if not states <= CT_STATES:
        rc.unsure(option, [value], negate, "not understood")
        return
    rc.module_state = rc.module == "conntrack"
    rc.conds.append(CtState(frozenset(states), negate, text))


def _ctproto(rc: _RuleCompiler, option: str, negate: bool) -> None:
    value = rc.next(option)
    rc.conds.append(Tracked((value.lower() in _TCP_PROTOCOLS) != negate, False,
                            f"{'! ' if negate else ''}{option} {value}"))


def _ctdir(rc: _RuleCompiler, option: str, negate: bool) -> None:
    value = rc.next(option)
    rc.conds.append(Tracked((value.upper() == "ORIGINAL") != negate, False,
                            f"{'! ' if negate else ''}{option} {value}"))


def _ignore(rc: _RuleCompiler, option: str, negate: bool) -> None:
    rc.next(option)


def _limit(rc: _RuleCompiler, option: str, negate: bool) -> None:
    rc.unsure(option, [rc.next(option)], negate, "rate limited")


def _src_range(rc: _RuleCompiler, option: str, negate: bool) -> None:
    first, _, last = rc.next(option).partition("-")
    try:
        lo, hi = address_span(first, rc.family)[1], address_span(last, rc.family)[2]
    except ParseError as exc:
        raise ParseError(f"{rc.where}: {exc}") from None
    rc.conds += [OnlyFamily(rc.family), Addrs(rc.family, Intervals(((lo, hi),)), negate)]


def _dst_type(rc: _RuleCompiler, option: str, negate: bool) -> None:
    local = "LOCAL" in rc.next(option).upper().split(",")
    rc.static(local != negate, "not a local address")


def _match_set(rc: _RuleCompiler, option: str, negate: bool) -> None:
    name, flags = rc.next(option), rc.next(option)
    rc.unsure(option, [name, flags], negate,
              f"depends on ipset {name}, which iptables-save does not show")


_OPTIONS: dict[tuple[str, str], Callable[[_RuleCompiler, str, bool], None]] = {
    **{(m, o): _dports for m in ("tcp", "multiport")
       for o in ("--dport", "--destination-port", "--dports", "--destination-ports")},
    **{(m, o): _sports for m in ("tcp", "multiport")
       for o in ("--sport", "--source-port", "--sports", "--source-ports", "--ports")},
    ("tcp", "--syn"): _syn,
    ("tcp", "--tcp-flags"): _tcp_flags,
    ("conntrack", "--ctstate"): _ctstate,
    ("state", "--state"): _ctstate,
    ("conntrack", "--ctproto"): _ctproto,
    ("conntrack", "--ctdir"): _ctdir,
    ("comment", "--comment"): _ignore,
    ("limit", "--limit"): _limit,
    ("limit", "--limit-burst"): _limit,
    ("iprange", "--src-range"): _src_range,
    ("addrtype", "--dst-type"): _dst_type,
    ("set", "--match-set"): _match_set,
}
"""Module options the analysis interprets; any other option makes the rule uncertain."""


def _ports(text: str, where: str) -> Intervals:
    """``29500``, ``49152:65535``, ``1024:``, ``1,2,10:20`` (ports of iptables)."""
    spans = []
    for part in text.split(","):
        first, sep, last = part.partition(":")
        try:
            lo = int(first) if first else 0
            hi = (int(last) if last else 65535) if sep else lo
        except ValueError:
            raise ParseError(f"{where}: port {part!r} is not a number or range") from None
        if not 0 <= lo <= hi <= 65535:
            raise ParseError(f"{where}: port range {part!r} is not within 0-65535")
        spans.append((lo, hi))
    return Intervals.of(spans)


def _flags(text: str) -> int:
    names = text.upper()
    if names in ("ALL", "NONE"):
        return 255 if names == "ALL" else 0
    return sum(_FLAG_BITS.get(name, 0) for name in names.split(","))
