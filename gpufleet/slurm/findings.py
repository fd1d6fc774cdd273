"""Every open finding of a node, kept in its Slurm drain reason.

A node gpufleet drains stays drained while any finding is open: a failed conformance check
(``conformance``, by suite/check), a drifted role (``drift``), a failed health check
(``healthcheck``, run by slurmd on the node), a failed check of the node program's Slurm
prolog or epilog (``prolog``, ``epilog``, run by slurmd at each job's start and end) or a
failed bootstrap step (``bootstrap``).
A run clears only the findings it checked again and passed; the others stay, whoever
raised them. The findings live in the reason itself, the one place every controller and
the node's own health check read and write, so they survive a controller's restart and two
controllers see the same set.

A reason reads (``sinfo -R`` shows its first 20 characters, which name the first
finding), on one line::

    gf gpu/health: GPU0: 2 uncorrectable ECC errors since boot (+1 more)
    {gf1 c:gpu/health@1764590000 d:nccl_env@1764590300}

The program on nodes (gpufleet/node/healthcheck.py) reads and writes the same format with
its own copy of this code (it imports nothing from gpufleet); a test holds the two together.
Reasons of earlier versions (``gpufleet: <source>/<check>: <message>``) are read as one
finding; any other reason (``gpufleet: ...`` written by a site's own hook included) is an
operator's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

PREFIX = "gf "
LEGACY = "gpufleet: "
SOURCES = {"conformance": "c", "drift": "d", "healthcheck": "h", "bootstrap": "b",
           "prolog": "p", "epilog": "e", "gang": "g"}
LABELS = {"conformance": "", "drift": "drift/", "healthcheck": "hc/", "bootstrap": "bootstrap/",
          "prolog": "prolog/", "epilog": "epilog/", "gang": "gang/"}
MESSAGE_LIMIT = 160
MOST = 40  # findings kept in one reason (each role and check is at most one)
_TRAILER = re.compile(r" \{gf1 (?P<body>[^{}]*)\}$")
_PUNCTUATION = str.maketrans({'"': "'", "{": "(", "}": ")", "[": "(", "]": ")"})
_SLURM_FIELD = re.compile(r"\b(Reason|Comment|Extra)=")
_TOKEN = re.compile(r"^(?P<source>[a-z]):(?P<id>[^\s@{}]+)@(?P<since>\d+)$")
_ID = re.compile(r"[\s@{}]")
_LEGACY = re.compile(r"^gpufleet: (?P<source>conformance|drift|healthcheck|bootstrap)/"
                     r"(?P<id>[^:]*?):")
_BY_LETTER = {letter: source for source, letter in SOURCES.items()}


@dataclass(frozen=True)
class Finding:
    """One open finding: who raised it, what it is, since when (Unix time)."""

    source: str
    id: str
    since: int

    @property
    def label(self) -> str:
        """How the reason names it: ``gpu/health``, ``drift/nccl_env``, ``hc/xid``."""
        return LABELS[self.source] + self.id

    @property
    def token(self) -> str:
        return f"{SOURCES[self.source]}:{self.id}@{self.since}"


def clean_id(text: str) -> str:
    """An id that fits a reason's token: no blanks, ``@`` or braces."""
    return _ID.sub("_", text) or "check"


def one_line(text: str) -> str:
    """Control characters to spaces, double quotes to single, braces and brackets to
    parentheses, ``Reason=``, ``Comment=`` and ``Extra=`` to ``Reason:`` ..., runs of blanks
    to one: the text goes into a ``reason=`` argument and is read back from scontrol by
    regex, where `` [user@time]`` or `` Comment=`` would end the reason early."""
    cleaned = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text)
    cleaned = _SLURM_FIELD.sub(r"\1:", cleaned.translate(_PUNCTUATION))
    return " ".join(cleaned.split())


def parse(reason: str | None) -> list[Finding] | None:
    """The findings a reason holds, oldest first; None when it is not gpufleet's (an
    operator's reason, or none)."""
    if not reason:
        return None
    if reason.startswith(PREFIX):
        match = _TRAILER.search(reason)
        found = []
        for token in (match["body"].split() if match else []):
            parsed = _TOKEN.match(token)
            if parsed and parsed["source"] in _BY_LETTER:
                found.append(Finding(_BY_LETTER[parsed["source"]], parsed["id"],
                                     int(parsed["since"])))
        return found
    if reason.startswith(LEGACY):
        legacy = _LEGACY.match(reason)
        if legacy:
            ident = legacy["id"].rstrip("/")
            if legacy["source"] == "drift":  # drift's findings are its roles
                ident = ident.split("/", 1)[0]
            return [Finding(legacy["source"], clean_id(ident), 0)]
    return None


def message_of(reason: str | None) -> str:
    """The message a gpufleet reason shows for its first finding."""
    if reason and reason.startswith(LEGACY):
        parts = reason.split(": ", 2)
        return parts[2] if len(parts) == 3 else ""
    if not reason or not reason.startswith(PREFIX):
        return ""
    body = _TRAILER.sub("", reason)
    body = re.sub(r" \(\+\d+ more\)$", "", body)
    return body.split(": ", 1)[1] if ": " in body else ""


def render(findings: list[Finding], message: str) -> str:
    """The reason for ``findings`` (the first is shown with ``message``)."""
    kept = findings[:MOST]
    first = kept[0]
    shown = one_line(message)[:MESSAGE_LIMIT].rstrip() or "failed"
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{PREFIX}{first.label}: {shown}{more} {{gf1 {' '.join(f.token for f in kept)}}}"


def reconcile(current: list[Finding], source: str, failed: Mapping[str, str],
              passed: Collection[str], now: float | None = None) -> list[Finding]:
    """The findings after a run of ``source`` that found ``failed`` (id -> message) open
    and checked ``passed`` again successfully. Another source's findings are never cleared;
    a finding already open keeps its ``since``."""
    stamp = int(now if now is not None else time.time())
    failing = {clean_id(i) for i in failed}
    cleared = {clean_id(i) for i in passed} - failing
    kept = [f for f in current if not (f.source == source and f.id in cleared)]
    known = {(f.source, f.id) for f in kept}
    return kept + [Finding(source, i, stamp) for i in dict.fromkeys(clean_id(i) for i in failed)
                   if (source, i) not in known]


def holds(current: list[Finding], source: str, failed: Mapping[str, str],
          passed: Collection[str]) -> bool:
    """Whether ``current`` shows a run of ``source``: each finding it opened is there and
    none it cleared is."""
    have = {f.id for f in current if f.source == source}
    failing = {clean_id(i) for i in failed}
    return failing <= have and not ({clean_id(i) for i in passed} - failing) & have


def reason_for(findings: list[Finding], source: str, failed: Mapping[str, str],
               previous: str | None) -> str:
    """The reason for ``findings`` after a run of ``source``: the first finding with its
    message (this run's, else the one the previous reason showed, else since when it is
    open)."""
    first = findings[0]
    messages = {clean_id(i): m for i, m in failed.items()}
    before = parse(previous) or []
    if first.source == source and first.id in messages:
        message = messages[first.id]
    elif before and before[0] == first and message_of(previous):
        message = message_of(previous)
    else:
        message = "open since " + time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime(first.since))
    return render(findings, message)
