"""``dcgmi diag -j``: DCGM 3's and DCGM 4's diagnostic documents, one row per GPU and test."""

from __future__ import annotations

import json
import re
from typing import Any

from gpufleet.facts.parsers._capture import _error, _json_document


def dcgm_diag(text: str) -> dict[str, Any]:
    """``dcgmi diag -r N -j``: ``{"tests": [{"name", "category", "gpu", "status", "info"}],
    "version": ..., "error": ...}``, one row per GPU and test (statuses upper-cased: PASS,
    FAIL, WARN, SKIP ...). Reads DCGM 3's layout (``DCGM GPU Diagnostic`` > ``test_categories``
    > ``tests`` > ``results`` by ``gpu_ids``, where one result may stand for several GPUs,
    ``"0,1,2,3"``: it becomes one row each) and DCGM 4's (``DCGM Diagnostic``, results by
    ``entity_id``, the version under ``metadata``). ``info`` joins a result's warnings, then
    its info lines."""
    document = _json_document("dcgmi diag", text, ("{",), first_only=True)
    if not isinstance(document, dict):
        raise _error("dcgmi diag", "a JSON object", text)
    root = document.get("DCGM GPU Diagnostic", document.get("DCGM Diagnostic", document))
    if not isinstance(root, dict):
        raise _error("dcgmi diag", "a 'DCGM GPU Diagnostic' object", text)
    metadata = document.get("metadata")
    version = root.get("version") or (metadata.get("version")
                                      if isinstance(metadata, dict) else None)
    rows: list[dict[str, Any]] = []
    categories = root.get("test_categories") or [{"category": None,
                                                  "tests": root.get("tests") or []}]
    for category in categories:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue
            for result in test.get("results") or []:
                if not isinstance(result, dict):
                    continue
                info = "; ".join([*_dcgm_messages(result.get("warnings")),
                                  *_dcgm_messages(result.get("info"))])
                rows.extend({"name": str(test.get("name")), "category": category.get("category"),
                             "gpu": gpu, "status": str(result.get("status", "")).upper(),
                             "info": info}
                            for gpu in _dcgm_entities(result, text))
    if not rows and not root.get("runtime_error"):
        raise _error("dcgmi diag", "test results", text)
    return {"tests": rows, "version": None if version is None else str(version),
            "error": root.get("runtime_error") or document.get("runtime_error")}


_DCGM_GPU_IDS = re.compile(r"^\d+(?:\s*,\s*\d+)*$")


def _dcgm_entities(result: dict[str, Any], text: str) -> list[str | None]:
    """The GPUs one diag result stands for: DCGM 3's ``gpu_ids`` ("0,1,2", or one number),
    DCGM 4's ``entity_id`` (prefixed with its group when that is not GPU)."""
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is not None:
        if isinstance(ids, bool) or not _DCGM_GPU_IDS.match(str(ids).strip()):
            raise _error("dcgmi diag", "gpu_ids such as '0' or '0,1,2'", text)
        return [gpu.strip() for gpu in str(ids).split(",")]
    entity = result.get("entity_id")
    if entity is None:
        return [None]
    group = result.get("entity_group")
    return [str(entity) if group in (None, "GPU") else f"{group} {entity}"]


def _dcgm_messages(value: Any) -> list[str]:
    """A result's ``warnings`` or ``info``: a string, or a list of strings or of objects
    with their text under ``warning`` (DCGM 4) or ``message``."""
    if value is None or value == "":
        return []
    items = value if isinstance(value, list) else [value]
    return [str(item.get("warning", item.get("message", json.dumps(item))))
            if isinstance(item, dict) else str(item) for item in items]
