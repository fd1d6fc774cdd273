"""The result tables of the nccl-tests binaries (``all_reduce_perf`` ...), also with the tags
``mpirun --tag-output`` and launchers put before each line."""

from __future__ import annotations

import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _float, _int, _lines

_NCCL_LEAD = ["size", "count", "type"]
_NCCL_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)")
# mpirun --tag-output puts "[JOB,RANK]<stdout>:" before every line; launchers that collect
# mpirun's output (Ray, SkyPilot, kubectl logs with prefixes) add their own in front of it
_MPI_TAG = re.compile(r"^.*?\[\d+,\d+\]<std(?:out|err)>:")


def _untagged(line: str) -> str:
    """A line without the ``[1,0]<stdout>:`` tag of ``mpirun --tag-output`` (and whatever
    prefix a launcher put before that tag)."""
    return _MPI_TAG.sub("", line, count=1)


def nccl_tests(text: str) -> list[dict[str, Any]]:
    """Parse the result table of an nccl-tests binary (``all_reduce_perf`` etc.).

    One dict per size row: ``size``, ``count``, ``type``, ``redop`` and ``root`` (None when
    the build prints no such column: nccl-tests before 2.11 printed ``redop`` only for
    reductions and ``root`` only for rooted collectives) and ``out_of_place``/``in_place``
    with ``time_us``, ``algbw``, ``busbw`` and ``wrong`` (None when not checked or when the
    build prints an ``error`` column, whose value is then kept as ``error``). Columns are
    located from the ``# size count ...`` header, so NCCL log lines and comments are
    skipped; the tags of ``mpirun --tag-output`` are removed first.
    """
    layout: tuple[list[str], list[str]] | None = None
    rows: list[dict[str, Any]] = []
    for line in _lines(text):
        stripped = _untagged(line).strip()
        if stripped.startswith("#"):
            names = stripped.lstrip("#").split()
            if names[:2] == _NCCL_LEAD[:2]:
                layout = _nccl_layout(names, line)
            continue
        tokens = stripped.split()
        # a row has its size and count first: one of the two is enough to know a row
        # whose other one is garbled, which is then refused rather than skipped
        if len(tokens) < 2 or not (tokens[0].isdigit() or tokens[1].isdigit()):
            continue
        if layout is None:
            raise _error("nccl-tests", "the '# size count type ...' header before data", line)
        rows.append(_nccl_row(tokens, layout, line))
    if not rows:
        raise _error("nccl-tests", "at least one result row", text)
    return rows


def _nccl_layout(names: list[str], line: str) -> tuple[list[str], list[str]]:
    """Return (leading column names, per-half column names) from a header row."""
    if names[:3] != _NCCL_LEAD:
        raise _error("nccl-tests", "columns size, count, type", line)
    lead = list(_NCCL_LEAD)
    for optional in ("redop", "root"):
        if names[len(lead) : len(lead) + 1] == [optional]:
            lead.append(optional)
    rest = names[len(lead) :]
    if rest and rest[-1] == "timestamp":
        rest = rest[:-1]
    half = rest[: len(rest) // 2]
    valid = (
        len(rest) % 2 == 0
        and rest[len(half) :] == half
        and len(half) >= 4
        and half[0] in ("time", "cputime")
        and half[1:3] == ["algbw", "busbw"]
        and half[3] in ("#wrong", "error")
    )
    if not valid:
        raise _error("nccl-tests", "time, algbw, busbw, #wrong|error for both halves", line)
    return lead, half


def _nccl_row(
    tokens: list[str], layout: tuple[list[str], list[str]], line: str
) -> dict[str, Any]:
    lead_names, half = layout
    lead = len(lead_names)
    if len(tokens) < lead + 2 * len(half):
        raise _error("nccl-tests", f"{lead + 2 * len(half)} columns", line)
    cell = dict(zip(lead_names, tokens, strict=False))
    row: dict[str, Any] = {
        "size": _int("nccl-tests", tokens[0], line),
        "count": _int("nccl-tests", tokens[1], line),
        "type": tokens[2],
        "redop": cell.get("redop"),
        "root": _int("nccl-tests", cell["root"], line) if "root" in cell else None,
    }
    for index, key in enumerate(("out_of_place", "in_place")):
        cells = tokens[lead + index * len(half) : lead + (index + 1) * len(half)]
        result: dict[str, Any] = {
            "time_us": _float("nccl-tests", cells[0], line),
            "algbw": _float("nccl-tests", cells[1], line),
            "busbw": _float("nccl-tests", cells[2], line),
            "wrong": None,
        }
        checked = cells[3] != "N/A"
        if half[3] == "error":
            result["error"] = _float("nccl-tests", cells[3], line) if checked else None
        elif checked:
            result["wrong"] = int(_float("nccl-tests", cells[3], line))
        row[key] = result
    return row


def nccl_tests_avg_busbw(text: str) -> float | None:
    """Return the value of the ``# Avg bus bandwidth : X`` line, or None when absent."""
    value: float | None = None
    for line in _lines(text):
        if match := _NCCL_AVG.match(_untagged(line).strip()):
            value = _float("nccl-tests", match.group(1), line)
    return value
