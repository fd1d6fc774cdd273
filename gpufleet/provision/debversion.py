"""Debian package version comparison (epoch, upstream version, revision), as dpkg does it."""

from __future__ import annotations

from functools import cmp_to_key


def _order(ch: str) -> int:
    if ch == "~":
        return -1
    if ch.isalpha():
        return ord(ch)
    return ord(ch) + 256


def _compare_fragment(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit and digit runs, '~' sorts before anything."""
    ia = ib = 0
    while ia < len(a) or ib < len(b):
        first_diff = 0
        while (ia < len(a) and not a[ia].isdigit()) or (ib < len(b) and not b[ib].isdigit()):
            ac = _order(a[ia]) if ia < len(a) and not a[ia].isdigit() else 0
            bc = _order(b[ib]) if ib < len(b) and not b[ib].isdigit() else 0
            if ac != bc:
                return ac - bc
            ia += 1
            ib += 1
        while ia < len(a) and a[ia] == "0":
            ia += 1
        while ib < len(b) and b[ib] == "0":
            ib += 1
        while ia < len(a) and a[ia].isdigit() and ib < len(b) and b[ib].isdigit():
            if not first_diff:
                first_diff = ord(a[ia]) - ord(b[ib])
            ia += 1
            ib += 1
        if ia < len(a) and a[ia].isdigit():
            return 1
        if ib < len(b) and b[ib].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split(version: str) -> tuple[int, str, str]:
    epoch, _, rest = version.partition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
    return int(epoch or 0), upstream, revision


def compare(a: str, b: str) -> int:
    """Negative, zero or positive as version ``a`` sorts before, equal to or after ``b``."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return ea - eb
    return _compare_fragment(ua, ub) or _compare_fragment(ra, rb)


sort_key = cmp_to_key(compare)
