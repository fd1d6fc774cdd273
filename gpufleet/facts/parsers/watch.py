"""The standing watch's last report: what ``gpufleet-watch --json`` printed, kept on the node
at ``STATE_DIR/watch-report.json`` (docs/watch.md): version 1, its time, every finding that
is pending, open or silenced, its notes, how many counters it holds and the counters rising
within their rule's window.

The report is written by a program on the node and read here as untrusted text: one JSON
object of at most :data:`REPORT_LIMIT` bytes, every field of the kind version 1 gives it.
Anything else (another version, a finding without an id, a status the watch does not
write, a number that is not finite, a document nested past JSON's depth) raises
``ParseError``: the node's watch is then unknown, never read as clean. Keys a later
version adds are ignored; texts are kept as written (every report escapes them) and cut
at a length no watch writes. The rising counters are the report's trends, not its
verdict: a ``rising`` list that is not what the watch writes costs the rising counters
only (none are read, and a note says why), never the findings.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gpufleet.errors import ParseError
from gpufleet.facts.parsers._capture import _error, _quote

REPORT_LIMIT = 512 * 1024
"""The most bytes of a report read (the fact's snippet refuses a larger file)."""
VERSION = 1
STATUSES = ("pending", "open", "silenced")
TEXT_LIMIT = 300
"""Messages, reasons and notes are cut here (the watch writes at most 150 characters)."""
NOTES_LIMIT = 20
RISING_LIMIT = 64
"""The most rising counters read (the watch lists at most 64, fastest first)."""
INCREASE_LIMIT = 2**64
"""The largest increase read: counters are at most 64 bits wide."""
_ID = re.compile(r"[A-Za-z0-9_./:-]{1,200}\Z")
_CLASS = re.compile(r"[a-z][a-z0-9_]{0,31}\Z")
_COUNTER = re.compile(r"[a-z0-9][a-z0-9_]{0,63}\Z")
_SOURCE = "watch report"


def _fail(expected: str, got: Any) -> ParseError:
    if isinstance(got, str):
        shown = _quote(got)
    elif isinstance(got, (list, dict)):  # named, not printed: it may be nested deep
        shown = "a list" if isinstance(got, list) else "an object"
    else:
        shown = "null" if got is None else _quote(str(got))
    return ParseError(f"{_SOURCE}: expected {expected}, got {shown}")


def _seconds(value: Any, what: str, kind: str = "a number of seconds") -> float:
    """A time, a duration (or another ``kind`` of quantity): a finite number, 0 or more (an
    integer too large for a float is none)."""
    try:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError
        seconds = float(value)
    except (OverflowError, ValueError):
        raise _fail(f"{what} {kind}", value) from None
    if not math.isfinite(seconds) or seconds < 0:
        raise _fail(f"{what} {kind}", value)
    return seconds


def _text(value: Any, what: str, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise _fail(f"{what} a string", value)
    return value if len(value) <= TEXT_LIMIT else value[: TEXT_LIMIT - 3] + "..."


def _finding(entry: Any, index: int) -> dict[str, Any]:
    where = f"findings[{index}]."
    if not isinstance(entry, dict):
        raise _fail(f"{where[:-1]} an object", entry)
    ident, kind, status = entry.get("id"), entry.get("class"), entry.get("status")
    if not isinstance(ident, str) or not _ID.match(ident):
        raise _fail(f"{where}id of letters, digits and _ . / : - (at most 200)", ident)
    if not isinstance(kind, str) or not _CLASS.match(kind):
        raise _fail(f"{where}class a lower-case word", kind)
    if status not in STATUSES:
        raise _fail(f"{where}status one of {', '.join(STATUSES)}", status)
    until = entry.get("silenced_until")
    return {"id": ident, "class": kind, "status": status,
            "since": int(_seconds(entry.get("since"), f"{where}since")),
            "message": _text(entry.get("message"), f"{where}message"),
            "silenced_until": None if until is None else _seconds(until,
                                                                   f"{where}silenced_until"),
            "silence_reason": _text(entry.get("silence_reason"), f"{where}silence_reason",
                                    nullable=True)}


def _rise(entry: Any, index: int) -> dict[str, Any]:
    where = f"rising[{index}]."
    if not isinstance(entry, dict):
        raise _fail(f"{where[:-1]} an object", entry)
    subject, counter, increase = entry.get("subject"), entry.get("counter"), entry.get("increase")
    if not isinstance(subject, str) or not _ID.match(subject):
        raise _fail(f"{where}subject of letters, digits and _ . / : - (at most 200)", subject)
    if not isinstance(counter, str) or not _COUNTER.match(counter):
        raise _fail(f"{where}counter a lower-case name (at most 64)", counter)
    if (isinstance(increase, bool) or not isinstance(increase, int)
            or not 0 <= increase <= INCREASE_LIMIT):
        raise _fail(f"{where}increase a count (at most 2^64)", increase)
    window = _seconds(entry.get("window"), f"{where}window")
    if window <= 0:
        raise _fail(f"{where}window more than 0 seconds", entry.get("window"))
    limit = entry.get("limit")
    rate = _seconds(entry.get("rate_per_hour"), f"{where}rate_per_hour", "a number, 0 or more")
    return {"subject": subject, "counter": counter, "increase": increase, "window": window,
            "rate_per_hour": rate, "limit": None if limit is None
            else _seconds(limit, f"{where}limit", "a number, 0 or more, or null")}


def _rising(value: Any) -> tuple[list[dict[str, Any]], str | None]:
    """The report's rising counters (each ``subject``, ``counter``, ``increase``,
    ``window``, ``rate_per_hour`` and ``limit``, None for a rule without one), at most
    :data:`RISING_LIMIT`, and a note: on more than that (the first are kept), or on a list
    this gpufleet cannot read (none are kept). Absent (a watch older than the list): none,
    without a note."""
    if value is None:
        return [], None
    try:
        if not isinstance(value, list):
            raise _fail("rising a list", value)
        read = [_rise(entry, i) for i, entry in enumerate(value[:RISING_LIMIT])]
    except ParseError as exc:
        return [], f"rising counters not read: {str(exc).removeprefix(_SOURCE + ': ')}"
    if len(value) > RISING_LIMIT:
        return read, (f"rising counters: the first {RISING_LIMIT} read, "
                      f"{len(value) - RISING_LIMIT} more left out")
    return read, None


def watch_report(text: str) -> dict[str, Any]:
    """The report as ``time`` (Unix seconds), ``findings`` (each ``id``, ``class``,
    ``status``, ``since``, ``message``, ``silenced_until``, ``silence_reason``, in the
    report's order), ``notes`` (at most :data:`NOTES_LIMIT`, the rest counted in a last one;
    a note on the rising counters first), ``series`` and ``rising`` (:func:`_rising`)."""
    if len(text) > REPORT_LIMIT:
        raise ParseError(f"{_SOURCE}: more than {REPORT_LIMIT} bytes; not read")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _error(_SOURCE, "a JSON document nested less deeply", text) from None
    except ValueError:
        raise _error(_SOURCE, "one JSON document", text) from None
    if not isinstance(doc, dict):
        raise _fail("a JSON object", doc)
    version = doc.get("version")
    if isinstance(version, bool) or version != VERSION:
        raise _fail(f"version {VERSION} (this gpufleet reads version {VERSION})", version)
    findings, notes, series = doc.get("findings"), doc.get("notes"), doc.get("series")
    if not isinstance(findings, list):
        raise _fail("findings a list", findings)
    if not isinstance(notes, list):
        raise _fail("notes a list", notes)
    if isinstance(series, bool) or not isinstance(series, int) or series < 0:
        raise _fail("series a count", series)
    read = [_finding(entry, i) for i, entry in enumerate(findings)]
    seen: set[str] = set()
    for finding in read:
        if finding["id"] in seen:
            raise ParseError(f"{_SOURCE}: finding {finding['id']} appears twice")
        seen.add(finding["id"])
    kept = [str(_text(note, "notes[] each")) for note in notes]
    rises, why = _rising(doc.get("rising"))
    if why:
        kept.insert(0, why)
    if len(kept) > NOTES_LIMIT:
        kept = [*kept[: NOTES_LIMIT - 1], f"(+{len(kept) - NOTES_LIMIT + 1} more notes)"]
    return {"time": _seconds(doc.get("time"), "time"), "findings": read, "notes": kept,
            "series": series, "rising": rises}
