"""INI inventory files, read line by line as Ansible's ``ini`` inventory plugin reads them.

- ``[group]``, ``[group:vars]`` and ``[group:children]`` headers, optionally followed by a
  ``# comment``; lines starting with ``#`` or ``;`` are comments.
- A host line is split like a shell line with comments: ``#`` starts a comment anywhere
  outside quotes, even inside a value (``a=x#y b=1`` sets only ``a="x"``).
- A ``[group:vars]`` line is ``key = value``; the whole rest of the line is the value, so
  ``c=abc # note`` is ``"abc # note"``.
- Every value, on host lines and in ``:vars``, is read as a Python literal where it is one
  (``2222`` an int, ``True`` a bool, ``[1, 2]`` a list, ``'x'`` the string x), else kept as
  text. Tuples and sets become lists, complex numbers and ``...`` stay text, and bytes
  (``b'x'``) become text that is never templated, as in Ansible.
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpufleet.inventory.files import Where
from gpufleet.inventory.hosts import bracketed_ipv6
from gpufleet.inventory.read_yaml import Unsafe

__all__ = ["ChildLine", "HostLine", "Section", "VarLine", "ini_value", "read_ini"]

_SECTION = re.compile(r"\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?")
_GROUP_NAME = re.compile(r"([^:\]\s]+)\s*(?:#.*)?")


@dataclass(frozen=True)
class Section:
    """``[name]`` or ``[name:kind]``."""

    name: str
    kind: str
    where: Where


@dataclass(frozen=True)
class HostLine:
    """A host entry (name, range or address) and its inline variables."""

    group: str
    token: str
    values: dict[str, Any]
    where: Where


@dataclass(frozen=True)
class VarLine:
    """One ``key=value`` of a ``[group:vars]`` section."""

    group: str
    key: str
    value: Any
    where: Where


@dataclass(frozen=True)
class ChildLine:
    """One group name of a ``[group:children]`` section."""

    group: str
    child: str
    where: Where


def _text(value: Any) -> Any:
    """Ansible's clean-up of a literal: tuples and sets become lists, bytes text, complex
    numbers and Ellipsis their text."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_text(item) for item in value]
    if isinstance(value, dict):
        return {_text(key) if isinstance(key, bytes) else key: _text(item)
                for key, item in value.items()}
    if isinstance(value, bytes):
        return Unsafe(value.decode("utf-8", errors="surrogateescape"))
    if value is Ellipsis:
        return "..."
    if isinstance(value, complex):
        return str(value)
    return value


def ini_value(text: str, where: Where, key: str) -> Any:
    """An INI value read as a Python literal where it is one, else the text itself."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    except (TypeError, MemoryError, RecursionError) as exc:
        raise where.error(f"cannot read the value of {key}: {type(exc).__name__}: {exc}"
                          ) from None
    return _text(value)


def read_ini(text: str, where: Where) -> Iterator[Section | HostLine | VarLine | ChildLine]:
    """The sections and entries of an INI inventory, in file order."""
    group, kind = "ungrouped", "hosts"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        at = where.at(number)
        section = _SECTION.fullmatch(line)
        if section:
            group, kind = section.group(1), section.group(2) or "hosts"
            if kind not in ("hosts", "children", "vars"):
                raise at.error(f"unknown section type '{kind}' in '[{group}:{kind}]' "
                               "(expected hosts, children or vars)")
            yield Section(group, kind, at)
        elif line.startswith("[") and line.endswith("]"):
            raise at.error(f"invalid section header '{line}' (no spaces or other "
                           "characters allowed in a section name)")
        elif line.startswith("[") and not bracketed_ipv6(line.split()[0]):
            raise at.error(f"invalid section header '{line}'")
        elif kind == "hosts":
            yield _host_line(line, group, at)
        elif kind == "vars":
            yield _var_line(line, group, at)
        else:
            child = _GROUP_NAME.fullmatch(line)
            if not child:
                raise at.error(f"expected one group name in [{group}:children], got '{line}'")
            yield ChildLine(group, child.group(1), at)


def _host_line(line: str, group: str, where: Where) -> HostLine:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError as exc:
        raise where.error(f"cannot parse host line: {exc}") from None
    if not tokens:
        raise where.error(f"cannot parse host line '{line}'")
    token, *assignments = tokens
    values: dict[str, Any] = {}
    for assignment in assignments:
        key, equals, value = assignment.partition("=")
        if not equals or not key:
            raise where.error(f"expected key=value after host '{token}', got '{assignment}'")
        values[key] = ini_value(value, where, key)
    return HostLine(group, token, values, where)


def _var_line(line: str, group: str, where: Where) -> VarLine:
    key, equals, value = line.partition("=")
    key = key.strip()
    if not equals or not key:
        raise where.error(f"expected key=value in [{group}:vars], got '{line}'")
    return VarLine(group, key, ini_value(value.strip(), where, key), where)
