"""Facts about a host, all gathered in ONE round trip and parsed on the controller."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpufleet.connection import Connection
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.facts import catalog, script
from gpufleet.facts.formats import FileState

FACTS_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class FactRequest:
    """What a run needs beyond the base facts: packages, files, links, pythons, sysctls."""

    packages: frozenset[str] = frozenset()
    files: frozenset[str] = frozenset()
    links: frozenset[str] = frozenset()
    pythons: frozenset[str] = frozenset()
    sysctls: frozenset[str] = frozenset()

    def __or__(self, other: FactRequest) -> FactRequest:
        return FactRequest(self.packages | other.packages, self.files | other.files,
                           self.links | other.links, self.pythons | other.pythons,
                           self.sysctls | other.sysctls)

    def facts(self) -> list[catalog.Fact]:
        """The fact definitions this request adds to the base set."""
        extra: list[catalog.Fact] = []
        if self.packages:
            extra.append(catalog.packages_fact(sorted(self.packages)))
        extra += [catalog.file_fact(p) for p in sorted(self.files)]
        extra += [catalog.link_fact(p) for p in sorted(self.links)]
        extra += [catalog.torch_fact(p) for p in sorted(self.pythons)]
        extra += [catalog.sysctl_fact(k) for k in sorted(self.sysctls)]
        return extra


class FactMissing(GpufleetError):
    """A fact a decision needs is absent; the message says why."""


@dataclass
class Facts:
    """Parsed facts of one host; ``absent`` maps a fact to the reason it has no value."""

    host: str
    values: dict[str, Any] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)
    gathered_at: float = 0.0
    duration: float = 0.0

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def require(self, name: str) -> Any:
        """The fact's value, or FactMissing naming why it is absent."""
        if name in self.values:
            return self.values[name]
        raise FactMissing(f"fact {name!r} is unknown: {self.absent.get(name, 'not gathered')}")

    def file(self, path: str) -> FileState:
        value = self.require(f"file:{path}")
        assert isinstance(value, FileState)
        return value

    def link(self, path: str) -> str | None:
        value: str | None = self.require(f"link:{path}")
        return value

    def package(self, name: str) -> dict[str, Any] | None:
        """dpkg's record of an installed package, or None when it is not installed."""
        record: dict[str, Any] | None = self.require("packages").get(name)
        if record is None or not record.get("installed"):
            return None
        return record

    def torch(self, python: str) -> dict[str, Any] | None:
        """What torch reports under ``python``; None when torch or the python is missing."""
        value: dict[str, Any] | None = self.values.get(f"torch:{python}")
        return value

    def sysctl(self, key: str) -> str:
        value: str = self.require(f"sysctl:{key}")
        return value

    @property
    def cuda_version(self) -> str | None:
        """The CUDA toolkit version from version.json, else from nvcc."""
        version: str | None = self.values.get("cuda_version_json") or self.values.get("nvcc")
        return version

    def why_absent(self, name: str) -> str:
        return self.absent.get(name, "not gathered")


def _reason(section: script.Section) -> str:
    text = section.text.strip()
    last = text.splitlines()[-1] if text else f"exit status {section.rc}"
    return last[:200]


def parse_sections(host: str, output: str, facts: list[catalog.Fact], nonce: str = "") -> Facts:
    """Parse the composite script's output into Facts (pure: no I/O)."""
    sections = script.split(output, nonce)
    result = Facts(host)
    for fact in facts:
        section = sections.get(fact.name)
        if section is None:
            result.absent[fact.name] = "no output (the facts script stopped early)"
            continue
        if section.rc != 0:
            result.absent[fact.name] = _reason(section)
            continue
        try:
            result.values[fact.name] = fact.parse(section.text)
        except ParseError as exc:
            result.absent[fact.name] = f"unparseable output: {exc}"
        except (ValueError, KeyError, IndexError) as exc:
            result.absent[fact.name] = f"unparseable output: {type(exc).__name__}: {exc}"
    return result


def gather_facts(conn: Connection, request: FactRequest | None = None) -> Facts:
    """All base facts plus those requested, in one round trip to the host."""
    facts = catalog.BASE_FACTS + (request or FactRequest()).facts()
    nonce = script.new_nonce()
    composite = script.compose(((f.name, f.shell) for f in facts), nonce)
    start = time.monotonic()
    result = conn.run(composite, timeout=FACTS_TIMEOUT_S)
    if not script.split(result.stdout, nonce):
        detail = (result.stderr or result.stdout).strip()[-300:]
        raise GpufleetError(f"facts script produced no sections (exit {result.rc}): {detail}")
    parsed = parse_sections(conn.host.name, result.stdout, facts, nonce)
    parsed.gathered_at = time.time()
    parsed.duration = time.monotonic() - start
    return parsed
