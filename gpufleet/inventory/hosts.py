"""Inventory host entries: ``name``, ``name:port``, IPv6 addresses and ``[start:end]`` ranges.

Ranges are expanded the way Ansible expands them, but the number of names an entry
stands for is computed before anything is built, so ``n[0:999999999999]`` is refused with
a clear error instead of exhausting memory.
"""

from __future__ import annotations

import ipaddress
import re
from math import prod

from gpufleet.inventory.files import Where

__all__ = ["bracketed_ipv6", "host_names", "is_ipv6", "parse_port"]

_RANGE = re.compile(r"\[([^\[\]]*)\]")
_BRACKETED = re.compile(r"\[([^\[\]]+)\](?::(.*))?")
_DIGITS = re.compile(r"[0-9]+")


def parse_port(value: object) -> int:
    """A TCP port 1-65535 from an int or its decimal text."""
    text = str(value)
    if isinstance(value, bool) or not _DIGITS.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise ValueError("expected a number from 1 to 65535")
    return int(text)


def is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def bracketed_ipv6(token: str) -> re.Match[str] | None:
    """``[address]`` or ``[address]:port`` where address is IPv6."""
    match = _BRACKETED.fullmatch(token)
    return match if match and is_ipv6(match.group(1)) else None


def _port_in(token: str, text: str | None, where: Where) -> int | None:
    if text is None:
        return None
    try:
        return parse_port(text)
    except ValueError as exc:
        raise where.error(f"invalid port '{text}' in host '{token}': {exc}") from None


def host_names(token: str, where: Where, max_hosts: int) -> tuple[list[str], int | None]:
    """Expand an inventory host entry to its names and the port it sets (or None)."""
    if "[" not in token and ":" not in token:  # a plain name: no range, port or IPv6
        return [token], None
    bracketed = bracketed_ipv6(token)
    if bracketed:
        return [bracketed.group(1)], _port_in(token, bracketed.group(2), where)
    colons = _RANGE.sub("", token).count(":")
    if colons > 1:
        if not is_ipv6(token):
            raise where.error(f"invalid host '{token}': expected name, name:port or IPv6 address")
        return [token], None
    if colons == 1:
        name, _, port = token.rpartition(":")
        return _expand(name, token, where, max_hosts), _port_in(token, port, where)
    return _expand(token, token, where, max_hosts), None


class _Range:
    """One ``[start:end(:step)]`` of a host entry, not yet expanded."""

    def __init__(self, body: str) -> None:
        parts = body.split(":")
        if len(parts) not in (2, 3):
            raise ValueError("expected [start:end] or [start:end:step]")
        start, end = parts[0] or "0", parts[1]
        step = parts[2] if len(parts) == 3 else "1"
        if not end:
            raise ValueError("end is missing")
        if not _DIGITS.fullmatch(step) or int(step) == 0:
            raise ValueError(f"step must be a positive integer, got '{step}'")
        self.step = int(step)
        self.width = 0
        self.letters = False
        if _DIGITS.fullmatch(start) and _DIGITS.fullmatch(end):
            self.width = len(start) if start.startswith("0") and len(start) > 1 else 0
            if self.width and len(end) != self.width:
                raise ValueError("zero-padded start and end must have the same width")
            self.first, self.last = int(start), int(end)
        elif _is_letter(start) and _is_letter(end) and start.islower() == end.islower():
            self.letters = True
            self.first, self.last = ord(start), ord(end)
        else:
            raise ValueError("start and end must be two numbers or two letters of the same case")
        if self.first > self.last:
            raise ValueError(f"start {start} is after end {end}")

    def __len__(self) -> int:
        return (self.last - self.first) // self.step + 1

    def items(self) -> list[str]:
        values = range(self.first, self.last + 1, self.step)
        if self.letters:
            return [chr(value) for value in values]
        return [str(value).zfill(self.width) for value in values]


def _is_letter(text: str) -> bool:
    return len(text) == 1 and text.isascii() and text.isalpha()


def _expand(pattern: str, token: str, where: Where, max_hosts: int) -> list[str]:
    """Expand every ``[start:end]`` or ``[start:end:step]`` range in a host name."""
    pieces: list[str] = []
    ranges: list[_Range] = []
    position = 0
    for match in _RANGE.finditer(pattern):
        try:
            ranges.append(_Range(match.group(1)))
        except ValueError as exc:
            raise where.error(f"invalid host range '{token}': {exc}") from None
        pieces.append(pattern[position : match.start()])
        position = match.end()
    count = prod(len(item) for item in ranges)
    if count > max_hosts:
        raise where.error(f"host range '{token}' stands for {count} hosts, more than the limit "
                          f"of {max_hosts} (GPUFLEET_MAX_HOSTS)")
    names = [""]
    for prefix, item in zip(pieces, ranges, strict=True):
        names = [name + prefix + value for name in names for value in item.items()]
    return [name + pattern[position:] for name in names]
