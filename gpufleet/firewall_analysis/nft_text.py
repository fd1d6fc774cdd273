"""Rules of ``nft -j list ruleset`` rendered as ``nft list ruleset`` prints them.

Findings quote the rule that decides. The JSON holds everything the text shows, so the
text is rebuilt from it; expressions this module does not know are shown as their JSON
in angle brackets, so nothing is hidden. Counters are shown without their values
(``counter``, not ``counter packets 12 bytes 720``), so a finding reads the same from
one run to the next.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_UNQUALIFIED_META = frozenset({"iif", "oif", "iifname", "oifname", "iifgroup", "oifgroup"})
_QUOTED_KEYS = frozenset({"iifname", "oifname", "iif", "oif", "hour", "day", "time"})
_HEX_KEYS = frozenset({"mark"})
_OPS = {"==": "", "in": "", "!=": "!= ", "<": "< ", ">": "> ", "<=": "<= ", ">=": ">= "}
_PLAIN_VERDICTS = frozenset({"accept", "drop", "continue", "return"})
_DEFAULT_REJECT = {"inet": "icmpx", "netdev": "icmpx", "bridge": "icmpx", "ip": "icmp",
                   "ip6": "icmpv6"}
"""The reject type nft leaves out of the text, by table family (with port-unreachable)."""


def _fallback(expr: Any) -> str:
    return "<" + json.dumps(expr, separators=(",", ":"), sort_keys=True) + ">"


def _payload_name(body: dict[str, Any]) -> str:
    if "protocol" in body:
        return f"{body['protocol']} {body['field']}"
    return f"@{body['base']},{body['offset']},{body['len']}"


def _meta_name(body: dict[str, Any]) -> str:
    key = str(body["key"])
    return key if key in _UNQUALIFIED_META else f"meta {key}"


def _ct_name(body: dict[str, Any]) -> str:
    return " ".join(["ct", *([str(body["dir"])] if body.get("dir") else []), str(body["key"])])


def _fib_name(body: dict[str, Any]) -> str:
    return f"fib {' . '.join(body['flags'])} {body['result']}"


_SELECTORS: dict[str, Callable[[Any], str]] = {
    "payload": _payload_name,
    "meta": _meta_name,
    "ct": _ct_name,
    "fib": _fib_name,
    "concat": lambda parts: " . ".join(key_name(part) for part in parts),
}


def key_name(left: Any) -> str:
    """The selector a match tests: ``tcp dport``, ``meta l4proto``, ``ct state`` ..."""
    if isinstance(left, dict) and len(left) == 1:
        (kind, body), = left.items()
        if kind in _SELECTORS:
            try:
                return _SELECTORS[kind](body)
            except (KeyError, TypeError):
                pass
    return _fallback(left)


def _selector_key(left: Any) -> str:
    """The last word of a selector (``dport``, ``iifname``, ``mark``), for value styling."""
    if isinstance(left, dict) and len(left) == 1:
        body = next(iter(left.values()))
        if isinstance(body, dict):
            return str(body.get("key", body.get("field", "")))
    return ""


def _is_verdict(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in (
        _PLAIN_VERDICTS | {"jump", "goto"})


_COMPOUND: dict[str, Callable[[Any, str], str]] = {
    "prefix": lambda body, key: f"{body['addr']}/{body['len']}",
    "range": lambda body, key: f"{value_text(body[0], key)}-{value_text(body[1], key)}",
    "set": lambda body, key: "{ " + ", ".join(
        value_text(v, key) for v in (body if isinstance(body, list) else [body])) + " }",
    "elem": lambda body, key: value_text(body["val"], key),
    "concat": lambda body, key: " . ".join(value_text(v, key) for v in body),
    "|": lambda body, key: " | ".join(value_text(v, key) for v in body),
}


def value_text(value: Any, key: str = "") -> str:
    """A right-hand side: a number, address, prefix, range, set, set reference or flags."""
    if isinstance(value, bool):
        return "exists" if value else "missing"
    if isinstance(value, int):
        return f"0x{value:08x}" if key in _HEX_KEYS else str(value)
    if isinstance(value, str):
        return json.dumps(value) if key in _QUOTED_KEYS and value[:1] != "@" else value
    if isinstance(value, list):
        if len(value) == 2 and _is_verdict(value[1]):
            return f"{value_text(value[0], key)} : {statement_text(value[1])}"
        return ",".join(value_text(v, key) for v in value)
    return _compound_text(value, key)


def _compound_text(value: Any, key: str) -> str:
    if isinstance(value, dict) and len(value) == 1 and next(iter(value)) in _COMPOUND:
        (kind, body), = value.items()
        try:
            return _COMPOUND[kind](body, key)
        except (KeyError, TypeError, IndexError):
            pass
    return _fallback(value)


def match_text(match: dict[str, Any]) -> str:
    left, op, right = match.get("left"), match.get("op", "=="), match.get("right")
    if isinstance(left, dict) and isinstance(left.get("&"), list) and len(left["&"]) == 2:
        inner, mask = left["&"]
        key = _selector_key(inner)
        if key == "flags":
            return (f"{key_name(inner)} {_OPS.get(op, op + ' ')}{value_text(right, key)} / "
                    f"{value_text(mask, key)}")
        return (f"{key_name(inner)} & {value_text(mask, key)} {op if op != 'in' else '=='} "
                f"{value_text(right, key)}")
    key = _selector_key(left)
    if isinstance(right, bool):
        return f"{key_name(left)} {value_text(right == (op == '=='))}"
    return f"{key_name(left)} {_OPS.get(op, op + ' ')}{value_text(right, key)}"


def _log_text(body: dict[str, Any], family: str) -> str:
    words = ["log"]
    if "prefix" in body:
        words.append(f"prefix {json.dumps(body['prefix'])}")
    words += [f"{key} {body[key]}" for key in ("group", "snaplen", "queue-threshold", "level")
              if key in body]
    flags = body.get("flags")
    if flags:
        words.append("flags " + (",".join(flags) if isinstance(flags, list) else str(flags)))
    return " ".join(words)


def _limit_text(body: dict[str, Any], family: str) -> str:
    over = "over " if body.get("inv") else ""
    unit = body.get("rate_unit", "packets")
    rate = f"{body['rate']}/{body['per']}" if unit == "packets" else (
        f"{body['rate']} {unit}/{body['per']}")
    default = 5 if unit == "packets" else 0
    burst = body.get("burst", default)
    tail = ""
    if burst != default:
        tail = f" burst {burst} {'packets' if unit == 'packets' else body.get('burst_unit')}"
    return f"limit rate {over}{rate}{tail}"


def _reject_text(body: Any, family: str) -> str:
    if not isinstance(body, dict):
        return "reject"
    kind, code = body.get("type"), body.get("expr")
    if kind == "tcp reset":
        return "reject with tcp reset"
    if kind is None or (kind == _DEFAULT_REJECT.get(family)
                        and code in (None, "port-unreachable")):
        return "reject"
    return f"reject with {kind} {code}"


def _mangle_text(body: dict[str, Any], family: str) -> str:
    key = body["key"]
    return f"{key_name(key)} set {value_text(body['value'], _selector_key(key))}"


def _nat(kind: str) -> Callable[[Any, str], str]:
    def text(body: Any, family: str) -> str:
        """``dnat ip to 10.0.0.99:80``, ``redirect to :8080``, ``masquerade``."""
        body = body or {}
        words = [kind, *([str(body["family"])] if body.get("family") else [])]
        target = str(body.get("addr", "")) + (f":{body['port']}" if "port" in body else "")
        return " ".join([*words, *(["to", target] if target else [])])
    return text


_STATEMENTS: dict[str, Callable[[Any, str], str]] = {
    **{kind: _nat(kind) for kind in ("dnat", "snat", "redirect", "masquerade")},
    "match": lambda body, family: match_text(body),
    "jump": lambda body, family: f"jump {body['target']}",
    "goto": lambda body, family: f"goto {body['target']}",
    "counter": lambda body, family: (
        "counter" if isinstance(body, dict) else f"counter name {json.dumps(body)}"),
    "log": _log_text,
    "limit": _limit_text,
    "quota": lambda body, family: (
        f"quota {'over ' if body.get('inv') else ''}{body['val']} {body['val_unit']}"),
    "reject": _reject_text,
    "notrack": lambda body, family: "notrack",
    "mangle": _mangle_text,
    "vmap": lambda body, family: f"{key_name(body['key'])} vmap {value_text(body['data'])}",
    "xt": lambda body, family: f"xt {body['type']} {json.dumps(body['name'])}",
    "ct count": lambda body, family: (
        f"ct count {'over ' if body.get('inv') else ''}{body['val']}"),
    "set": lambda body, family: (
        f"{body['op']} {body['set']} {{ {value_text(body['elem'])} }}"),
}


def statement_text(stmt: Any, family: str = "inet") -> str:
    """One element of a rule's ``expr`` list (in a table of ``family``): a match, a
    statement or a verdict."""
    if isinstance(stmt, dict) and len(stmt) == 1:
        (kind, body), = stmt.items()
        if kind in _PLAIN_VERDICTS:
            return str(kind)
        if kind in _STATEMENTS:
            try:
                return _STATEMENTS[kind](body, family)
            except (KeyError, TypeError, AttributeError):
                pass
    return _fallback(stmt)


def rule_text(exprs: list[Any], family: str = "inet") -> str:
    return " ".join(statement_text(e, family) for e in exprs)
