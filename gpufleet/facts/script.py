"""Compose many fact commands into ONE shell script with section markers, and split its output.

Each section's output is kept byte-exact between its markers, with its exit status,
so that parsers on the controller see what the command printed. The markers carry a
random nonce chosen per run, so no command output can end or forge a section.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass


def new_nonce() -> str:
    """A marker nonce for one run."""
    return secrets.token_hex(8)


def _markers(nonce: str) -> tuple[str, str]:
    tag = f"@@gpufleet-{nonce}" if nonce else "@@gpufleet"
    return f"{tag}:", f"{tag}-rc:"


def prelude(nonce: str = "") -> str:
    """Shell functions that print the start and end markers of a section."""
    start, end = _markers(nonce)
    return (
        "export LC_ALL=C PATH=\"$PATH:/usr/local/sbin:/usr/sbin:/sbin\"\n"
        f"__s() {{ printf '\\n{start}%s@@\\n' \"$1\"; }}\n"
        f"__e() {{ printf '\\n{end}%s@@\\n' \"$1\"; }}\n"
    )


PRELUDE = prelude()


@dataclass(frozen=True)
class Section:
    """One command's output in the composite script."""

    name: str
    rc: int
    text: str


def compose(commands: Iterable[tuple[str, str]], nonce: str = "") -> str:
    """A script that runs each ``(name, shell)`` in a subshell, stderr folded into stdout."""
    parts = [prelude(nonce)]
    for name, shell in commands:
        if "\n" in name or "@@" in name:
            raise ValueError(f"bad section name {name!r}")
        parts.append(f"__s {shlex.quote(name)}\n( {shell}\n) </dev/null 2>&1\n__e $?\n")
    return "".join(parts)


def split(output: str, nonce: str = "") -> dict[str, Section]:
    """Sections by name from the composite script's output."""
    start, end = (re.escape(m) for m in _markers(nonce))
    pattern = re.compile(
        rf"\n{start}(?P<name>[^\n]*?)@@\n(?P<body>.*?)\n{end}(?P<rc>\d+)@@\n", re.DOTALL)
    return {m["name"]: Section(m["name"], int(m["rc"]), m["body"])
            for m in pattern.finditer(output)}
