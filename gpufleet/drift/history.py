"""Run history: each report kept in a directory, bounded, newest last."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from gpufleet.errors import GpufleetError
from gpufleet.report.jsonfile import read_json, write_json

MAX_RUN_BYTES = 64 * 2**20
log = logging.getLogger("gpufleet.drift")


class History:
    """Reports named ``<prefix>-<UTC time>.json``; at most ``keep`` are kept."""

    def __init__(self, directory: Path, prefix: str, keep: int = 30) -> None:
        self.directory = directory
        self.prefix = prefix
        self.keep = max(1, keep)

    def runs(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(self.directory.glob(f"{self.prefix}-*.json"))

    def documents(self) -> list[dict[str, Any]]:
        """The runs kept, oldest first (an unusable file is left out, with a warning): the
        HTML report's drift over time."""
        return [d for d in map(self._read, self.runs()) if d is not None]

    def last_items(self, checked_statuses: tuple[str, ...] = ("clean", "drifted")
                   ) -> dict[str, set[str]]:
        """Per host, its items (``role/item``) as last seen: each role's items come from the
        newest run in which that host was checked with that role (``roles_checked``; a run
        without it checked every role)."""
        found: dict[str, set[str]] = {}
        covered: dict[str, set[str] | None] = {}  # None: every role is accounted for
        for path in reversed(self.runs()):
            document = self._read(path)
            if document is None:
                continue
            roles = document.get("roles_checked")
            for host, entry in document["hosts"].items():
                done = covered.setdefault(host, set())
                if done is None or entry.get("status") not in checked_statuses:
                    continue
                items = {i["item"] for i in entry.get("items", [])}
                if roles is None:
                    found.setdefault(host, set()).update(
                        i for i in items if i.split("/", 1)[0] not in done)
                    covered[host] = None
                    continue
                fresh = set(roles) - done
                found.setdefault(host, set()).update(
                    i for i in items if i.split("/", 1)[0] in fresh)
                done.update(fresh)
        return found

    def _read(self, path: Path) -> dict[str, Any] | None:
        """A past run, or None (with a warning naming the file and why) when it is not a
        drift report gpufleet wrote: one bad file costs its own run's history, never the
        drift run reading it."""
        try:
            document = read_json(path.read_bytes(), str(path), max_bytes=MAX_RUN_BYTES)
            if not isinstance(document, dict) or not isinstance(document.get("hosts"), dict):
                raise ValueError("not a drift report (no 'hosts' mapping)")
            roles = document.get("roles_checked")
            if roles is not None and not (isinstance(roles, list)
                                          and all(isinstance(r, str) for r in roles)):
                raise ValueError("'roles_checked' is not a list of role names")
            for host, entry in document["hosts"].items():
                items = entry.get("items", []) if isinstance(entry, dict) else None
                if not isinstance(items, list) or not all(
                        isinstance(i, dict) and isinstance(i.get("item"), str) for i in items):
                    raise ValueError(f"host {host!r} has no list of items")
        except (OSError, ValueError, GpufleetError) as exc:
            log.warning("drift history %s is unusable and was left out: %s", path, exc)
            return None
        return document

    def save(self, document: dict[str, Any]) -> Path:
        """Write ``document`` as the newest run and drop the oldest beyond ``keep``."""
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
        path = self.directory / f"{self.prefix}-{stamp}.json"
        write_json(path, document)
        for old in self.runs()[: -self.keep]:
            old.unlink(missing_ok=True)
        return path
