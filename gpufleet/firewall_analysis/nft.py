"""``nft -j list ruleset`` (libnftables JSON schema 1) -> the firewall model.

Every rule is compiled for one kind of packet: the first packet (SYN) of a new TCP
connection from a cluster member to a local port. What that packet is known to carry
(``meta l4proto tcp``, ``fib daddr type local``, no NAT, a route back to its source) is
decided here; ports, source addresses, the family, the input interface and conntrack's
view (``ct state``, which depends on where the chain runs, and ``notrack``) are left to
the evaluator. Anything else becomes ``Unsure`` (a match) or ``Unknown`` (a statement),
never a silent pass.

Tables made by iptables-nft hold ``xt`` expressions that nft cannot decode. When the
matching ``iptables-save`` output is given, such a table's rules are taken from it
(matched to the nft handles by position); without it, the ``xt`` parts are not
understood.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.firewall_analysis.iptables import parse_save
from gpufleet.firewall_analysis.model import (
    CONTINUE,
    CT_STATES,
    FAMILIES,
    HOOK_ORDER,
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
    Pairs,
    Ports,
    Rule,
    RuleRef,
    Ruleset,
    Table,
    Tracked,
    Unknown,
    Unsure,
    Verdict,
    VerdictMap,
    address_span,
    check_jumps,
)
from gpufleet.firewall_analysis.nft_text import match_text, rule_text, statement_text

WHAT = "nft -j list ruleset"

TABLE_FAMILIES: dict[str, tuple[Family, ...]] = {
    "inet": FAMILIES, "ip": ("ipv4",), "ip6": ("ipv6",), "netdev": FAMILIES}
"""Table families whose base chains see IP packets to local ports, and which packets."""

_OTHER_PROTOCOLS = frozenset({"udp", "udplite", "sctp", "dccp", "icmp", "icmpv6", "igmp",
                              "esp", "ah", "comp", "arp", "gre", "vxlan", "geneve"})
_ETHERTYPES: dict[Any, Family] = {"ip": "ipv4", "ip6": "ipv6", 2048: "ipv4", 34525: "ipv6"}
_NFPROTOS: dict[Any, Family] = {"ipv4": "ipv4", "ipv6": "ipv6", 2: "ipv4", 10: "ipv6"}
_FLAG_BITS = {"fin": 1, "syn": 2, "rst": 4, "psh": 8, "ack": 16, "urg": 32, "ece": 64,
              "cwr": 128}
_SYNS = (2, 2 | 64 | 128)
"""A SYN as sent without and with ECN negotiation: flag tests must agree on both."""
_TCP_FLAGS = {"payload": {"protocol": "tcp", "field": "flags"}}
_SADDR = {"ip": {"payload": {"protocol": "ip", "field": "saddr"}},
          "ip6": {"payload": {"protocol": "ip6", "field": "saddr"}}}
_DPORTS = ({"payload": {"protocol": "tcp", "field": "dport"}},
           {"payload": {"protocol": "th", "field": "dport"}})
_VERDICTS = frozenset({"accept", "drop", "continue", "return", "reject"})
_NO_VERDICT = frozenset({"counter", "log", "mangle", "dup", "ct helper",
                         "ct timeout", "ct expectation", "secmark"})
_LIMITS = {"limit": "rate limited", "quota": "quota", "ct count": "connection limit",
           "meter": "rate limited"}
_REWRITES = frozenset({"dnat", "snat", "masquerade", "redirect", "tproxy", "synproxy", "fwd",
                       "queue"})


def parse_nft(ruleset_json: str, iptables_save: str | None = None,
              ip6tables_save: str | None = None) -> Ruleset:
    """The ruleset of ``nft -j list ruleset``; the save texts decode iptables-nft tables."""
    try:
        doc = json.loads(ruleset_json)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{WHAT}: not JSON (line {exc.lineno} column {exc.colno}: "
                         f"{exc.msg})") from None
    except RecursionError:
        raise ParseError(f"{WHAT}: nested too deep to be a ruleset") from None
    items = doc.get("nftables") if isinstance(doc, dict) else None
    if not isinstance(items, list):
        raise ParseError(f"{WHAT}: no \"nftables\" list at the top level")
    saves = {"ip": iptables_save, "ip6": ip6tables_save}
    tables: list[Table] = []
    notes: list[str] = []
    for (family, name), entry in _collect(items).items():
        label = f"table {family} {name}"
        if family not in TABLE_FAMILIES:
            notes.append(f"{label} is not on the input path of IP packets; not analysed")
        elif _has_xt(entry) and saves.get(family) is not None:
            tables.append(_from_iptables_save(label, family, name, entry, saves[family] or ""))
            notes.append(f"{label} was made by iptables-nft: its rules are read from "
                         f"{'iptables' if family == 'ip' else 'ip6tables'}-save")
        else:
            if _has_xt(entry):
                notes.append(f"{label} was made by iptables-nft: without its iptables-save "
                             "output, its xt matches and targets are not understood")
            tables.append(_Compiler(family, label, entry["sets"]).table(entry))
    ruleset = Ruleset(tuple(tables), FAMILIES, tuple(notes))
    check_jumps(ruleset, WHAT)
    return ruleset


def _collect(items: list[Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Chains, sets and rules of each (family, table), in the order nft lists them."""
    tables: dict[tuple[str, str], dict[str, Any]] = {}
    for index, item in enumerate(items):
        if not isinstance(item, dict) or len(item) != 1:
            raise ParseError(f"{WHAT}: item {index} is not an object with one key")
        (kind, body), = item.items()
        if kind == "metainfo":
            continue
        if not isinstance(body, dict) or "family" not in body:
            raise ParseError(f"{WHAT}: item {index} ({kind}) has no family")
        key = (str(body["family"]), str(body.get("table", body.get("name"))))
        entry = tables.setdefault(key, {"chains": {}, "sets": {}, "rules": {}})
        if kind == "chain":
            entry["chains"][str(body["name"])] = body
            entry["rules"].setdefault(str(body["name"]), [])
        elif kind in ("set", "map"):
            entry["sets"][str(body["name"])] = body
        elif kind == "rule":
            entry["rules"].setdefault(str(body.get("chain")), []).append(body)
    return tables


