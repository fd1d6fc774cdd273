"""``scontrol show config``: Slurm's configuration as slurmctld reports it, parsed.

The output is ``Key = Value`` lines (the key padded to 23 columns; a value may be empty,
hold spaces, ``30 sec``, or ``=``, ``jwt_key=/etc/slurm/jwt.key``) under a ``Configuration
data as of TIME`` line, then sections, each a heading line ending in ``:`` and its own
``Key = Value`` lines: ``Cgroup Support Configuration:`` (cgroup.conf, printed only while a
cgroup plugin is configured), ``Account Gather Configuration:``, ``MPI Plugins
Configuration:`` ...; the last line says whether slurmctld is up (``Slurmctld(primary) at
HOST is UP``). The parser is pure; it keeps the sections apart, since a section's key may
repeat one of the main part.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpufleet.errors import ParseError

CGROUP = "Cgroup Support Configuration"
MAX_BYTES = 4 * 2**20
_PAIR = re.compile(r"^(?P<key>[A-Za-z][A-Za-z0-9_]*(?:\[\d+\])?)\s*=(?:\s*(?P<value>.*))?$")
_HEADING = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9 _/-]*):$")
_STATUS = re.compile(r"^Slurmctld\(.*\) at .* (?:is|are) ")
_NULL = frozenset({"", "(null)", "none", "n/a"})


@dataclass(frozen=True)
class SlurmConfig:
    """The main ``Key = Value`` part of ``scontrol show config`` and each section's."""

    values: dict[str, str]
    sections: dict[str, dict[str, str]] = field(default_factory=dict)

    def get(self, key: str) -> str | None:
        """A key's value in the main part, else in the first section that has it; None
        where Slurm prints nothing for it or says ``(null)``."""
        for part in (self.values, *self.sections.values()):
            if key in part:
                return None if part[key].lower() in _NULL else part[key]
        return None

    @property
    def version(self) -> str | None:
        return self.values.get("SLURM_VERSION")

    @property
    def cgroup(self) -> dict[str, str] | None:
        """cgroup.conf's settings, or None when slurmctld printed none (no cgroup plugin
        is configured, or a Slurm older than the section)."""
        return self.sections.get(CGROUP)

    def flat(self) -> dict[str, str]:
        """Every key and its value, the main part's first, then each section's keys it
        does not repeat."""
        merged: dict[str, str] = {}
        for part in (self.values, *self.sections.values()):
            for key, value in part.items():
                merged.setdefault(key, value)
        return merged


def parse_show_config(text: str) -> SlurmConfig:
    """``scontrol show config`` -> its main part and sections. Lines that are neither a
    pair, a heading nor the status line are ignored; output without a single pair is a
    ParseError that quotes it."""
    if len(text) > MAX_BYTES:
        raise ParseError(f"scontrol show config: {len(text)} bytes, more than {MAX_BYTES}")
    values: dict[str, str] = {}
    sections: dict[str, dict[str, str]] = {}
    current = values
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("Configuration data as of") or _STATUS.match(line):
            continue
        if pair := _PAIR.match(line):
            current.setdefault(pair["key"], (pair["value"] or "").strip())
        elif heading := _HEADING.match(line):
            current = sections.setdefault(heading["name"].strip(), {})
    if not values and not any(sections.values()):
        raise ParseError(f"scontrol show config: no 'Key = Value' lines in {text[:80]!r}")
    return SlurmConfig(values, sections)
