"""Ansible host patterns (``--limit``), evaluated as ``ansible --list-hosts`` evaluates them.

- Terms are separated by commas; without a comma, by colons outside brackets (a host
  name, a ``name:port`` or an IPv6 address stays one term).
- Plain terms are joined in the order given, then every ``&`` term intersects and every
  ``!`` term subtracts; ``!x`` alone means all hosts but x.
- A term matches group names (a group adds its hosts in Ansible's group order) and, when it
  is a glob (``*``, ``?``, ``[``), a regular expression (``~``) or contains a ``.``, or when
  it names no group, host names too.
- ``group[i]`` and ``group[start:end]`` (end included, as in Ansible) pick from what the
  term matched; ``[start:]`` runs to the end.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

from gpufleet.errors import InventoryError
from gpufleet.inventory.hosts import bracketed_ipv6, is_ipv6

__all__ = ["select_hosts", "split_pattern"]

_SUBSCRIPT = re.compile(
    r"(?P<expr>.+)\[(?:(?P<index>-?[0-9]+)|(?P<start>[0-9]+)[:-](?P<end>[0-9]*))\]")
_TERM = re.compile(r"(?:[^:\[\]\s]|\[[^\]]*\])+")
_HOST_OR_PORT = re.compile(r"(?:[\w.-]|\[[^\]]*\])+(?::[0-9]+)?")
_HOST_SPECIALS = (".", "?", "*", "[")


def split_pattern(pattern: str) -> list[str]:
    """Split a host pattern into terms, as Ansible's split_host_pattern does."""
    if "," in pattern:
        parts = pattern.split(",")
    else:
        stripped = pattern.strip()
        one = is_ipv6(stripped) or bracketed_ipv6(stripped) or _HOST_OR_PORT.fullmatch(stripped)
        parts = [stripped] if one else _TERM.findall(stripped)
    return [part.strip() for part in parts if part.strip()]


def _compile(expression: str, term: str) -> re.Pattern[str]:
    try:
        return re.compile(expression[1:] if expression.startswith("~")
                          else fnmatch.translate(expression))
    except re.error as exc:
        raise InventoryError(f"host pattern term '{term}' is not a valid expression: {exc}"
                             ) from None


def _subscript(found: list[str], match: re.Match[str], term: str) -> list[str]:
    """Ansible's subscript rules, ``[x:0]`` (one host) included."""
    if not found:
        return found
    start = int(match["index"] if match["index"] is not None else match["start"])
    if match["index"] is None:
        if not match["end"]:
            return found[start:]
        if int(match["end"]):
            return found[start : int(match["end"]) + 1]
    if not -len(found) <= start < len(found):
        raise InventoryError(f"host pattern '{term}': index {start} is outside the "
                             f"{len(found)} host(s) matched")
    return [found[start]]


def _match(term: str, hosts: list[str], groups: list[str],
           group_hosts: Callable[[str], list[str]]) -> list[str]:
    """The hosts one term (without its & or !) matches, in Ansible's order."""
    subscript = None if term.startswith("~") else _SUBSCRIPT.fullmatch(term)
    expression = subscript["expr"] if subscript else term
    regex = _compile(expression, term)
    matched_groups = [name for name in groups if regex.match(name)]
    found: list[str] = []
    for name in matched_groups:
        found.extend(group_hosts(name))
    pattern_like = expression.startswith("~") or any(c in expression for c in _HOST_SPECIALS)
    if not matched_groups or pattern_like:
        found.extend(name for name in hosts if regex.match(name))
    literal = not expression.startswith("~") and not any(c in expression for c in "*?[")
    if literal and not found and not matched_groups:
        raise InventoryError(f"host pattern term '{expression}' matches no host or group")
    return _subscript(found, subscript, term) if subscript else found


def select_hosts(pattern: str, hosts: list[str], groups: list[str],
                 group_hosts: Callable[[str], list[str]]) -> list[str]:
    """Host names matching ``pattern``, in the order Ansible lists them."""
    terms = split_pattern(pattern)
    regular = [term for term in terms if term[0] not in "&!"] or ["all"]
    ordered = regular + [t for t in terms if t[0] == "&"] + [t for t in terms if t[0] == "!"]
    known = set(hosts)
    chosen: list[str] = []
    for term in ordered:
        if term in known:
            chosen.append(term)
            continue
        kind = term[0] if term[0] in "&!" else ""
        matched = _match(term[1:] if kind else term, hosts, groups, group_hosts)
        if kind == "!":
            removed = set(matched)
            chosen = [name for name in chosen if name not in removed]
        elif kind == "&":
            kept = set(matched)
            chosen = [name for name in chosen if name in kept]
        else:
            present = set(chosen)
            chosen.extend(name for name in dict.fromkeys(matched) if name not in present)
    return list(dict.fromkeys(chosen))