def _has_xt(entry: dict[str, Any]) -> bool:
    return any("xt" in expr for rules in entry["rules"].values() for rule in rules
               for expr in rule.get("expr", []) if isinstance(expr, dict))


def _hook(body: dict[str, Any], family: str) -> Hook | None:
    """The hook of a base chain on the input path; None for other chains."""
    hook = body.get("hook")
    if hook not in HOOK_ORDER or (family == "netdev" and hook != "ingress"):
        return None
    where = f"{WHAT}: chain {family} {body.get('table')} {body.get('name')}"
    policy = body.get("policy", "accept")
    if policy not in ("accept", "drop"):
        raise ParseError(f"{where} has policy {policy!r}")
    priority = body.get("prio", 0)
    if not isinstance(priority, int):
        raise ParseError(f"{where} has priority {priority!r}")
    if hook != "ingress":
        return Hook(str(hook), priority, policy)
    dev = body.get("dev", body.get("devs"))
    devices = (dev,) if isinstance(dev, str) else tuple(str(d) for d in dev or ())
    return Hook("ingress", priority, policy, devices, device_known=dev is not None)


def _from_iptables_save(label: str, family: str, name: str, entry: dict[str, Any],
                        save: str) -> Table:
    """The table's chains as iptables-save shows them, with nft's hooks and handles."""
    fam: Family = "ipv4" if family == "ip" else "ipv6"
    tool = "iptables-save" if family == "ip" else "ip6tables-save"
    saved = {t.name: t for t in parse_save(save, fam, tool)}
    if name not in saved:
        raise ParseError(f"{tool}: has no table {name}, but the nft ruleset has {label} "
                         "made by iptables-nft; capture both at the same time")
    chains: dict[str, Chain] = {}
    for chain_name, body in entry["chains"].items():
        rules = entry["rules"].get(chain_name, [])
        saved_chain = saved[name].chains.get(chain_name)
        if saved_chain is None or len(saved_chain.rules) != len(rules):
            have = "no such chain" if saved_chain is None else f"{len(saved_chain.rules)} rules"
            raise ParseError(f"{tool}: table {name} chain {chain_name} does not match {label} "
                             f"of the nft ruleset ({len(rules)} rules there, {have} in "
                             f"{tool}); capture both at the same time")
        converted = tuple(
            replace(rule, ref=replace(rule.ref, table=label, handle=_handle(nft_rule),
                                      position=None))
            for rule, nft_rule in zip(saved_chain.rules, rules, strict=True))
        chains[chain_name] = Chain(chain_name, converted, _hook(body, family))
    return Table(label, TABLE_FAMILIES[family], chains)


