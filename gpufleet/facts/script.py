"""Compose many fact commands into ONE shell script with section markers, and split its output.

Each section's output is kept byte-exact between its markers, with its exit status,
so that parsers on the controller see what the command printed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

START = "@@gpufleet:"
END = "@@gpufleet-rc:"
PRELUDE = (
    "export LC_ALL=C PATH=\"$PATH:/usr/local/sbin:/usr/sbin:/sbin\"\n"
    f"__s() {{ printf '\\n{START}%s@@\\n' \"$1\"; }}\n"
    f"__e() {{ printf '\\n{END}%s@@\\n' \"$1\"; }}\n"
)
_SECTION = re.compile(
    rf"\n{re.escape(START)}(?P<name>[^\n]*?)@@\n(?P<body>.*?)\n{re.escape(END)}(?P<rc>\d+)@@\n",
    re.DOTALL,
)


@dataclass(frozen=True)
class Section:
    """One command's output in the composite script."""

    name: str
    rc: int
    text: str


def compose(commands: Iterable[tuple[str, str]]) -> str:
    """A script that runs each ``(name, shell)`` in a subshell, stderr folded into stdout."""
    parts = [PRELUDE]
    for name, shell in commands:
        if "\n" in name or "@@" in name:
            raise ValueError(f"bad section name {name!r}")
        parts.append(f"__s {shlex.quote(name)}\n( {shell}\n) </dev/null 2>&1\n__e $?\n")
    return "".join(parts)


def split(output: str) -> dict[str, Section]:
    """Sections by name from the composite script's output."""
    return {m["name"]: Section(m["name"], int(m["rc"]), m["body"])
            for m in _SECTION.finditer(output)}
