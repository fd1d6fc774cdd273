"""Facts about a host, all gathered in ONE round trip and parsed on the controller."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpufleet.connect.connection import CommandTimeout, Connection
from gpufleet.errors import GpufleetError, ParseError
from gpufleet.facts import catalog, script
from gpufleet.facts.formats import FileDigest, FileState
from gpufleet.inventory.model import Host

FACTS_TIMEOUT_S = 90.0
SNIPPET_TIMEOUT_S = 20.0
SNIPPET_TIMEOUT_VAR = "gpufleet_fact_timeout"


@dataclass(frozen=True)
class FactRequest:
    """What a run needs beyond the base facts: packages, files, links, pythons, sysctls,
    and ``custom`` facts a role defines itself (its own shell and parser)."""

    packages: frozenset[str] = frozenset()
    files: frozenset[str] = frozenset()
    links: frozenset[str] = frozenset()
    pythons: frozenset[str] = frozenset()
    sysctls: frozenset[str] = frozenset()
    custom: frozenset[catalog.Fact] = frozenset()

    def __or__(self, other: FactRequest) -> FactRequest:
        return FactRequest(self.packages | other.packages, self.files | other.files,
                           self.links | other.links, self.pythons | other.pythons,
                           self.sysctls | other.sysctls, self.custom | other.custom)

    def facts(self) -> list[catalog.Fact]:
        """The fact definitions this request adds to the base set."""
        extra: list[catalog.Fact] = []
        if self.packages:
            extra.append(catalog.packages_fact(sorted(self.packages)))
        extra += [catalog.file_fact(p) for p in sorted(self.files)]
        extra += [catalog.link_fact(p) for p in sorted(self.links)]
        extra += [catalog.torch_fact(p) for p in sorted(self.pythons)]
        extra += [catalog.sysctl_fact(k) for k in sorted(self.sysctls)]
        base = {f.name for f in catalog.BASE_FACTS}
        names: set[str] = set()
        for fact in sorted(self.custom, key=lambda f: f.name):
            if fact.name in base or fact.name in names:
                raise ValueError(f"two facts are named {fact.name!r}")
            names.add(fact.name)
            extra.append(fact)
        return extra


class FactMissing(GpufleetError):
    """A fact a decision needs is absent; the message says why."""


@dataclass
class Facts:
    """Parsed facts of one host; ``absent`` maps a fact to the reason it has no value."""

    host: str
    values: dict[str, Any] = field(default_factory=dict)
    absent: dict[str, str] = field(default_factory=dict)
    timeouts: set[str] = field(default_factory=set)
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

    def file_digest(self, path: str) -> FileDigest:
        value = self.require(f"file_digest:{path}")
        assert isinstance(value, FileDigest)
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

    def timed_out(self, name: str) -> bool:
        """Whether the fact is absent because its tool did not answer in time."""
        return name in self.timeouts


def _reason(section: script.Section) -> str:
    text = section.text.strip()
    last = text.splitlines()[-1] if text else f"exit status {section.rc}"
    return last[:200]


def parse_sections(host: str, output: str, facts: list[catalog.Fact], nonce: str = "",
                   stopped: str = "the facts script stopped early") -> Facts:
    """Parse the composite script's output into Facts (pure: no I/O); ``stopped`` says why
    a fact has no section at all."""
    sections = script.split(output, nonce)
    result = Facts(host)
    for fact in facts:
        section = sections.get(fact.name)
        if section is None:
            result.absent[fact.name] = f"no output ({stopped})"
            continue
        if section.rc != 0:
            result.absent[fact.name] = _reason(section)
            if section.rc == script.TIMED_OUT and fact.guard:
                result.timeouts.add(fact.name)
            continue
        try:
            result.values[fact.name] = fact.parse(section.text)
        except ParseError as exc:
            result.absent[fact.name] = f"unparseable output: {exc}"
        except (ValueError, KeyError, IndexError) as exc:
            result.absent[fact.name] = f"unparseable output: {type(exc).__name__}: {exc}"
    return result


def snippet_timeout(host: Host) -> float:
    """Seconds one fact whose tool can hang may take (``gpufleet_fact_timeout``)."""
    value = host.vars.get(SNIPPET_TIMEOUT_VAR, SNIPPET_TIMEOUT_S)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = 0.0
    if isinstance(value, bool) or not seconds > 0:
        raise GpufleetError(f"host {host.name}: variable {SNIPPET_TIMEOUT_VAR} must be a "
                            f"positive number of seconds, got {value!r}")
    return seconds


def gather_facts(conn: Connection, request: FactRequest | None = None) -> Facts:
    """All base facts plus those requested, in one round trip to the host.

    A fact whose tool hangs costs that fact (absent, "timed out after N s"), never the
    others; if the whole script is stopped, the facts it had printed are kept.
    """
    facts = catalog.BASE_FACTS + (request or FactRequest()).facts()
    nonce = script.new_nonce()
    limit = snippet_timeout(conn.host)
    composite = script.compose((script.Snippet(f.name, f.shell, f.guard) for f in facts),
                               nonce, limit)
    tools = {f.guard for f in facts if f.guard}
    overall = max(FACTS_TIMEOUT_S, limit * len(tools) + 30)
    start = time.monotonic()
    stopped = "the facts script stopped early"
    try:
        result = conn.run(composite, timeout=overall)
    except CommandTimeout as exc:
        result = exc.partial
        stopped = f"the facts script was stopped after {time.monotonic() - start:.0f}s"
    if not script.split(result.stdout, nonce):
        detail = (result.stderr or result.stdout).strip()[-300:] or stopped
        raise GpufleetError(f"facts script produced no sections (exit {result.rc}): {detail}")
    parsed = parse_sections(conn.host.name, result.stdout, facts, nonce, stopped)
    parsed.gathered_at = time.time()
    parsed.duration = time.monotonic() - start
    return parsed
