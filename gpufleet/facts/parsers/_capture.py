"""Reading a captured text, for every parser of the package: its lines without annotations,
its numbers, its JSON document, and the ``ParseError`` naming the tool, what was expected and
a short quote."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from gpufleet.errors import ParseError

_QUOTE_LIMIT = 72


def _is_capture_note(line: str) -> bool:
    """Say whether a line is a capture annotation: a ``#`` comment or a ``$ command`` prompt."""
    stripped = line.lstrip()
    return stripped.startswith("#") or stripped.startswith("$ ")


def _lines(text: str) -> list[str]:
    """The lines of ``text`` without the indentation they all share, so output copied with
    every line indented (from a mail, a ticket, a log) reads like the tool printed it."""
    return textwrap.dedent(text).splitlines()


def _output_lines(text: str) -> list[str]:
    """Return the non-blank lines of ``text`` that are not capture annotations."""
    return [line for line in _lines(text) if line.strip() and not _is_capture_note(line)]


def _quote(text: str) -> str:
    """Quote the first meaningful line of ``text``, shortened, for an error message."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    meaningful = [line for line in lines if not _is_capture_note(line)] or lines
    if not meaningful:
        return "empty output"
    piece = meaningful[0]
    if len(piece) > _QUOTE_LIMIT:
        piece = piece[: _QUOTE_LIMIT - 3] + "..."
    return repr(piece)


def _error(source: str, expected: str, got: str) -> ParseError:
    """Build a ParseError naming the source, what was expected and what was found."""
    return ParseError(f"{source}: expected {expected}, got {_quote(got)}")


def _int(source: str, value: str, line: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise _error(source, "an integer", line) from None


def _float(source: str, value: str, line: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise _error(source, "a number", line) from None


def _json_document(source: str, text: str, openers: tuple[str, ...] = ("{", "["),
                   first_only: bool = False) -> Any:
    """Decode the first JSON value that starts a line with one of ``openers``.

    Lines printed before it (warnings, a ``$ command`` line) are skipped. With
    ``first_only`` the first such line must start it: a broken document is refused rather
    than read from an object inside it.
    """
    lines = text.splitlines()
    candidates = [i for i, line in enumerate(lines) if line.lstrip().startswith(openers)]
    for index in candidates[:1] if first_only else candidates:
        try:
            value, _ = json.JSONDecoder().raw_decode("\n".join(lines[index:]).lstrip())
        except (json.JSONDecodeError, RecursionError):
            continue
        return value
    if candidates:
        raise _error(source, "valid JSON", lines[candidates[0]])
    raise _error(source, "a JSON document", text)