def _handle(body: dict[str, Any]) -> int | None:
    handle = body.get("handle")
    return handle if isinstance(handle, int) else None


def _unwrap(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"elem"} and isinstance(value["elem"], dict):
        return value["elem"].get("val")
    return value


class _Unsupported(Exception):
    """A match this module cannot turn into conditions; it becomes Unsure."""


def _static(holds: bool | None, text: str) -> list[Cond]:
    """The conditions of a match whose outcome is known for the packet (None: not known)."""
    if holds is None:
        return [Unsure(f"depends on the TCP flags of the SYN: {text}")]
    return [] if holds else [Never(text)]


class _Compiler:
    """Compiles the chains and rules of one table."""

    def __init__(self, family: str, label: str, sets: dict[str, dict[str, Any]]) -> None:
        self.family = family
        self.label = label
        self.sets = sets
        self.selectors: dict[str, Callable[[Any, str, Any, str], list[Cond]]] = {
            "payload": self._payload, "meta": self._meta, "ct": self._ct, "fib": self._fib,
            "concat": self._concat, "&": self._masked}

    def table(self, entry: dict[str, Any]) -> Table:
        chains = {}
        for name, body in entry["chains"].items():
            rules = tuple(self.rule(name, r) for r in entry["rules"].get(name, []))
            chains[name] = Chain(name, rules, _hook(body, self.family))
        return Table(self.label, TABLE_FAMILIES[self.family], chains)

    def rule(self, chain: str, body: dict[str, Any]) -> Rule:
        exprs = body.get("expr", [])
        if not isinstance(exprs, list):
            raise ParseError(f"{WHAT}: {self.label} chain {chain} handle {body.get('handle')} "
                             "has no expression list")
        ref = RuleRef(self.label, chain, rule_text(exprs, self.family), handle=_handle(body))
        conds: list[Cond] = []
        action: Action = CONTINUE
        notrack_after: int | None = None
        for expr in exprs:
            text = statement_text(expr, self.family)
            if not isinstance(expr, dict) or len(expr) != 1:
                action = Unknown(f"not understood: {text}")
                continue
            (kind, value), = expr.items()
            if kind == "notrack":
                notrack_after = len(conds) if notrack_after is None else notrack_after
                continue
            if kind == "match" and isinstance(value, dict):
                found = self.match(value.get("left"), str(value.get("op", "==")),
                                   value.get("right"), match_text(value))
                if notrack_after is not None:  # conntrack's view changed within the rule
                    found = [Unsure(f"conntrack tested after notrack in one rule: {text}")
                             if isinstance(c, CtState | Tracked) else c for c in found]
                conds += found
                continue
            cond, step = self.statement(kind, value, text)
            conds += cond
            if step is not None and not isinstance(action, Unknown):
                action = step
        return Rule(ref, tuple(conds), action, notrack_after)

    def statement(self, kind: str, value: Any, text: str) -> tuple[list[Cond], Action | None]:
        """A statement's conditions (limits) and its action (None: no verdict)."""
        if kind in _NO_VERDICT:
            return [], None
        if kind in _LIMITS:
            return [Unsure(f"{_LIMITS[kind]}: {text}")], None
        if kind == "set":
            limited = "limit" in json.dumps(value) or "ct count" in json.dumps(value)
            return ([Unsure(f"rate limited: {text}")] if limited else []), None
        if kind == "xt":
            reason = (f"not understood: {text} (made by iptables-nft; its iptables-save "
                      "output decodes it)")
            is_match = isinstance(value, dict) and value.get("type") == "match"
            return ([Unsure(reason)], None) if is_match else ([], Unknown(reason))
        return [], self._action(kind, value, text)

    def _action(self, kind: str, value: Any, text: str) -> Action:
        if kind == "vmap" and isinstance(value, dict):
            return self._vmap(value.get("key"), value.get("data"), text)
        if kind in _REWRITES:
            return Unknown(f"the packet is queued or rewritten: {text}")
        return self._verdict(kind, value, text)

    def _verdict(self, kind: str, body: Any, text: str) -> Verdict | Jump | Unknown:
        if kind in _VERDICTS:
            return Verdict(kind)  # type: ignore[arg-type]
        if kind in ("jump", "goto") and isinstance(body, dict):
            return Jump(str(body.get("target")), goto=kind == "goto")
        return Unknown(f"not understood: {text}")

    def _vmap(self, key: Any, data: Any, text: str) -> Action:
        entries = None
        if isinstance(data, str) and data.startswith("@"):
            named = self._named(data)
            entries = named.get("elem", []) if named.get("map") == "verdict" else None
        elif isinstance(data, dict) and isinstance(data.get("set"), list):
            entries = data["set"]
        if entries is None:
            return Unknown(f"not understood: {text}")
        compiled: list[tuple[tuple[Cond, ...], Verdict | Jump | Unknown]] = []
        for entry in entries:
            if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[1], dict):
                return Unknown(f"not understood: {text}")
            (verdict, body), = entry[1].items()
            conds = self.match(key, "==", entry[0], text)
            compiled.append((tuple(conds), self._verdict(verdict, body, text)))
        return VerdictMap(tuple(compiled))

    def _named(self, ref: str) -> dict[str, Any]:
        found = self.sets.get(ref[1:])
        if found is None:
            raise ParseError(f"{WHAT}: {self.label} refers to set {ref}, which it does not have")
        return found

    def _elements(self, value: Any) -> list[Any]:
        """A right-hand side as a flat list of elements (values, ranges, prefixes)."""
        value = _unwrap(value)
        if isinstance(value, str) and value.startswith("@"):
            value = self._named(value).get("elem", [])
        elif isinstance(value, dict) and "set" in value:
            value = value["set"]
        return [_unwrap(v) for v in (value if isinstance(value, list) else [value])]

    def match(self, left: Any, op: str, right: Any, text: str) -> list[Cond]:
        """The conditions of one ``match``; [] when it always holds for the packet."""
        selector = self.selectors.get(next(iter(left)), None) if (
            isinstance(left, dict) and len(left) == 1) else None
        if op in ("==", "!=", "in") and selector is not None:
            try:
                return selector(next(iter(left.values())), op, right, text)
            except _Unsupported:
                pass
        return [Unsure(f"not understood: {text}")]

    def _payload(self, body: Any, op: str, right: Any, text: str) -> list[Cond]:
        if not isinstance(body, dict) or "protocol" not in body:
            raise _Unsupported
        proto, field, negate = str(body["protocol"]), str(body.get("field")), op == "!="
        if proto in ("tcp", "th"):
            return self._tcp(proto, field, op, right, text)
        if proto in _OTHER_PROTOCOLS:
            return [Never(f"not TCP: {text}")]
        if proto not in ("ip", "ip6"):
            raise _Unsupported
        family: Family = "ipv4" if proto == "ip" else "ipv6"
        return [OnlyFamily(family), *self._ip(family, field, negate, right, text)]

    def _tcp(self, proto: str, field: str, op: str, right: Any, text: str) -> list[Cond]:
        if field == "dport":
            return [Ports(self._ports(right), op == "!=")]
        if field == "sport":
            return [Unsure(f"depends on the source port: {text}")]
        if proto == "tcp" and field == "flags":
            return _static(self._tcp_flags(right, None, op), text)
        raise _Unsupported

    def _ip(self, family: Family, field: str, negate: bool, right: Any,
            text: str) -> list[Cond]:
        if field == "saddr":
            return [Addrs(family, self._addrs(right, family), negate)]
        if field == "daddr":
            lo, hi = LOOPBACK[family]
            if Intervals(((lo, hi),)).within(*_hull(self._addrs(right, family))):
                return [] if negate else [Never(f"loopback: {text}")]
            return [Unsure(f"depends on the destination address: {text}")]
        if (family, field) in (("ipv4", "protocol"), ("ipv6", "nexthdr")):
            return _static(self._is_tcp(right) != negate, text)
        return [Unsure(f"not understood: {text}")]

    def _meta(self, body: Any, op: str, right: Any, text: str) -> list[Cond]:
        key, negate = body.get("key") if isinstance(body, dict) else None, op == "!="
        if key == "l4proto":
            return _static(self._is_tcp(right) != negate, text)
        if key in ("nfproto", "protocol"):
            table = _NFPROTOS if key == "nfproto" else _ETHERTYPES
            families = {table[v] for v in self._elements(right) if v in table}
            return _family_conds([f for f in FAMILIES if (f in families) != negate], text)
        if key in ("iifname", "iif"):
            names = self._elements(right)
            if not all(isinstance(name, str) for name in names):
                raise _Unsupported
            return [Iface(tuple(names), negate, text)]
        if key == "pkttype":
            return _static(("host" in self._elements(right)) != negate, text)
        raise _Unsupported

    def _ct(self, body: Any, op: str, right: Any, text: str) -> list[Cond]:
        if not isinstance(body, dict) or body.get("dir"):
            raise _Unsupported
        key, values, negate = body.get("key"), self._elements(right), op == "!="
        if key == "state" and isinstance(right, dict) and isinstance(right.get("|"), list):
            # ``ct state != established,related`` without braces: one value, the OR of the
            # bits, which no packet's single state equals ("in": any of them)
            bits = right["|"]
            if not all(isinstance(v, str) and v in CT_STATES for v in bits):
                raise _Unsupported
            if op == "in" or len(bits) == 1:
                return [CtState(frozenset(bits), negate, text)]
            return [] if negate else [Never(f"no state is all of them: {text}")]
        if key == "state" and all(isinstance(v, str) and v in CT_STATES for v in values):
            return [CtState(frozenset(values), negate, text)]
        # Any other key of a packet without a conntrack entry ends the rule (NFT_BREAK),
        # whatever the operator.
        if key == "status" and set(values) <= {"expected", "seen-reply", "assured", "snat",
                                               "dnat", "dying"}:
            return [Tracked(negate, False, text)]
        if key == "direction":
            return [Tracked(("original" in values) != negate, False, text)]
        raise _Unsupported

    def _fib(self, body: Any, op: str, right: Any, text: str) -> list[Cond]:
        """Reverse-path checks pass (a route back to a cluster member exists) and the
        destination is a local address."""
        if not isinstance(body, dict):
            raise _Unsupported
        flags, result, negate = set(body.get("flags", [])), body.get("result"), op == "!="
        if result in ("oif", "oifname") and "saddr" in flags and isinstance(right, bool):
            return _static(right != negate, text)
        if result == "type" and "daddr" in flags and flags <= {"daddr", "iif"}:
            return _static(("local" in self._elements(right)) != negate, text)
        raise _Unsupported

    def _masked(self, body: Any, op: str, right: Any, text: str) -> list[Cond]:
        """``tcp flags & (syn | ack) == syn``."""
        if not isinstance(body, list) or len(body) != 2 or body[0] != _TCP_FLAGS:
            raise _Unsupported
        return _static(self._tcp_flags(right, body[1], op), text)

    def _concat(self, parts: Any, op: str, right: Any, text: str) -> list[Cond]:
        """``ip saddr . tcp dport`` (either order) against a set of pairs."""
        if not isinstance(parts, list) or len(parts) != 2:
            raise _Unsupported
        proto = next((p for p, sel in _SADDR.items() if sel in parts), None)
        port_at = next((i for i, part in enumerate(parts) if part in _DPORTS), None)
        if proto is None or port_at is None:
            raise _Unsupported
        family: Family = "ipv4" if proto == "ip" else "ipv6"
        by_ports: dict[Intervals, list[tuple[int, int]]] = {}
        for element in self._elements(right):
            pair = element.get("concat") if isinstance(element, dict) else None
            if not isinstance(pair, list) or len(pair) != 2:
                raise _Unsupported
            ports = self._ports(pair[port_at])
            by_ports.setdefault(ports, []).append(_address(pair[1 - port_at], family))
        pairs = tuple((Intervals.of(spans), ports) for ports, spans in by_ports.items())
        return [OnlyFamily(family), Pairs(family, pairs, op == "!=")]

    def _ports(self, right: Any) -> Intervals:
        spans = []
        for element in self._elements(right):
            bounds = element.get("range") if isinstance(element, dict) else [element, element]
            if not (isinstance(bounds, list) and len(bounds) == 2
                    and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)):
                raise _Unsupported
            spans.append((bounds[0], bounds[1]))
        return Intervals.of(spans)

    def _addrs(self, right: Any, family: Family) -> Intervals:
        try:
            return Intervals.of(_address(element, family) for element in self._elements(right))
        except ParseError as exc:
            raise ParseError(f"{WHAT}: {self.label}: {exc}") from None

    def _is_tcp(self, right: Any) -> bool:
        for element in self._elements(right):
            bounds = element.get("range") if isinstance(element, dict) else [element, element]
            if bounds in (["tcp", "tcp"], [6, 6]) or (
                    isinstance(bounds, list) and all(isinstance(b, int) for b in bounds)
                    and bounds[0] <= 6 <= bounds[-1]):
                return True
        return False

    def _tcp_flags(self, right: Any, mask: Any, op: str) -> bool | None:
        """Whether a ``tcp flags`` test holds for a SYN (None: it depends on ECN flags).

        ``in`` (``tcp flags syn``) tests for any of the flags; ``==``, ``!=`` compare.
        """
        results = set()
        for syn in _SYNS:
            packet = syn & _flag_bits(mask) if mask is not None else syn
            if op == "in":
                hit = bool(packet & _flag_bits(right))
            else:
                values = [right] if isinstance(right, list) else self._elements(right)
                hit = packet in {_flag_bits(v) for v in values}
            results.add(hit != (op == "!="))
        return results.pop() if len(results) == 1 else None


def _family_conds(families: list[Family], text: str) -> list[Cond]:
    if len(families) == len(FAMILIES):
        return []
    return [OnlyFamily(families[0])] if families else [Never(f"no IP family: {text}")]


def _hull(values: Intervals) -> tuple[int, int]:
    if not values.spans:
        raise _Unsupported
    return values.spans[0][0], values.spans[-1][1]


def _address(element: Any, family: Family) -> tuple[int, int]:
    if isinstance(element, str):
        return address_span(element, family)[1:]
    if isinstance(element, dict) and isinstance(element.get("prefix"), dict):
        prefix = element["prefix"]
        return address_span(f"{prefix.get('addr')}/{prefix.get('len')}", family)[1:]
    if isinstance(element, dict) and isinstance(element.get("range"), list):
        first, last = element["range"]
        return address_span(str(first), family)[1], address_span(str(last), family)[2]
    raise _Unsupported


def _flag_bits(value: Any) -> int:
    value = _unwrap(value)
    if isinstance(value, str) and value in _FLAG_BITS:
        return _FLAG_BITS[value]
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and isinstance(value.get("|"), list):
        value = value["|"]
    if isinstance(value, list):
        return sum(_flag_bits(v) for v in value)
    raise _Unsupported
