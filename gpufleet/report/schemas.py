"""The JSON Schemas (draft 2020-12) of the documents gpufleet writes, shipped in the package
as ``gpufleet/schemas/*.schema.json``, and the check of a document against its own schema.

A schema's ``$id`` is ``https://gpufleet.dev/schemas/`` followed by the schema id the
documents carry in ``schema`` (``gpufleet.drift/1``): an identifier, never fetched. Each
document's schema is a bundle: it holds ``gpufleet.common/1``, the definitions the schemas
share, in its ``$defs`` under that schema's ``$id``, so every reference resolves inside the
one file, for gpufleet and for any draft 2020-12 validator given that file alone.
"""

from __future__ import annotations

import json
import re
import time
from functools import cache
from importlib.resources import files
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import best_match
from referencing import Registry

from gpufleet.errors import GpufleetError

BASE = "https://gpufleet.dev/schemas/"
COMMON = "gpufleet.common/1"  # the definitions the document schemas share; no document
SUFFIX = ".schema.json"
MAX_MESSAGE = 300
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


class SchemaError(GpufleetError):
    """A document does not match its schema (the message names the JSON path of the
    problem), or names no schema gpufleet ships."""


def _date_time(value: object) -> bool:
    """RFC 3339 date-time, as format ``date-time`` means it (seconds 60 for a leap second)."""
    if not isinstance(value, str):
        return True
    if not _RFC3339.fullmatch(value):
        return False
    time.strptime(value[:19].replace("t", "T"), "%Y-%m-%dT%H:%M:%S")  # raises out of range
    return True


FORMATS = FormatChecker(formats=())
FORMATS.checks("date-time", raises=ValueError)(_date_time)


@cache
def _shipped() -> dict[str, dict[str, Any]]:
    """Every shipped schema by the schema id its ``$id`` carries."""
    found: dict[str, dict[str, Any]] = {}
    for entry in files("gpufleet").joinpath("schemas").iterdir():
        if entry.name.endswith(SUFFIX):
            schema = json.loads(entry.read_text(encoding="utf-8"))
            found[str(schema["$id"]).removeprefix(BASE)] = schema
    return found


def ids() -> list[str]:
    """The schema ids of the documents gpufleet writes, sorted."""
    return sorted(i for i in _shipped() if i != COMMON)


def load(schema_id: str) -> dict[str, Any]:
    """The shipped schema ``schema_id`` (a document's, or ``gpufleet.common/1``), a copy."""
    schema = _shipped().get(schema_id)
    if schema is None:
        raise SchemaError(f"no schema {schema_id!r}: gpufleet ships {', '.join(ids())}")
    return json.loads(json.dumps(schema))  # type: ignore[no-any-return]


@cache
def _validator(schema_id: str) -> Draft202012Validator:
    """The document schema alone, as a consumer's validator reads the file: a reference it
    cannot resolve from the bundle is an error, never a fetch."""
    return Draft202012Validator(load(schema_id), registry=Registry(), format_checker=FORMATS)


def validate(document: Any) -> None:
    """Check ``document`` (parsed JSON) against the schema its ``schema`` names; raise
    SchemaError naming the schema, the JSON path (``$.hosts.node01.status``) and the
    problem."""
    schema_id = document.get("schema") if isinstance(document, dict) else None
    if not isinstance(schema_id, str):
        raise SchemaError("not a gpufleet document: no 'schema' string at $")
    if schema_id not in ids():
        raise SchemaError(f"$.schema: no schema {schema_id!r}: gpufleet ships "
                          f"{', '.join(ids())}")
    error = best_match(_validator(schema_id).iter_errors(document))
    if error is None:
        return
    message = error.message
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + "..."
    raise SchemaError(f"{schema_id}: {error.json_path}: {message}")
