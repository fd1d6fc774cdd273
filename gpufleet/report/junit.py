"""JUnit XML, the format CI systems and dashboards read, in one convention for every
command that writes it (docs/junit.md), valid under the Jenkins xunit schema
(junit-10.xsd):

- one ``<testsuite>`` named ``gpufleet.<command>``, with ``timestamp``, ``hostname`` (the
  controller) and the run's properties (inventory, digest, version, summary) as JSON;
- per host a case ``classname="<command>.<host>" name="reachable"``: an ``<error>`` when
  the host could not be reached, and then its only case;
- then one case per check (``suite/check``) or drift item (``role/resource``), failed or
  skipped with the message; a case's own data goes into its ``<system-out>`` as JSON.

Names, messages and details come from hosts and inventories; every one goes through
``xml_safe``, so a control character in a host's output cannot make the file invalid XML.
"""

from __future__ import annotations

import json
import re
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.report.outputs import local_put

_NOT_XML = re.compile(r"[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
REACHABLE = "reachable"


def xml_safe(text: object) -> str:
    """Text with every character that XML 1.0 cannot hold (NUL, ESC and the other control
    characters, lone surrogates, U+FFFE/U+FFFF) replaced by its visible ``\\xNN`` or
    ``\\uNNNN`` escape."""
    def visible(match: re.Match[str]) -> str:
        code = ord(match.group(0))
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    return _NOT_XML.sub(visible, str(text))


@dataclass
class Case:
    """One test case: passed unless it has a failure, an error or a skip reason; ``data``
    is written as JSON into its ``<system-out>``."""

    classname: str
    name: str
    time_s: float = 0.0
    failure: str | None = None
    error: str | None = None
    skipped: str | None = None
    details: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Suite:
    """The run: its command, start time, properties (JSON values) and cases."""

    command: str
    started: float
    properties: Mapping[str, Any]
    cases: list[Case] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"gpufleet.{self.command}"

    def host(self, host: str, *, error: str | None = None, time_s: float = 0.0) -> bool:
        """Add the host's ``reachable`` case; False when it could not be reached (then it
        gets no other case)."""
        self.cases.append(Case(f"{self.command}.{host}", REACHABLE, time_s,
                               error=None if error is None else xml_safe(error)))
        return error is None

    def case(self, host: str, name: str, **fields: Any) -> None:
        """Add one check's or item's case for ``host``."""
        self.cases.append(Case(f"{self.command}.{host}", name, **fields))

    def counts(self) -> dict[str, int]:
        """tests, failures, errors and skipped, as the XML says them."""
        return {"tests": len(self.cases),
                "failures": sum(c.failure is not None for c in self.cases),
                "errors": sum(c.error is not None for c in self.cases),
                "skipped": sum(c.skipped is not None for c in self.cases)}


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def render(suite: Suite) -> bytes:
    """The ``<testsuites>`` document with the run's one ``<testsuite>``."""
    counts = suite.counts()
    total = f"{sum(c.time_s for c in suite.cases):.3f}"
    root = ET.Element("testsuites", {"name": suite.name, "tests": str(counts["tests"]),
                                     "failures": str(counts["failures"]),
                                     "errors": str(counts["errors"]), "time": total})
    node = ET.SubElement(root, "testsuite", {
        "name": suite.name, **{k: str(v) for k, v in counts.items()}, "time": total,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(suite.started)),
        "hostname": xml_safe(socket.gethostname())})
    props = ET.SubElement(node, "properties")
    for key, value in suite.properties.items():
        ET.SubElement(props, "property", {"name": xml_safe(key), "value": xml_safe(_json(value))})
    for case in suite.cases:
        element = ET.SubElement(node, "testcase", {"classname": xml_safe(case.classname),
                                                   "name": xml_safe(case.name),
                                                   "time": f"{case.time_s:.3f}"})
        for tag, message in (("failure", case.failure), ("error", case.error),
                             ("skipped", case.skipped)):
            if message is not None:
                child = ET.SubElement(element, tag, {"message": xml_safe(message)})
                if case.details and tag != "skipped":
                    child.text = xml_safe(case.details)
        if case.data:
            ET.SubElement(element, "system-out").text = xml_safe(_json(case.data))
    ET.indent(root)
    text: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return text + b"\n"


def write(path: str | Path, suite: Suite) -> None:
    """Write the JUnit report atomically (``-``: standard output)."""
    local_put(str(path), render(suite))
